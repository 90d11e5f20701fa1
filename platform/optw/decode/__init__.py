"""Inference and the training rollout.

    from optw.decode import solve, rollout
    solutions = solve(model, region, tourists, method="beam", beams=PAPER_BEAMS)
    out = rollout(model, instances, ids)      # training: reward, log_prob, entropy per route

Beam-width bounds and defaults live in :mod:`optw.decode.limits`.
"""

from optw.decode.active_search import ActiveSearchResult, active_search
from optw.decode.beam import BeamResult, beam_search
from optw.decode.core import Decoder, Frontier, Pass, Rollout, rollout
from optw.decode.limits import MAX_BEAMS, MIN_BEAMS, PAPER_BEAMS, SERVE_BEAMS, check_beams
from optw.decode.reinforce import reinforce_loss
from optw.decode.solve import METHODS, Solution, region_mismatch, solve

__all__ = [
    "MAX_BEAMS", "METHODS", "MIN_BEAMS", "PAPER_BEAMS", "SERVE_BEAMS", "ActiveSearchResult",
    "BeamResult", "Decoder", "Frontier", "Pass", "Rollout", "Solution", "active_search",
    "beam_search", "check_beams", "region_mismatch", "reinforce_loss", "rollout", "solve",
]
