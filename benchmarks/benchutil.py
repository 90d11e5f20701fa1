"""What the benchmarks share: the authors' published weight files and a device barrier for
timing. Each benchmark runs as a script from this folder, which is then on ``sys.path``; the
tests import the benchmarks through pytest's ``pythonpath`` (pyproject.toml)."""

from __future__ import annotations

from pathlib import Path

import torch

#: Where the authors' published weights are: ``../shared/reference/pretrained``.
PRETRAINED = Path(__file__).resolve().parents[2] / "shared" / "reference" / "pretrained"
#: The authors' published weights (in :data:`PRETRAINED`), by region.
WEIGHTS = {"pr01": "pr01_uni_samp_500000.pt", "t101": "t101_corr_samp_500000.pt"}
#: What beam 128 gives with them on each region's benchmark tourist (published outputs).
PUBLISHED_SCORES = {"pr01": 308, "t101": 399}


def sync(device: torch.device | str) -> None:
    """Wait for the device's queued work (CUDA) so that a wall-clock time covers it."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
