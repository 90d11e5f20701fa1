"""Beam-width bounds and defaults, in one place (plain constants: no torch in this module)."""

from __future__ import annotations

#: Smallest and largest accepted beam width.
MIN_BEAMS = 1
MAX_BEAMS = 128
#: The paper's beam width, the default of ``optw solve`` and of evaluation.
PAPER_BEAMS = 128
#: The default of the trip planner and of the MLflow pyfunc (fast enough for a service).
SERVE_BEAMS = 16
