"""Route validator, independent of the environment's masks: it re-simulates a route in exact
integer time units and recomputes its score. Every route the system outputs is checked with it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from optw.catalog.region import TIME_UNITS_PER_MINUTE, Region, Tourists, to_time_units


@dataclass
class RouteCheck:
    """Outcome of :func:`check_route`: feasibility, problems, score and the visit schedule."""

    ok: bool
    score: float
    problems: list[str] = field(default_factory=list)
    arrival: list[float] = field(default_factory=list)  # per route position
    start: list[float] = field(default_factory=list)  # start of visit (after waiting)
    leave: list[float] = field(default_factory=list)

    def raise_if_invalid(self, what: str = "the route") -> None:
        """Raise :class:`InvalidRoute` ``"<what> is invalid: <problems>"`` unless feasible."""
        if not self.ok:
            raise InvalidRoute(f"{what} is invalid: " + "; ".join(self.problems))


class InvalidRoute(ValueError):
    """A route that breaks the OPTW constraints."""


def check_route(region: Region, route, tourists: Tourists | None = None, index: int = 0,
                claimed_score: float | None = None) -> RouteCheck:
    """Validate ``route`` (node indices, ``[0, ..., n-1]``) for tourist ``index`` of ``tourists``
    (default: the region's benchmark tourist). ``claimed_score``, if given, must match."""
    n = region.n_nodes
    if tourists is None:
        start_xy, f32 = np.array(region.start_xy), False
        t_start, t_end, scores = region.t_start, region.t_end, region.score
    else:
        start_xy, f32 = tourists.start_xy[index], tourists.start_rows_f32
        t_start, t_end = float(tourists.t_start[index]), float(tourists.t_end[index])
        scores = tourists.scores[index]
    route = [int(v) for v in route]
    problems: list[str] = []
    if len(route) < 2:
        return RouteCheck(False, 0.0, [f"route {route} is shorter than [start, end]"])
    if route[0] != 0:
        problems.append(f"route starts at node {route[0]}, not at the start node 0")
    if route[-1] != n - 1:
        problems.append(f"route ends at node {route[-1]}, not at the end node {n - 1}")
    inner = route[1:-1]
    bad = [v for v in inner if not 1 <= v <= n - 2]
    if bad:
        problems.append(f"nodes {bad} are not points of interest (valid: 1..{n - 2})")
    if bad or not (0 <= route[0] < n and 0 <= route[-1] < n):  # nothing to schedule
        return RouteCheck(False, 0.0, problems)
    dups = sorted(v for v, count in Counter(inner).items() if count > 1)
    if dups:
        problems.append(f"nodes {dups} are visited more than once")

    dist = to_time_units(region.distances(start_xy, f32)[0])
    opening, closing = to_time_units(region.opening), to_time_units(region.closing)
    duration = to_time_units(region.duration)
    ts, te = int(to_time_units(t_start)), int(to_time_units(t_end))
    opening[0] = opening[-1] = ts
    closing[0] = closing[-1] = te
    arrival, start, leave = [ts], [ts], [ts]
    t, prev = ts, route[0]
    for pos, v in enumerate(route[1:], 1):
        a = t + dist[prev, v]
        s = max(a, opening[v])
        if v != n - 1 and s > closing[v]:
            problems.append(f"visit {pos} (node {v}) starts at {s / 100:g}, after its closing "
                            f"{closing[v] / 100:g}")
        t = s + duration[v] if v != n - 1 else a
        arrival.append(a), start.append(s if v != n - 1 else a), leave.append(t)
        prev = v
    if arrival[-1] > te:
        problems.append(f"end reached at {arrival[-1] / 100:g}, after T_end {te / 100:g}")
    score = float(np.sum(np.asarray(scores, dtype=np.float64)[inner]))
    if claimed_score is not None and not np.isclose(claimed_score, score, rtol=1e-6, atol=1e-6):
        problems.append(f"claimed score {claimed_score:g} differs from recomputed {score:g}")
    to_min = lambda xs: [float(x) / TIME_UNITS_PER_MINUTE for x in xs]  # noqa: E731
    return RouteCheck(not problems, score, problems, to_min(arrival), to_min(start), to_min(leave))
