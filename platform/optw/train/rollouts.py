"""Which rollout a training run samples with: ``[train] rollout`` (the choices: docs/gpu.md),
resolved once per epoch shape by :func:`choose_rollout`. No torch here: reading a config stays
light.
"""

from __future__ import annotations

from optw.errors import ConfigError

ROLLOUTS = ("auto", "compact", "static", "graph")
#: Rollouts a pack (several per-region models in one batched step) trains with.
PACK_ROLLOUTS = ("auto", "compact")
#: Most node rows (routes × nodes) the static rollout takes in training: it keeps every row's
#: activations of every step for the backward (~15 kB per row and step), so larger batches
#: (e.g. K = 64 × B = 32 on t101, 209k rows) go compacted.
STATIC_MAX_ROWS = 1 << 16
#: Most node rows the ``graph`` rollout takes: a fixed number of steps pays while launching
#: kernels is the bottleneck (small batches: t101 at B = 32 trained 4.8x faster than
#: ``static`` on an H200) but not on compute-bound ones (B = 512: about 0.66x), which go
#: ``static``.
GRAPH_MAX_ROWS = 1 << 14


def choose_rollout(choice: str, device_type: str, rows: int) -> str:
    """The rollout for an epoch of ``rows`` node rows (routes × nodes) on a device of type
    ``device_type`` (``"cpu"``, ``"cuda"``), for the setting ``choice`` (:data:`ROLLOUTS`)."""
    cuda = device_type == "cuda"
    if choice == "graph" and not cuda:
        raise ConfigError(f"rollout = graph replays CUDA graphs: it needs a CUDA device, not "
                          f"{device_type}", "rollout")
    if choice == "graph" and rows > GRAPH_MAX_ROWS:
        choice = "auto"
    if choice == "auto":
        return "static" if cuda and rows <= STATIC_MAX_ROWS else "compact"
    return choice
