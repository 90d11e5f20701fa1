"""Inference and the training rollout.

    from optw.decode import solve, rollout
    solutions = solve(model, region, tourists, method="beam", beams=128)
    out = rollout(model, instances, ids)      # training: reward, log_prob, entropy per route
"""

from optw.decode.active_search import ActiveSearchResult, active_search, reinforce_loss
from optw.decode.beam import MAX_BEAMS, BeamResult, beam_search, check_width
from optw.decode.core import Decoder, Frontier, Pass, Rollout, rollout
from optw.decode.solve import METHODS, Solution, solve

__all__ = [
    "MAX_BEAMS", "METHODS", "ActiveSearchResult", "BeamResult", "Decoder", "Frontier", "Pass",
    "Rollout", "Solution", "active_search", "beam_search", "check_width", "reinforce_loss",
    "rollout", "solve",
]
