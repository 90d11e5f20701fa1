"""Batched OPTW environment (pure tensor functions) and the independent route validator
(the API: docs/model.md)."""

from optw.env.instances import NEVER, Instances, make_instances, stack_instances
from optw.env.state import State, dynamic_features, lookahead, reset, reward, step
from optw.env.validate import InvalidRoute, RouteCheck, check_route

__all__ = [
    "NEVER", "Instances", "InvalidRoute", "RouteCheck", "State", "check_route",
    "dynamic_features", "lookahead", "make_instances", "reset", "reward", "stack_instances", "step",
]
