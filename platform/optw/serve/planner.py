"""The trip planner's core, shared by the Ray Serve service and ``optw plan``: it validates a
request (:mod:`optw.serve.request`), solves it with the region's model (:mod:`optw.serve.models`)
and shapes the answer (an itinerary checked by the route validator).

Nothing here imports Ray; torch, MLflow and :mod:`optw.decode` are imported when first used.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from optw.catalog import Catalog
from optw.serve.errors import PlanError
from optw.serve.models import LoadedModel, ModelProvider
from optw.serve.preferences import PREFERENCES
from optw.serve.request import (
    BEAM_METHODS,
    METHODS,
    PlanRequest,
    decode_body,
    parse_request,
    reachable,
)

log = logging.getLogger(__name__)

#: Default extra :func:`optw.decode.solve` arguments per request method. Active search is kept
#: short for a service (8 epochs of 8 sampled routes, then beam search: ~1-2 s on 100 points).
METHOD_OPTIONS: dict[str, dict[str, Any]] = {"active-search": {"epochs": 8, "batch_size": 8}}


class Planner:
    """Plans itineraries: validates requests against the catalog and solves them with the
    region's model from ``models``. ``solve_options`` (request method -> extra
    :func:`optw.decode.solve` arguments) override :data:`METHOD_OPTIONS`."""

    def __init__(self, catalog: Catalog, models: ModelProvider, *,
                 solve_options: Mapping[str, Mapping[str, Any]] | None = None):
        self.catalog = catalog
        self.models = models
        unknown = sorted(set(solve_options or {}) - set(METHODS))
        if unknown:
            raise ValueError(f"solve_options for unknown method(s) {unknown}")
        self.solve_options = {m: {**METHOD_OPTIONS.get(m, {}), **(solve_options or {}).get(m, {})}
                              for m in METHODS}

    # -- regions
    def regions(self) -> list[dict[str, Any]]:
        """One summary per region (id, group, points, benchmark start and times, the day)."""
        df = self.catalog.regions_table
        return [{"region": str(r["region"]), "group": str(r["group"]),
                 "points": int(r["points"]), "start": {"x": float(r["start_x"]),
                                                       "y": float(r["start_y"])},
                 "t_start": float(r["t_start"]), "t_end": float(r["t_end"]),
                 "day": [0.0, float(r["t_max"])]} for _, r in df.iterrows()]

    def region(self, region_id: str) -> dict[str, Any]:
        """One region with its points (coordinates, visit duration, time window, score)."""
        if region_id not in self.catalog:
            raise PlanError(404, "region", f"region: unknown region {region_id[:64]!r}")
        r = self.catalog.region(region_id)
        points = [{"node": i, "x": float(r.x[i]), "y": float(r.y[i]),
                   "duration": float(r.duration[i]), "opening": float(r.opening[i]),
                   "closing": float(r.closing[i]), "score": float(r.score[i])}
                  for i in range(1, r.n_nodes - 1)]
        return {"region": r.id, "group": r.group, "points": points,
                "start": {"x": r.start_xy[0], "y": r.start_xy[1]}, "t_start": r.t_start,
                "t_end": r.t_end, "day": [0.0, r.t_max],
                "preferences": {k: v[0] for k, v in PREFERENCES.items()}}

    # -- planning
    def parse(self, body: bytes | Mapping[str, Any]) -> PlanRequest:
        data = decode_body(body) if isinstance(body, (bytes, bytearray)) else body
        return parse_request(data, self.catalog)

    def plan(self, body: bytes | Mapping[str, Any]) -> dict[str, Any]:
        return self.solve(self.parse(body))

    def solve(self, req: PlanRequest, loaded: LoadedModel | None = None) -> dict[str, Any]:
        """Solve a validated request -> the itinerary as a JSON-ready dict (with ``loaded``,
        the region's model already fetched from :attr:`models`)."""
        from optw.env import check_route

        if loaded is None:
            loaded = self.models.get(req.region.id)
        t0 = time.perf_counter()
        n = req.region.n_nodes
        # nobody needs a model for the empty itinerary
        route = self._route(loaded.model, req) if reachable(req).any() else [0, n - 1]
        tourists = req.tourists()
        check = check_route(req.region, route, tourists, 0)
        if not check.ok:
            log.error("invalid route from %s for %s: %s", loaded.source, req, check.problems)
            raise PlanError(500, None, "the solver produced an invalid route: "
                            + "; ".join(check.problems))
        solve_ms = (time.perf_counter() - t0) * 1e3
        full = tourists.scores[0]
        stops = []
        for pos, node in enumerate(route):
            kind = "start" if pos == 0 else "end" if pos == len(route) - 1 else "visit"
            x, y = (req.start_xy if kind != "visit"
                    else (float(req.region.x[node]), float(req.region.y[node])))
            stops.append({"stop": pos, "node": int(node), "kind": kind, "x": x, "y": y,
                          "arrival": check.arrival[pos], "start": check.start[pos],
                          "leave": check.leave[pos], "score": float(full[node])})
        return {
            "region": req.region.id, "method": req.method,
            "beams": req.beams if req.method in BEAM_METHODS else None,
            "preference": req.preference, "model_version": loaded.version,
            "start": {"x": req.start_xy[0], "y": req.start_xy[1]},
            "t_start": req.t_start, "t_end": req.t_end, "clock": req.clock,
            "score": check.score, "visits": len(route) - 2, "route": stops,
            "solve_ms": round(solve_ms, 3),
        }

    def _route(self, model: Any, req: PlanRequest) -> list[int]:
        from optw.decode import solve

        # The network reads scores relative to the region's benchmark scale; rescaling keeps
        # any caller's units in that range (the best route is the same for scaled scores).
        top = float(req.scores.max())
        scale = req.region.s_max_benchmark / top if top > 0 else 1.0
        tourists = req.tourists(req.scores * scale)
        kwargs: dict[str, Any] = {"method": METHODS[req.method],
                                  **self.solve_options[req.method]}
        if req.method in BEAM_METHODS:
            kwargs["beams"] = req.beams
        solutions = solve(model, req.region, tourists, **kwargs)
        return [int(v) for v in solutions[0].route]
