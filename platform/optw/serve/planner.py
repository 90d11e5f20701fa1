"""The trip planner's core, shared by the Ray Serve service and ``optw plan``: request parsing
and validation, preference profiles, the per-region model cache and the solve itself.

Nothing here imports Ray; torch, MLflow and :mod:`optw.decode` are imported when first used.

A request (a JSON object, see ``docs/planner.md``)::

    {"region": "t101", "start": {"x": 43, "y": 78}, "t_start": "09:00", "t_end": "18:00",
     "preference": "balanced", "method": "beam", "beams": 16}

Errors are :class:`PlanError` (HTTP status, the offending field, a message naming it).
"""

from __future__ import annotations

import logging
import math
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from optw.catalog import TIME_UNITS_PER_MINUTE, Catalog, Region, Tourists

log = logging.getLogger(__name__)

#: Largest accepted request body (bytes); larger bodies get HTTP 413.
MAX_BODY_BYTES = 256 * 1024
#: Beam widths accepted by ``method: "beam"``.
MIN_BEAMS, MAX_BEAMS, DEFAULT_BEAMS = 1, 128, 16
#: Request method name -> :func:`optw.decode.solve` method name.
METHODS = {"greedy": "greedy", "beam": "beam", "active-search": "active_search"}
#: Methods that use the request's ``beams``.
BEAM_METHODS = ("beam", "active-search")
#: Default extra :func:`optw.decode.solve` arguments per request method. Active search is kept
#: short for a service (8 epochs of 8 sampled routes, then beam search: ~1-2 s on 100 points).
METHOD_OPTIONS: dict[str, dict[str, Any]] = {"active-search": {"epochs": 8, "batch_size": 8}}
DEFAULT_METHOD = "beam"
DEFAULT_PREFERENCE = "balanced"
#: Start coordinates must lie within this many units of 0 (keeps time arithmetic exact).
COORD_LIMIT = 10_000.0
#: Largest accepted score of a point.
SCORE_LIMIT = 1e9
#: Seconds between two checks of a region's ``champion`` alias.
DEFAULT_CHECK_INTERVAL = 2.0
FIELDS = ("region", "start", "t_start", "t_end", "scores", "preference", "method", "beams")
_HHMM = re.compile(r"^\s*(\d{1,2}):([0-5]\d)\s*$")


class PlanError(Exception):
    """A request the planner cannot serve: HTTP ``status``, offending ``field``, message."""

    def __init__(self, status: int, field: str | None, message: str):
        super().__init__(message)
        self.status = status
        self.field = field
        self.message = message

    def to_dict(self) -> dict[str, Any]:
        return {"error": self.message, "field": self.field, "status": self.status}


# ----------------------------------------------------------------------------- preferences


def _balanced(region: Region) -> np.ndarray:
    return region.score[1:-1].astype(np.float64)


def _by_duration(region: Region, longer: bool) -> np.ndarray:
    d = region.duration[1:-1].astype(np.float64)
    hi = region.s_max_benchmark
    if d.max() <= d.min():
        return np.ones_like(d)
    rel = (d - d.min()) / (d.max() - d.min())
    return np.clip(hi * (rel if longer else 1.0 - rel), 1.0, hi)


#: Named preference profiles: region -> one score per point of interest (all >= 0).
PREFERENCES: dict[str, tuple[str, Callable[[Region], np.ndarray]]] = {
    "balanced": ("the benchmark's own scores of the points", _balanced),
    "long-visits": ("scores grow with visit duration: 1 for the shortest visit, the "
                    "benchmark's top score for the longest",
                    lambda r: _by_duration(r, longer=True)),
    "short-visits": ("scores shrink with visit duration: the benchmark's top score for the "
                     "shortest visit, 1 for the longest", lambda r: _by_duration(r, longer=False)),
    "uniform": ("every point scores 1: as many visits as possible",
                lambda r: np.ones(r.n_points, dtype=np.float64)),
}


def preference_scores(region: Region, name: str) -> np.ndarray:
    """Scores per point of interest (length ``n_points``) of a named preference profile."""
    if name not in PREFERENCES:
        raise PlanError(422, "preference", f"preference: unknown profile {name!r}; known: "
                        f"{', '.join(PREFERENCES)}")
    return PREFERENCES[name][1](region)


# ----------------------------------------------------------------------------- times


