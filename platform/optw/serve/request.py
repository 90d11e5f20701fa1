"""The planner's request (``docs/planner.md``): body decoding and validation into
:class:`PlanError`s. The tourist fields are read by :func:`optw.catalog.read_tourist` (a lat/lon
region's start converted to x/y first)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from optw.catalog import (
    Catalog,
    Region,
    TouristError,
    TouristInput,
    Tourists,
    read_tourist,
    tourist_batch,
)
from optw.catalog.tourist_json import describe, finite_number
from optw.checks import echoed
from optw.serve.errors import PlanError
from optw.serve.preferences import DEFAULT_PREFERENCE, preference_scores

#: Largest accepted request body (bytes); larger bodies get HTTP 413.
MAX_BODY_BYTES = 256 * 1024
#: Request method name -> :func:`optw.decode.solve` method name.
METHODS = {"greedy": "greedy", "beam": "beam", "active-search": "active_search"}
#: Methods that use the request's ``beams``.
BEAM_METHODS = ("beam", "active-search")
DEFAULT_METHOD = "beam"
#: The request's fields that describe the tourist (read by :func:`optw.catalog.read_tourist`).
TOURIST_KEYS = ("start", "t_start", "t_end", "scores")
FIELDS = ("region", *TOURIST_KEYS, "preference", "method", "beams")
#: ASCII digits only: ``\d`` alone also takes Arabic-Indic and other Unicode digits.
_HHMM = re.compile(r"^\s*(\d{1,2}):([0-5]\d)\s*$", re.ASCII)
#: JSON integers longer than this (out of range of every field) are read as :class:`HugeInt`.
MAX_INT_DIGITS = 400


def _invalid(exc: TouristError) -> PlanError:
    return PlanError(422, exc.field, exc.message)


def _error(field: str, problem: str) -> PlanError:
    return PlanError(422, field, f"{field}: {problem}")


def _degrees(value: Any, name: str, bounds: tuple[float, float]) -> float:
    try:
        v = finite_number(value, name)
    except TouristError as exc:
        raise _invalid(exc) from None
    if not bounds[0] <= v <= bounds[1]:
        raise _error(name, f"{v:g} is outside [{bounds[0]:g}, {bounds[1]:g}] degrees")
    return v


def latlon_start(value: Any, region: Region) -> tuple[float, float]:
    """``(lat, lon)`` of a lat/lon region's given ``start``, else a 422."""
    if not isinstance(value, Mapping) or set(value) != {"lat", "lon"}:
        got = (f"keys {echoed(sorted(map(str, value)))}" if isinstance(value, Mapping)
               else describe(value))
        raise _error("start", f"region {region.id} has lat/lon coordinates; expected "
                     f"{{\"lat\": degrees, \"lon\": degrees}}, got {got}")
    return (_degrees(value["lat"], "start.lat", (-90.0, 90.0)),
            _degrees(value["lon"], "start.lon", (-180.0, 180.0)))


def parse_time(value: Any, name: str) -> tuple[float, bool]:
    """Minutes from a number or an ``"HH:MM"`` string -> (minutes, given as a clock time)."""
    if isinstance(value, str):
        if not (m := _HHMM.match(value)):
            raise _error(name, f"{value!r} is not a time; give minutes (a number) or \"HH:MM\"")
        return float(int(m.group(1)) * 60 + int(m.group(2))), True
    try:
        return finite_number(value, name), False
    except TouristError as exc:
        raise _invalid(exc) from None


#: Benchmark groups whose times count from 0 at the depot's opening (the Solomon and Cordeau
#: files); the Gavalas regions and custom regions count minutes after midnight.
OPENING_CLOCK_GROUPS = ("solomon", "cordeau")


def clock_origin(group: str) -> str:
    """What 0 minutes is in a region of ``group``: ``"midnight"`` or ``"opening"`` (the depot's)."""
    return "opening" if group in OPENING_CLOCK_GROUPS else "midnight"


def clock_note(region: Region) -> str | None:
    """What ``HH:MM`` means where the clock starts at the depot's opening (else None)."""
    return None if clock_origin(region.group) == "midnight" else (
        f"{region.id} counts time from the depot's opening, not midnight (09:00 = 540 min after "
        f"it opens); its day is 0-{region.t_max:g} min")


def format_time(minutes: float) -> str:
    """``"HH:MM"`` of a time in minutes (rounded to the minute; hours may exceed 23)."""
    total = int(round(minutes))
    return f"{'-' if total < 0 else ''}{abs(total) // 60:02d}:{abs(total) % 60:02d}"


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
    start_latlon: tuple[float, float] | None = None  # lat/lon regions: the start in degrees

    def tourists(self, scores: np.ndarray | None = None) -> Tourists:
        """The request as a one-tourist batch (``scores`` per point; default the request's)."""
        one = TouristInput(None, self.start_xy, self.t_start, self.t_end,
                           self.scores if scores is None else scores)
        return tourist_batch(self.region, [one], "generated").tourists


class HugeInt(int):
    """A JSON integer of over :data:`MAX_INT_DIGITS` digits: beyond any bound, shown short
    (Python refuses to print ints of over 4300 digits)."""

    digits: str

    def __new__(cls, text: str) -> HugeInt:
        sign = -1 if text.startswith("-") else 1
        digits = text.lstrip("+-")
        out = super().__new__(cls, sign * 10 ** (len(digits) - 1))
        out.digits = text
        return out

    def __repr__(self) -> str:
        return f"{self.digits[:20]}... ({len(self.digits.lstrip('+-'))} digits)"

    __str__ = __repr__


