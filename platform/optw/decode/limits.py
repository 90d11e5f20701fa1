"""Decoding bounds and defaults, in one place, and the one check of a beam width (no torch in
this module)."""

from __future__ import annotations

from typing import Any

#: Smallest and largest accepted beam width.
MIN_BEAMS = 1
MAX_BEAMS = 128
#: The paper's beam width, the default of ``optw solve`` and of evaluation.
PAPER_BEAMS = 128
#: The default of the trip planner and of the MLflow pyfunc (fast enough for a service).
SERVE_BEAMS = 16
#: Largest number of active-search epochs (``optw solve --active-search``): the paper uses 128;
#: 100,000 epochs already take hours per tourist on a CPU.
MAX_ACTIVE_SEARCH_EPOCHS = 100_000
#: Largest number of sampled routes per tourist (``optw solve --samples``).
MAX_SAMPLES = 100_000


def _shown(value: Any, limit: int = 40) -> str:
    try:
        text = repr(value)
    except ValueError:  # an int of over 4300 digits
        return f"an integer of over {limit} digits"
    return text if len(text) <= limit else f"{text[:limit]}..."


def check_beams(value: Any, name: str = "beams") -> int:
    """``value`` as a beam width: an int (not a bool) in :data:`MIN_BEAMS`..:data:`MAX_BEAMS`;
    ``ValueError`` starting with ``name`` otherwise. The one check of a beam width: the
    planner, ``optw solve``, the pyfunc and :func:`optw.decode.solve` call it."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: expected a beam width, an integer in {MIN_BEAMS}.."
                         f"{MAX_BEAMS}, got {type(value).__name__} {_shown(value)}")
    if not MIN_BEAMS <= value <= MAX_BEAMS:
        raise ValueError(f"{name}: {_shown(value)} is out of range: expected a beam width in "
                         f"{MIN_BEAMS}..{MAX_BEAMS}")
    return int(value)