def parse_time(value: Any, name: str) -> tuple[float, bool]:
    """Minutes from a number or an ``"HH:MM"`` string -> (minutes, given as a clock time)."""
    if isinstance(value, str):
        m = _HHMM.match(value)
        if not m:
            raise PlanError(422, name, f"{name}: {value!r} is not a time; give minutes (a number)"
                            " or \"HH:MM\"")
        return float(int(m.group(1)) * 60 + int(m.group(2))), True
    return _number(value, name), False


def format_time(minutes: float) -> str:
    """``"HH:MM"`` of a time in minutes (rounded to the minute; hours may exceed 23)."""
    total = int(round(minutes))
    sign = "-" if total < 0 else ""
    return f"{sign}{abs(total) // 60:02d}:{abs(total) % 60:02d}"


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PlanError(422, name, f"{name}: expected a number, got {_describe(value)}")
    try:
        out = float(value)
    except OverflowError:
        out = math.inf
    if not math.isfinite(out):
        raise PlanError(422, name, f"{name}: expected a finite number, got {value!r}")
    return out


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:40] + '...' if len(text) > 40 else text}"


# ----------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class PlanRequest:
    """A validated request (scores per point of interest, in the caller's units)."""

    region: Region
    start_xy: tuple[float, float]
    t_start: float
    t_end: float
    scores: np.ndarray
    preference: str | None
    method: str
    beams: int
    clock: bool  # times were given as "HH:MM"

    def tourists(self, scores: np.ndarray | None = None) -> Tourists:
        """The request as a one-tourist batch (``scores`` per point; default the request's)."""
        pts = self.scores if scores is None else scores
        n = self.region.n_nodes
        full = np.zeros((1, n), dtype=np.float64)
        full[0, 1:-1] = pts
        return Tourists(region_id=self.region.id, tourist_id=np.zeros(1, dtype=np.int64),
                        kind="generated", start_xy=np.array([self.start_xy], dtype=np.float64),
                        t_start=np.array([self.t_start]), t_end=np.array([self.t_end]),
                        scores=full)


def decode_body(body: bytes) -> dict[str, Any]:
    """Raw request body -> JSON object (413 when too large, 400 when not a JSON object)."""
    if len(body) > MAX_BODY_BYTES:
        raise PlanError(413, "body", f"body: {len(body)} bytes are over the limit of "
                        f"{MAX_BODY_BYTES} bytes")
    if not body.strip():
        raise PlanError(400, "body", "body: empty request body; send a JSON object")
    try:
        data = _loads(body)
    except (ValueError, RecursionError) as exc:
        raise PlanError(400, "body", f"body: malformed JSON ({exc})") from None
    if not isinstance(data, dict):
        raise PlanError(400, "body", f"body: must be a JSON object, not {type(data).__name__}")
    return data


def _loads(body: bytes) -> Any:
    import json

    return json.loads(body.decode("utf-8"))


def _start(value: Any, region: Region) -> tuple[float, float]:
    if value is None:
        return region.start_xy
    if isinstance(value, Mapping):
        extra = sorted(set(value) - {"x", "y"})
        if extra or "x" not in value or "y" not in value:
            raise PlanError(422, "start", "start: expected {\"x\": number, \"y\": number}"
                            + (f"; unknown keys {extra}" if extra else ""))
        x, y = value["x"], value["y"]
    elif isinstance(value, (list, tuple)) and len(value) == 2:
        x, y = value
    else:
        raise PlanError(422, "start", f"start: expected {{\"x\": number, \"y\": number}}, got "
                        f"{_describe(value)}")
    xy = (_number(x, "start.x"), _number(y, "start.y"))
    for axis, v in zip(("x", "y"), xy, strict=True):
        if abs(v) > COORD_LIMIT:
            raise PlanError(422, f"start.{axis}", f"start.{axis}: {v:g} is outside "
                            f"[-{COORD_LIMIT:g}, {COORD_LIMIT:g}]")
    return xy


