"""Inference and the training rollout (docs/model.md)."""

from optw.decode.active_search import active_search
from optw.decode.beam import beam_search
from optw.decode.core import Rollout, rollout
from optw.decode.limits import MAX_BEAMS, PAPER_BEAMS, check_beams
from optw.decode.solve import METHODS, region_mismatch, solve

__all__ = [
    "MAX_BEAMS", "METHODS", "PAPER_BEAMS", "Rollout", "active_search", "beam_search",
    "check_beams", "region_mismatch", "rollout", "solve",
]
