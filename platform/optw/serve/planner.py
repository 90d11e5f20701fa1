"""The trip planner's core, shared by the service and ``optw plan``: validate a request, solve
it with the region's model, shape the validated itinerary. Torch and decode load when used."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from optw.catalog import Catalog, Region
from optw.serve.errors import PlanError
from optw.serve.models import LoadedModel, ModelProvider
from optw.serve.preferences import PREFERENCES
from optw.serve.request import (
    BEAM_METHODS,
    METHODS,
    PlanRequest,
    clock_note,
    clock_origin,
    decode_body,
    format_time,
    parse_request,
    reachable,
)

log = logging.getLogger(__name__)


def node_name(region: Region, node: int, default_start: bool = True) -> str:
    """A node's name: the region's own (start/end: when starting there), else a generic one."""
    if node in (0, region.n_nodes - 1):
        kind = "start" if node == 0 else "end"
        return region.start_name if region.start_name and default_start else kind
    if region.names is not None and region.names[node]:
        return region.names[node]
    return f"POI {node}"


def node_latlon(region: Region, node: int) -> dict[str, float]:
    """``{"lat", "lon"}`` of a node of a lat/lon region, else ``{}``."""
    return ({"lat": float(region.lat[node]), "lon": float(region.lon[node])}
            if region.coords == "latlon" else {})


#: Default extra :func:`optw.decode.solve` arguments per request method (a short active search).
METHOD_OPTIONS: dict[str, dict[str, Any]] = {"active-search": {"epochs": 8, "batch_size": 8}}


class Planner:
    """Validates requests against the catalog and solves them with ``models``. ``solve_options``
    (method -> extra :func:`optw.decode.solve` arguments) override :data:`METHOD_OPTIONS`. A
    model trained on other regions is told to ``warn`` (default: log) once per region."""

    def __init__(self, catalog: Catalog, models: ModelProvider, *,
                 solve_options: Mapping[str, Mapping[str, Any]] | None = None,
                 warn: Callable[[str], None] | None = None):
        self.catalog = catalog
        self.models = models
        self.solve_options = {m: {**METHOD_OPTIONS.get(m, {}), **(solve_options or {}).get(m, {})}
                              for m in METHODS}
        self._checked: set[tuple[str, int | None, str]] = set()  # (model, version, region)
        self._checked_lock = threading.Lock()
        self._warn = warn or (lambda message: log.warning("%s", message))

    def _check_region(self, loaded: LoadedModel, region: Region) -> None:
        key = (loaded.source, loaded.version, region.id)
        with self._checked_lock:
            if key in self._checked:
                return
            self._checked.add(key)
        from optw.decode import region_mismatch

        if message := region_mismatch(loaded.model, region):
            version = f" version {loaded.version}" if loaded.version is not None else ""
            self._warn(f"{message} (model {loaded.source}{version})")

    def regions(self) -> list[dict[str, Any]]:
        """One summary per region (id, group, points, benchmark start and times, the day)."""
        return [{"region": str(r["region"]), "group": str(r["group"]), "points": int(r["points"]),
                 "start": {"x": float(r["start_x"]), "y": float(r["start_y"])},
                 "t_start": float(r["t_start"]), "t_end": float(r["t_end"]),
                 "day": [0.0, float(r["t_max"])],
                 "clock_origin": clock_origin(r["group"]), "coords": str(r["coords"])}
                for _, r in self.catalog.regions_table.iterrows()]

    def region(self, region_id: str) -> dict[str, Any]:
        """One region with its points (coordinates, visit duration, time window, score)."""
        if region_id not in self.catalog:
            raise PlanError(404, "region", f"region: unknown region {region_id[:64]!r}")
        r = self.catalog.region(region_id)
        points = [{"node": i, "name": node_name(r, i), "x": float(r.x[i]), "y": float(r.y[i]),
                   "duration": float(r.duration[i]), "opening": float(r.opening[i]),
                   "closing": float(r.closing[i]), "score": float(r.score[i]),
                   "opening_clock": format_time(float(r.opening[i])),
                   "closing_clock": format_time(float(r.closing[i])), **node_latlon(r, i)}
                  for i in range(1, r.n_nodes - 1)]
        start = {"x": r.start_xy[0], "y": r.start_xy[1], "name": node_name(r, 0),
                 **node_latlon(r, 0)}
        return {"region": r.id, "group": r.group, "coords": r.coords,
                "named": r.names is not None, "points": points,
                "start": start, "t_start": r.t_start, "t_end": r.t_end,
                "t_start_clock": format_time(r.t_start), "t_end_clock": format_time(r.t_end),
                "day": [0.0, r.t_max], "day_clock": [format_time(0.0), format_time(r.t_max)],
                "clock_origin": clock_origin(r.group), "clock_note": clock_note(r),
                "preferences": {k: v[0] for k, v in PREFERENCES.items()}}

    def parse(self, body: bytes | Mapping[str, Any]) -> PlanRequest:
        data = decode_body(body) if isinstance(body, (bytes, bytearray)) else body
        return parse_request(data, self.catalog)

    def plan(self, body: bytes | Mapping[str, Any]) -> dict[str, Any]:
        return self.solve(self.parse(body))

    def solve(self, req: PlanRequest, loaded: LoadedModel | None = None) -> dict[str, Any]:
        """A validated request's itinerary as a JSON dict (``loaded``: the model, if fetched)."""
        from optw.env import InvalidRoute, check_route

        if loaded is None:
            loaded = self.models.get(req.region.id)
        self._check_region(loaded, req.region)
        t0 = time.perf_counter()
        # nobody needs a model for the empty itinerary
        route = (self._route(loaded.model, req) if reachable(req).any()
                 else [0, req.region.n_nodes - 1])
        tourists = req.tourists()
        check = check_route(req.region, route, tourists, 0)
        try:
            check.raise_if_invalid("the solver's route")
        except InvalidRoute as exc:
            log.error("%s (model %s, request %s)", exc, loaded.source, req)
            raise PlanError(500, None, str(exc)) from None
        solve_ms = (time.perf_counter() - t0) * 1e3
        stops = self._stops(req, route, check, tourists.scores[0])
        start = {"x": req.start_xy[0], "y": req.start_xy[1], **_start_latlon(req)}
        return {"region": req.region.id, "coords": req.region.coords, "method": req.method,
                "clock_origin": clock_origin(req.region.group),
                "beams": req.beams if req.method in BEAM_METHODS else None,
                "preference": req.preference, "model_version": loaded.version,
                "start": start, "t_start": req.t_start, "t_end": req.t_end, "clock": req.clock,
                "t_start_clock": format_time(req.t_start), "t_end_clock": format_time(req.t_end),
                "score": check.score, "visits": len(route) - 2, "route": stops,
                "legs": _legs(stops), "solve_ms": round(solve_ms, 3)}

    @staticmethod
    def _stops(req: PlanRequest, route: list[int], check: Any, scores: Any) -> list[dict]:
        """The route's stops with the validator's schedule, names, clock times, lat/lon."""
        region, last = req.region, len(route) - 1
        default_start = req.start_xy == region.start_xy
        stops = []
        for pos, node in enumerate(route):
            kind = "start" if pos == 0 else "end" if pos == last else "visit"
            if kind == "visit":
                x, y = float(region.x[node]), float(region.y[node])
                name, latlon = node_name(region, node), node_latlon(region, node)
            else:
                (x, y), latlon = req.start_xy, _start_latlon(req)
                name = node_name(region, node, default_start)
            times = {k: getattr(check, k)[pos] for k in ("arrival", "start", "leave")}
            stops.append({"stop": pos, "node": int(node), "kind": kind, "name": name,
                          "x": x, "y": y, **latlon, **times,
                          **{f"{k}_clock": format_time(v) for k, v in times.items()},
                          "wait": round(times["start"] - times["arrival"], 2),
                          "score": float(scores[node])})
        return stops

    def _route(self, model: Any, req: PlanRequest) -> list[int]:
        from optw.decode import solve

        # the network reads scores on the region's benchmark scale (same best route)
        top = float(req.scores.max())
        scale = req.region.s_max_benchmark / top if top > 0 else 1.0
        tourists = req.tourists(req.scores * scale)
        kwargs: dict[str, Any] = {"method": METHODS[req.method], **self.solve_options[req.method]}
        if req.method in BEAM_METHODS:
            kwargs["beams"] = req.beams
        return [int(v) for v in solve(model, req.region, tourists, **kwargs)[0].route]


def _start_latlon(req: PlanRequest) -> dict[str, float]:
    latlon = req.start_latlon
    return {} if latlon is None else {"lat": latlon[0], "lon": latlon[1]}


def _legs(stops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The travel between consecutive stops (the validator's schedule)."""
    return [{"leg": a["stop"], "from": a["stop"], "to": b["stop"],
             "from_node": a["node"], "to_node": b["node"],
             "from_name": a["name"], "to_name": b["name"],
             "depart": a["leave"], "arrive": b["arrival"],
             "travel": round(b["arrival"] - a["leave"], 2),
             "depart_clock": a["leave_clock"], "arrive_clock": b["arrival_clock"]}
            for a, b in itertools.pairwise(stops)]