def _scores(value: Any, region: Region) -> np.ndarray:
    if not isinstance(value, (list, tuple)):
        raise PlanError(422, "scores", f"scores: expected a list of {region.n_points} numbers "
                        f"(one per point of {region.id}), got {_describe(value)}")
    if len(value) != region.n_points:
        raise PlanError(422, "scores", f"scores: expected {region.n_points} values (one per "
                        f"point of {region.id}), got {len(value)}")
    out = np.empty(len(value), dtype=np.float64)
    for i, v in enumerate(value):
        out[i] = _number(v, f"scores[{i}]")
        if not 0.0 <= out[i] <= SCORE_LIMIT:
            raise PlanError(422, f"scores[{i}]", f"scores[{i}]: {out[i]:g} is outside "
                            f"[0, {SCORE_LIMIT:g}]")
    return out


def parse_request(data: Mapping[str, Any], catalog: Catalog) -> PlanRequest:
    """Validate a decoded request against the catalog; raises :class:`PlanError`."""
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        raise PlanError(422, unknown[0], f"unknown field(s) {unknown}; known: {list(FIELDS)}")
    rid = data.get("region")
    if not isinstance(rid, str) or not rid:
        raise PlanError(422, "region", f"region: expected a region id (string), got "
                        f"{_describe(rid)}")
    if rid not in catalog:
        raise PlanError(404, "region", f"region: unknown region {rid[:64]!r} (GET /regions or "
                        "`optw catalog list` lists them)")
    region = catalog.region(rid)

    method = data.get("method", DEFAULT_METHOD)
    if method not in METHODS:
        raise PlanError(422, "method", f"method: unknown method {_describe(method)}; expected "
                        f"one of {list(METHODS)}")
    beams = data.get("beams", DEFAULT_BEAMS)
    if isinstance(beams, bool) or not isinstance(beams, int):
        raise PlanError(422, "beams", f"beams: expected an integer in {MIN_BEAMS}..{MAX_BEAMS}, "
                        f"got {_describe(beams)}")
    if not MIN_BEAMS <= beams <= MAX_BEAMS:
        raise PlanError(422, "beams", f"beams: {beams} is outside {MIN_BEAMS}..{MAX_BEAMS}")

    start_xy = _start(data.get("start"), region)
    t_start, c1 = (parse_time(data["t_start"], "t_start") if "t_start" in data
                   else (region.t_start, False))
    t_end, c2 = (parse_time(data["t_end"], "t_end") if "t_end" in data
                 else (region.t_end, False))
    lo, hi = 0.0, region.t_max
    for name, v in (("t_start", t_start), ("t_end", t_end)):
        if not lo <= v <= hi:
            raise PlanError(422, name, f"{name}: {v:g} ({format_time(v)}) is outside the day of "
                            f"region {rid}, [{lo:g}, {hi:g}] minutes ({format_time(lo)}-"
                            f"{format_time(hi)})")
    if t_end <= t_start:
        raise PlanError(422, "t_end", f"t_end: {t_end:g} is not after t_start {t_start:g}")

    if data.get("scores") is not None and data.get("preference") is not None:
        raise PlanError(422, "scores", "scores: give either scores or preference, not both")
    preference = None
    if data.get("scores") is not None:
        scores = _scores(data["scores"], region)
    else:
        preference = data.get("preference") or DEFAULT_PREFERENCE
        if not isinstance(preference, str):
            raise PlanError(422, "preference", f"preference: expected a profile name, got "
                            f"{_describe(preference)}")
        scores = preference_scores(region, preference)
    return PlanRequest(region=region, start_xy=start_xy, t_start=t_start, t_end=t_end,
                       scores=scores, preference=preference, method=method, beams=beams,
                       clock=c1 or c2)


def reachable(req: PlanRequest) -> np.ndarray:
    """[n_points] bool: points that can be visited alone (reached by their closing time and
    left in time to reach the end by ``t_end``), in exact time units like the validator."""
    region = req.region

    def units(v: Any) -> np.ndarray:
        return np.rint(np.asarray(v, dtype=np.float64) * TIME_UNITS_PER_MINUTE).astype(np.int64)

    d = region.distances(np.array([req.start_xy]))[0]
    arrive = units(req.t_start) + units(d[0, 1:-1])
    begin = np.maximum(arrive, units(region.opening[1:-1]))
    back = units(d[1:-1, -1])
    return (begin <= units(region.closing[1:-1])) & (
        begin + units(region.duration[1:-1]) + back <= units(req.t_end))


# ----------------------------------------------------------------------------- models


@dataclass(frozen=True)
class LoadedModel:
    """A model ready to solve, with where it came from."""

    model: Any
    version: int | None
    source: str


class ModelProvider(Protocol):
    def get(self, region_id: str) -> LoadedModel: ...


