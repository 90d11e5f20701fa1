"""Batched OPTW environment (pure tensor functions) and the independent route validator.

Typical use::

    from optw.env import make_instances, reset, step, lookahead, dynamic_features, reward
    inst = make_instances(region, tourists)          # K tourists as tensors
    state = reset(inst, ids)                         # R routes, ids[R] -> tourist
    state = step(inst, state, action)                # action[R] node indices
"""

from optw.env.instances import (
    N_DYNAMIC,
    N_STATIC,
    NEVER,
    Instances,
    make_instances,
    stack_instances,
)
from optw.env.state import (
    GRAPHS,
    Features,
    State,
    adjacency,
    dynamic_features,
    feasible,
    graph_mask,
    lookahead,
    node_features,
    reset,
    reward,
    step,
    still_admissible,
    visit,
    visit_end,
)
from optw.env.validate import InvalidRoute, RouteCheck, check_route

__all__ = [
    "GRAPHS", "NEVER", "N_DYNAMIC", "N_STATIC", "Features", "Instances", "InvalidRoute",
    "RouteCheck", "State", "adjacency", "check_route", "dynamic_features", "feasible",
    "graph_mask", "lookahead", "make_instances", "node_features", "reset", "reward",
    "stack_instances", "step", "still_admissible", "visit", "visit_end",
]