def _json_int(text: str) -> int:
    return HugeInt(text) if len(text) > MAX_INT_DIGITS else int(text)


def decode_body(body: bytes) -> dict[str, Any]:
    """Raw request body -> JSON object (413 when too large, 400 when not a JSON object)."""
    if len(body) > MAX_BODY_BYTES:
        raise PlanError(413, "body", f"body: {len(body)} bytes are over the limit of "
                        f"{MAX_BODY_BYTES} bytes")
    if not body.strip():
        raise PlanError(400, "body", "body: empty request body; send a JSON object")
    try:
        data = json.loads(body.decode("utf-8"), parse_int=_json_int)
    except (ValueError, RecursionError) as exc:
        raise PlanError(400, "body", f"body: malformed JSON ({echoed(str(exc), 200)})") from None
    if not isinstance(data, dict):
        raise PlanError(400, "body", f"body: must be a JSON object, not {type(data).__name__}")
    return data


def _check_day(name: str, v: float, region: Region) -> None:
    if not 0.0 <= v <= region.t_max:
        clock = f" ({format_time(v)})" if abs(v) < 1e6 else ""
        raise _error(name, f"{v:g}{clock} is outside the day of region {region.id}, [0, "
                     f"{region.t_max:g}] minutes (00:00-{format_time(region.t_max)})")


def parse_request(data: Mapping[str, Any], catalog: Catalog) -> PlanRequest:
    """Validate a decoded request against the catalog; raises :class:`PlanError`."""
    from optw.decode.limits import SERVE_BEAMS, check_beams

    unknown = sorted(str(k) for k in set(data) - set(FIELDS))
    if unknown:  # each key cut short: a 200 KB key is not echoed back
        first = echoed(unknown[0])
        listed = ", ".join(repr(echoed(k)) for k in unknown[:5]) + (
            f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
        raise _error(first, f"unknown field(s) [{listed}]; allowed: {list(FIELDS)}")
    if not isinstance(rid := data.get("region"), str) or not rid:
        raise _error("region", f"expected a region id (string), got {describe(rid)}")
    if rid not in catalog:
        raise PlanError(404, "region", f"region: unknown region {rid[:64]!r} (GET /regions or "
                        "`optw catalog list` lists them)")
    region = catalog.region(rid)

    if (method := data.get("method", DEFAULT_METHOD)) not in METHODS:
        raise _error("method", f"unknown method {describe(method)}; expected one of "
                     f"{list(METHODS)}")
    try:
        beams = check_beams(data.get("beams", SERVE_BEAMS), "beams")
    except ValueError as exc:
        raise PlanError(422, "beams", str(exc)) from None
    if data.get("scores") is not None and data.get("preference") is not None:
        raise _error("scores", "give either scores or preference, not both")

    fields = {k: data[k] for k in TOURIST_KEYS if k in data}
    start, latlon = fields.get("start"), None
    if region.coords == "latlon" and start is not None:
        latlon = latlon_start(start, region)
        x, y = region.to_xy(*latlon)
        fields["start"] = {"x": float(x), "y": float(y)}
    elif isinstance(start, Mapping) and {"lat", "lon"} & set(start):
        raise _error("start", f"region {region.id} has x/y coordinates, not lat/lon; expected "
                     "{\"x\": number, \"y\": number} or [x, y]")
    clock = False
    for key in ("t_start", "t_end"):
        if isinstance(fields.get(key), str):
            fields[key], clock = parse_time(fields[key], key)[0], True
    # a time outside the day is named before t_end <= t_start would blame the other (default)
    for name in ("t_start", "t_end"):
        v = fields.get(name)
        if (isinstance(v, float) and math.isfinite(v)) or (
                isinstance(v, int) and not isinstance(v, bool) and abs(v) < 10**18):
            _check_day(name, float(v), region)
    try:
        tourist = read_tourist(fields, region, defaults=True)
    except TouristError as exc:
        if latlon is not None and exc.field in ("start.x", "start.y"):
            name = "start.lon" if exc.field == "start.x" else "start.lat"
            raise _error(name, f"({latlon[0]:g}, {latlon[1]:g}) is too far from region "
                         f"{region.id} ({exc.message})") from None
        raise _invalid(exc) from None
    if latlon is None and region.coords == "latlon":  # no start given: the region's own
        latlon = float(region.lat[0]), float(region.lon[0])
    for name, v in (("t_start", tourist.t_start), ("t_end", tourist.t_end)):
        _check_day(name, v, region)

    preference = None
    if data.get("scores") is not None:
        scores = tourist.scores
    else:
        preference = data.get("preference") or DEFAULT_PREFERENCE
        if not isinstance(preference, str):
            raise _error("preference", f"expected a profile name, got {describe(preference)}")
        scores = preference_scores(region, preference)
    return PlanRequest(region=region, start_xy=tourist.start_xy, t_start=tourist.t_start,
                       t_end=tourist.t_end, scores=scores, preference=preference, method=method,
                       beams=beams, clock=clock, start_latlon=latlon)


def reachable(req: PlanRequest) -> np.ndarray:
    """[n_points] bool: points that can be visited alone, i.e. the environment's action mask
    at the first step (:func:`optw.env.reset`; exact time units, like the validator)."""
    from optw.env import make_instances, reset

    return reset(make_instances(req.region, req.tourists())).mask[0, 1:-1].numpy()