class CheckpointModels:
    """One checkpoint file for every region (``optw plan --checkpoint``)."""

    def __init__(self, path: str | Path):
        from optw.model import load_model

        self.path = Path(path)
        self._loaded = LoadedModel(load_model(self.path), None, str(self.path))

    def get(self, region_id: str) -> LoadedModel:
        return self._loaded


@dataclass
class _Entry:
    current: LoadedModel | None = None
    checked: float = -math.inf
    folder: Path | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


class RegistryModels:
    """Each region's ``models:/optw-<region>@champion``, cached per region.

    The alias is looked up again at most every ``check_interval`` seconds (one cheap registry
    query); when it points at another version, that version is loaded and replaces the cached
    one. While one thread reloads, others keep solving with the previous model. If the registry
    cannot be reached, a cached model keeps serving.
    """

    def __init__(self, uri: str | None = None, check_interval: float = DEFAULT_CHECK_INTERVAL,
                 cache_dir: str | Path | None = None):
        from optw.tracking import tracking_uri

        self.uri = tracking_uri(uri)
        self.check_interval = float(check_interval)
        self.cache_dir = Path(cache_dir or tempfile.mkdtemp(prefix="optw-planner-"))
        self._entries: dict[str, _Entry] = {}
        self._guard = threading.Lock()

    def _entry(self, region_id: str) -> _Entry:
        with self._guard:
            return self._entries.setdefault(region_id, _Entry())

    def _fresh(self, e: _Entry) -> bool:
        return e.current is not None and time.monotonic() - e.checked < self.check_interval

    def get(self, region_id: str) -> LoadedModel:
        e = self._entry(region_id)
        current = e.current
        if self._fresh(e) and current is not None:
            return current
        if current is not None and not e.lock.acquire(blocking=False):
            return current  # another thread is checking or reloading: use the cached model
        if current is None:
            e.lock.acquire()
        try:
            if self._fresh(e) and e.current is not None:
                return e.current
            return self._refresh(region_id, e)
        finally:
            e.lock.release()

    def _refresh(self, region_id: str, e: _Entry) -> LoadedModel:
        from optw.tracking import CHAMPION, champion, load_solver, model_name

        name = f"models:/{model_name(region_id)}@{CHAMPION}"
        try:
            info = champion(region_id, uri=self.uri)
        except Exception as exc:
            if e.current is not None:
                log.warning("registry %s unreachable (%s); serving cached %s version %s",
                            self.uri, exc, region_id, e.current.version)
                e.checked = time.monotonic()
                return e.current
            raise PlanError(503, "region", f"region: the model registry is unavailable "
                            f"({type(exc).__name__}: {exc})") from exc
        if info is None:
            e.current = None
            raise PlanError(409, "region", f"region: {region_id} has no champion model yet "
                            f"({name} does not exist); train and register one first")
        if e.current is None or e.current.version != info.version:
            folder = self.cache_dir / region_id / f"v{info.version}-{time.time_ns()}"
            folder.mkdir(parents=True)
            t0 = time.perf_counter()
            try:
                solver = load_solver(name, uri=self.uri, dst_path=folder)
            except Exception as exc:
                shutil.rmtree(folder, ignore_errors=True)
                if e.current is not None:
                    log.error("cannot load %s (%s); keeping version %s", name, exc,
                              e.current.version)
                    e.checked = time.monotonic()
                    return e.current
                raise PlanError(503, "region", f"region: cannot load {name} "
                                f"({type(exc).__name__}: {exc})") from exc
            old = e.folder
            e.current = LoadedModel(solver.model, solver.version, name)
            e.folder = folder
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
            log.info("loaded %s version %s in %.2f s", name, solver.version,
                     time.perf_counter() - t0)
        e.checked = time.monotonic()
        assert e.current is not None
        return e.current

    def loaded(self) -> dict[str, int | None]:
        """Region -> cached model version."""
        with self._guard:
            return {r: e.current.version for r, e in self._entries.items() if e.current}

    def close(self) -> None:
        shutil.rmtree(self.cache_dir, ignore_errors=True)


# ----------------------------------------------------------------------------- planner


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

    def solve(self, req: PlanRequest) -> dict[str, Any]:
        """Solve a validated request -> the itinerary as a JSON-ready dict."""
        from optw.env import check_route

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
