"""Decoding bounds and defaults, in one place, and the one check of a beam width (no torch in
this module)."""

from __future__ import annotations

from typing import Any

from optw.checks import shown
from optw.errors import UserError

#: Smallest and largest accepted beam width.
MIN_BEAMS = 1
MAX_BEAMS = 128
#: The paper's beam width, the default of ``optw solve`` and of evaluation.
PAPER_BEAMS = 128
#: The default of the trip planner and of the MLflow pyfunc (fast enough for a service).
SERVE_BEAMS = 16
#: Active search's defaults (the paper's): epochs, sampled routes per epoch, Adam's lr.
ACTIVE_SEARCH_EPOCHS, ACTIVE_SEARCH_BATCH, ACTIVE_SEARCH_LR = 128, 32, 1e-5
#: Sampled routes per tourist of ``sampling`` by default.
SAMPLES = 128
#: Largest number of active-search epochs (the paper: 128; 100,000 take hours on a CPU).
MAX_ACTIVE_SEARCH_EPOCHS = 100_000
#: Largest number of sampled routes per tourist (``optw solve --samples``).
MAX_SAMPLES = 100_000


def check_beams(value: Any, name: str = "beams") -> int:
    """``value`` as a beam width: an int (not a bool) in :data:`MIN_BEAMS`..:data:`MAX_BEAMS`;
    ``UserError`` starting with ``name`` otherwise (the one check of a beam width)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise UserError(f"{name}: expected a beam width, an integer in {MIN_BEAMS}.."
                         f"{MAX_BEAMS}, got {type(value).__name__} {shown(value, 40)}")
    if not MIN_BEAMS <= value <= MAX_BEAMS:
        raise UserError(f"{name}: {shown(value, 40)} is out of range: expected a beam width in "
                         f"{MIN_BEAMS}..{MAX_BEAMS}")
    return int(value)
