"""Batched OPTW environment (pure tensor functions) and the independent route validator."""

from optw.env.validate import InvalidRoute, RouteCheck, check_route

__all__ = ["InvalidRoute", "RouteCheck", "check_route"]
