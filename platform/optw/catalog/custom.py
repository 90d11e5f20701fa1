"""Custom regions: a points file (CSV or GeoJSON) and an optional travel-time matrix (CSV) ->
a :class:`~optw.catalog.region.Region` (formats and rules in ``docs/custom-regions.md``). Every
problem is a :class:`CustomRegionError` naming the file, the row or feature and the field."""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from optw.catalog.parse import FILE_PATTERNS
from optw.catalog.region import CUSTOM_GROUP, GROUPS, Region, round_down
from optw.catalog.tourist_json import SCORE_LIMIT, describe, load_json
from optw.errors import UserError
from optw.paths import file_sha256

#: Region ids and group names: lower-case letter first, then letters, digits, ``_`` or ``-``.
SAFE_ID = re.compile(r"^[a-z][a-z0-9_-]{0,39}$")
DEFAULT_SPEED_KMH = 4.5
MAX_SPEED_KMH = 1000.0
#: Rounding of derived and matrix travel times (as Cordeau and Gavalas).
CUSTOM_DECIMALS = 2
#: Fewest points of interest (besides the start place).
MIN_POINTS = 2
POINT_FILE_TYPES = {".csv": "csv", ".geojson": "geojson", ".json": "geojson"}
#: Column names (lower-cased, stripped) and the aliases accepted for them.
COLUMNS = ("name", "lat", "lon", "x", "y", "visit_minutes", "opens", "closes", "score")
ALIASES = {"latitude": "lat", "longitude": "lon", "lng": "lon", "duration": "visit_minutes"}
RESERVED_NAMES = ("start", "end")
#: Latest time of day accepted ("47:59": places open past midnight); also the longest visit.
MAX_MINUTES = 48 * 60 - 1
#: Largest |x| and |y| of planar points, in minutes of travel from the origin.
MAX_XY = 1e5
#: Longest travel time of a matrix entry, in minutes.
MAX_TRAVEL_MINUTES = 1e5
_HHMM = re.compile(r"^(\d{1,2}):(\d{2})$")


class CustomRegionError(UserError):
    """A bad custom region input: ``path``, ``row`` (1-based), ``field`` (each may be None)."""

    def __init__(self, path: Path | str | None, row: int | None, field: str | None,
                 problem: str, unit: str = "row", line: int | None = None):
        self.path = None if path is None else str(path)
        self.row, self.field, self.problem = row, field, problem
        parts = [self.path] if self.path else []
        if row is not None:
            parts.append(f"{unit} {row}" + (f" (line {line})" if line is not None else ""))
        if field is not None:
            parts.append(f"field {field!r}")
        where = ", ".join(parts)
        super().__init__(f"{where}: {problem}" if where else problem)


def _blank(v: Any) -> bool:
    return v is None or (isinstance(v, str) and not v.strip())


def _number(v: Any, fail: Callable[[str], CustomRegionError]) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise fail(f"expected a number, got {describe(v)}")
    try:
        out = float(v)
    except (ValueError, OverflowError):
        raise fail(f"non-numeric value {v!r}") from None
    if not math.isfinite(out):
        raise fail(f"non-finite value {v!r}")
    return out


def _in_range(fail: Callable[[str], CustomRegionError], what: str, v: float, high: float,
              above: str) -> float:
    if v < 0:
        raise fail(f"negative {what} {v:g}")
    if v > high:
        raise fail(f"{what} {v:g} {above}")
    return v


def clock(minutes: float) -> str:
    """``minutes`` since midnight as ``HH:MM``."""
    m = int(round(minutes))
    return f"{m // 60:02d}:{m % 60:02d}"


@dataclass
class _Record:
    """One place as read: position, raw values and GeoJSON ``geometry`` (lat, lon)."""

    path: Path
    row: int
    unit: str
    values: dict[str, Any]
    line: int | None = None
    geometry: tuple[float, float] | None = None

    def error(self, field: str | None, problem: str) -> CustomRegionError:
        return CustomRegionError(self.path, self.row, field, problem, self.unit, self.line)

    def number(self, field: str, limit: float | None = None, what: str = "value") -> float:
        """The required number ``field``; with ``limit``: ``|value| <= limit``."""
        if _blank(v := self.values.get(field)):
            raise self.error(field, "missing value")
        out = _number(v, partial(self.error, field))
        if limit is not None and abs(out) > limit:
            raise self.error(field, f"{what} {out:g} is outside [-{limit:g}, {limit:g}]")
        return out

    def time(self, field: str) -> float:
        """The time ``field`` (``"HH:MM"`` or minutes) in ``[0, MAX_MINUTES]``."""
        if _blank(v := self.values.get(field)):
            raise self.error(field, "missing value (a time \"HH:MM\" or minutes since midnight)")
        if isinstance(v, str) and (m := _HHMM.match(v.strip())):
            h, mi = int(m.group(1)), int(m.group(2))
            if mi > 59 or h * 60 + mi > MAX_MINUTES:
                raise self.error(field, f"bad time {v!r} (HH:MM up to 47:59)")
            return float(h * 60 + mi)
        if isinstance(v, str) and ":" in v:
            raise self.error(field, f"bad time {v!r} (expected \"HH:MM\" or minutes)")
        return _in_range(partial(self.error, field), "time", self.number(field), MAX_MINUTES,
                         f"is after 47:59 ({MAX_MINUTES} minutes)")


def check_region_id(region_id: str, group: str, groups: Iterable[str] = ()) -> None:
    """Refuse an unsafe id or group (:data:`SAFE_ID`), an id that is (or looks like) a benchmark
    region or that is a group name (``groups``: the catalog's) and a benchmark ``group``."""
    for what, value in (("region", region_id), ("group", group)):
        if not isinstance(value, str) or not SAFE_ID.match(value):
            raise CustomRegionError(None, None, what, f"{what} {value!r} is not a safe "
                                    "identifier: 1-40 characters, a lower-case letter first, "
                                    "then lower-case letters, digits, '_' or '-'")
    if region_id in {*GROUPS, CUSTOM_GROUP, group, *groups}:
        raise CustomRegionError(None, None, "region", f"region id {region_id!r} is a group "
                                "name; choose an id that names no group (groups and regions "
                                "share one namespace in --groups/--regions and model names)")
    for g, pattern in FILE_PATTERNS.items():
        if pattern.match(f"{region_id}.txt"):
            raise CustomRegionError(None, None, "region", f"region id {region_id!r} clashes with "
                                    f"the benchmark regions of group {g}; choose another id")
    if group in GROUPS:
        raise CustomRegionError(None, None, "group", f"group {group!r} is a benchmark group; "
                                f"custom regions use another group (default {CUSTOM_GROUP!r})")


def _read_text(path: Path) -> str:
    fail = partial(CustomRegionError, path, None, None)
    if not path.is_file():
        raise fail("file not found")
    try:
        return path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise fail(f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:  # no permission
        raise fail(f"cannot read it ({exc.strerror or exc})") from None


def _csv_rows(path: Path) -> list[tuple[int, list[str]]]:
    """The non-blank rows of a CSV file, cells stripped, with their line numbers."""
    reader = csv.reader(io.StringIO(_read_text(path)))
    return [(reader.line_num, cells) for r in reader if any(cells := [c.strip() for c in r])]


def _canon(header: str) -> str:
    key = header.strip().lower()
    return ALIASES.get(key, key)


def _csv_records(path: Path) -> list[_Record]:
    fail = partial(CustomRegionError, path, None)  # (field, problem): an error of the whole file
    if not (rows := _csv_rows(path)):
        raise fail(None, "the file is empty (a header row and one row per place expected)")
    if len(rows) == 1:
        raise fail(None, "the file has a header but no rows (one row per place expected: the "
                   "start place, then the points of interest)")
    keys = [_canon(h) for h in rows[0][1]]
    for j, k in enumerate(keys):
        if k and k in keys[:j]:
            raise fail(k, f"column {k!r} appears twice in the header")
    out = []
    for i, (no, cells) in enumerate(rows[1:], 1):
        if len(cells) > len(keys):
            raise CustomRegionError(path, i, None, f"{len(cells)} cells, but the header has "
                                    f"{len(keys)} columns", line=no)
        values = {k: (cells[j] if j < len(cells) else "") for j, k in enumerate(keys) if k}
        out.append(_Record(path, i, "row", values, no))
    header = set(keys)
    if {"lat", "lon"} & header and {"x", "y"} & header:
        raise fail("x", "mixed coordinates: the header has lat/lon AND x/y columns; give one pair")
    for need in ("name", "visit_minutes", "opens", "closes", "score"):
        if need not in header:
            raise fail(need, f"missing column {need!r}; columns are {', '.join(COLUMNS)}")
    if not ({"lat", "lon"} <= header or {"x", "y"} <= header):
        raise fail("lat", "missing coordinate columns: lat and lon (degrees) or x and y (minutes)")
    return out


def _geojson_records(path: Path) -> list[_Record]:
    try:
        doc = load_json(_read_text(path))
    except UserError as exc:
        raise CustomRegionError(path, None, None, str(exc)) from None
    if not isinstance(doc, dict) or doc.get("type") != "FeatureCollection" \
            or not isinstance(doc.get("features"), list):
        raise CustomRegionError(path, None, "type", "expected a GeoJSON FeatureCollection "
                                "with a list of features")
    out = []
    for i, feat in enumerate(doc["features"], 1):
        rec = _Record(path, i, "feature", {})
        if not isinstance(feat, dict) or feat.get("type") != "Feature":
            raise rec.error("type", "not a GeoJSON Feature")
        props = feat.get("properties") or {}
        if not isinstance(props, dict):
            raise rec.error("properties", "properties must be an object")
        for k, v in props.items():
            if (key := _canon(str(k))) in rec.values:
                raise rec.error(key, f"property {key!r} given twice")
            rec.values[key] = v
        if "lat" in rec.values or "lon" in rec.values:
            raise rec.error("lat" if "lat" in rec.values else "lon", "GeoJSON places take "
                            "lat/lon from the Point geometry, not from properties")
        if (geom := feat.get("geometry")) is not None:
            coords = geom.get("coordinates") if isinstance(geom, dict) else None
            if not isinstance(geom, dict) or geom.get("type") != "Point" \
                    or not isinstance(coords, list) or len(coords) not in (2, 3):
                raise rec.error("geometry", "expected a Point geometry [lon, lat]")
            lon = _number(coords[0], partial(rec.error, "lon"))
            lat = _number(coords[1], partial(rec.error, "lat"))
            rec.geometry = (lat, lon)
        out.append(rec)
    return out


def _place_rows(path: Path) -> tuple[str, list[str], list[_Record], np.ndarray]:
    """A points file's coordinates (``latlon``/``xy``), names, records and ``[P, 6]`` values
    (lat or x, lon or y, visit minutes, opens, closes, score); index 0 = the start place."""
    fail = partial(CustomRegionError, path, None)  # (field, problem): an error of the whole file
    if (kind := POINT_FILE_TYPES.get(path.suffix.lower())) is None:
        raise fail(None, f"unknown file type {path.suffix!r}; points files are "
                   f"{', '.join(POINT_FILE_TYPES)}")
    records = _csv_records(path) if kind == "csv" else _geojson_records(path)
    if len(records) < 1 + MIN_POINTS:
        raise fail(None, f"{len(records)} places; at least {1 + MIN_POINTS} expected (the start "
                   f"place, then at least {MIN_POINTS} points of interest)")
    names, places, coords, seen = [], [], None, {}
    for i, rec in enumerate(records):
        if _blank(name := rec.values.get("name")) or not isinstance(name, str):
            raise rec.error("name", "missing name" if _blank(name) else
                            f"name must be text, got {describe(name)}")
        name = name.strip()
        if len(name) > 200:
            raise rec.error("name", "name longer than 200 characters")
        key = name.casefold()
        if key in seen:
            raise rec.error("name", f"duplicate name {name!r} (also {rec.unit} {seen[key]}; "
                            "names are compared without case)")
        if i > 0 and key in RESERVED_NAMES:
            raise rec.error("name", f"{name!r} is reserved for the route's start and end "
                            "nodes; rename the place")
        seen[key] = rec.row
        has_xy = not (_blank(rec.values.get("x")) and _blank(rec.values.get("y")))
        if rec.geometry is not None and has_xy:  # a GeoJSON feature (CSV rows have no geometry)
            raise rec.error("x", "mixed coordinates: a Point geometry AND x/y properties; give one")
        this = "latlon" if rec.geometry is not None or "lat" in rec.values else "xy"
        coords = coords or this
        if this != coords:
            raise rec.error("geometry" if this == "latlon" else "x", "mixed coordinates: this "
                            f"place has {this}, the first has {coords}")
        if this == "latlon":
            la, lo = rec.geometry or (rec.number("lat"), rec.number("lon"))
            if not -90.0 <= la <= 90.0:
                raise rec.error("lat", f"latitude {la:g} is outside [-90, 90]")
            if not -180.0 <= lo <= 180.0:
                raise rec.error("lon", f"longitude {lo:g} is outside [-180, 180]")
        else:
            if rec.unit == "feature" and not has_xy:
                raise rec.error("geometry", "missing: a Point geometry or x/y properties")
            la, lo = (rec.number(axis, MAX_XY, f"{axis} (minutes of travel)") for axis in "xy")
        o, c = rec.time("opens"), rec.time("closes")
        if i == 0:
            for f in ("visit_minutes", "score"):
                if not _blank(rec.values.get(f)) and rec.number(f) != 0:
                    raise rec.error(f, f"the first {rec.unit} is the start (= end) place of the "
                                    f"day ({name!r}); its {f} must be empty or 0")
            if c <= o:
                raise rec.error("closes", f"the day of the start place ends at {clock(c)}, not "
                                f"after it starts ({clock(o)})")
            d, s = 0.0, 0.0
        else:
            d, s = rec.number("visit_minutes"), rec.number("score")
            _in_range(partial(rec.error, "visit_minutes"), "visit duration", d, MAX_MINUTES,
                      f"is longer than {MAX_MINUTES} minutes (47:59)")
            _in_range(partial(rec.error, "score"), "score", s, SCORE_LIMIT,
                      f"is above {SCORE_LIMIT:g}")
            if c < o:
                raise rec.error("closes", f"closing time {clock(c)} is before opening time "
                                f"{clock(o)}")
        names.append(name)
        places.append((la, lo, d, o, c, s))
    values = np.array(places, dtype=np.float64)
    if values[:, 5].max() < 1:
        raise fail("score", f"the largest score is {values[:, 5].max():g}; at least one point "
                   "needs a score of 1 or more")
    return coords, names, records, values


def read_matrix(path: Path, names: list[str]) -> np.ndarray:
    """A travel-time matrix CSV -> ``[P, P]`` minutes between the places, NaN where not given
    (labels: place names or node indices; every point of interest listed, the start may be)."""
    error = partial(CustomRegionError, path)  # (row, field, problem, line=...)
    if path.suffix.lower() != ".csv":
        raise error(None, None, f"unknown file type {path.suffix!r}; a travel-time matrix is a "
                    ".csv file")
    if len(rows := _csv_rows(path)) < 2:
        raise error(None, None, "empty matrix: a header row of place names and one row per "
                    "place expected")
    by_key = {n.casefold(): i for i, n in enumerate(names)}

    def place(label: str, row: int | None, line: int | None, field: str | None) -> int:
        if label.casefold() in by_key:
            return by_key[label.casefold()]
        if re.fullmatch(r"\d+", label) and int(label) < len(names):
            return int(label)
        raise error(row, field, f"unknown place {label!r}: not a name of the points file nor a "
                    f"node index 0..{len(names) - 1}", line=line)

    head_line, header = rows[0]
    labels = header[1:]
    cols = []
    for lab in labels:
        if not lab:
            raise error(None, None, "empty column label in the header", line=head_line)
        if (j := place(lab, None, None, lab)) in cols:
            raise error(None, lab, f"place {names[j]!r} has two columns")
        cols.append(j)
    if len(data := rows[1:]) != len(cols):
        raise error(None, None, f"not square: {len(cols)} columns but {len(data)} rows")
    out = np.full((len(names), len(names)), np.nan)
    row_places = set()
    for r, (no, cells) in enumerate(data, 1):
        if len(cells) != len(header):
            raise error(r, None, f"not square: {len(cells) - 1} values, the header has "
                        f"{len(cols)} columns", line=no)
        if (i := place(cells[0], r, no, header[0] or "label")) in row_places:
            raise error(r, header[0] or "label", f"place {names[i]!r} has two rows", line=no)
        row_places.add(i)
        for j, lab, v in zip(cols, labels, cells[1:], strict=True):
            fail = partial(CustomRegionError, path, r, lab, line=no)
            if not v:
                raise fail("missing travel time")
            t = _in_range(fail, "travel time", _number(v, fail), MAX_TRAVEL_MINUTES,
                          f"is above {MAX_TRAVEL_MINUTES:g} minutes")
            if i == j and t != 0:
                raise fail(f"travel time from {names[i]!r} to itself is {t:g}, not 0")
            out[i, j] = t
    if row_places != set(cols):
        raise error(None, None, "rows and columns list different places: "
                    + ", ".join(repr(names[k]) for k in sorted(row_places ^ set(cols))))
    if missing := [names[k] for k in range(1, len(names)) if k not in cols]:
        raise error(None, None, f"{len(missing)} point(s) of interest have no row and column: "
                    f"{', '.join(map(repr, missing[:10]))}" + (" ..." if len(missing) > 10 else ""))
    return np.where(np.isnan(out), np.nan, round_down(np.nan_to_num(out), CUSTOM_DECIMALS))


def build_custom_region(region_id: str, points: Path | str,
                        travel_times: Path | str | None = None, speed_kmh: float | None = None,
                        group: str = CUSTOM_GROUP, source_file: str | None = None) -> Region:
    """Read and check a custom region (:class:`CustomRegionError` on any problem)."""
    check_region_id(region_id, group)
    points = Path(points)
    coords, names, records, values = _place_rows(points)
    if coords == "xy" and speed_kmh is not None:
        raise CustomRegionError(None, None, "--speed-kmh", "only lat/lon points take a speed; "
                                "x/y coordinates are minutes already")
    idx = [*range(len(names)), 0]  # node order: the start place again as the end node
    x, y, duration, opening, closing, score = np.ascontiguousarray(values[idx].T)
    kw: dict[str, Any] = {}
    if coords == "latlon":
        speed = DEFAULT_SPEED_KMH if speed_kmh is None else float(speed_kmh)
        if not (math.isfinite(speed) and 0 < speed <= MAX_SPEED_KMH):
            raise CustomRegionError(None, None, "--speed-kmh", f"speed {speed_kmh!r} km/h must "
                                    f"be in (0, {MAX_SPEED_KMH:g}]")
        if float(y.max() - y.min()) > 180.0:
            raise CustomRegionError(points, None, "lon", "the places span more than 180° of "
                                    "longitude (across the antimeridian); not supported")
        origin = (float((x.min() + x.max()) / 2), float((y.min() + y.max()) / 2))
        kw.update(coords="latlon", lat=x, lon=y, metric="haversine", speed_kmh=speed, origin=origin)
        stand_in = Region(region_id, group, x, y, x, x, x, x, 0, 0, 0, **kw)  # its projection
        x, y = stand_in.to_xy(x, y)
    travel = None
    if travel_times is not None:
        travel = read_matrix(Path(travel_times), names)[np.ix_(idx, idx)]
        travel[0, -1] = travel[-1, 0] = travel[-1, -1] = travel[0, 0] = 0.0
        if np.isnan(travel[0, 1:-1]).all():  # start place not in the matrix: metric rows
            travel[0, :] = travel[-1, :] = travel[:, 0] = travel[:, -1] = np.nan
    region = Region(
        id=region_id, group=group, x=x, y=y, duration=duration, opening=opening, closing=closing,
        score=score, t_start=float(opening[0]), t_end=float(closing[0]), decimals=CUSTOM_DECIMALS,
        source_file=source_file or points.name, source_hash=file_sha256(points),
        names=("start", *names[1:], "end"), start_name=names[0], travel=travel, **kw)
    _check_reachable(region, records)
    return region


def _check_reachable(region: Region, records: list[_Record]) -> None:
    """Every point must be visitable by a tourist of the default day from the default start."""
    d = region.distances()
    bad = []
    for i in range(1, region.n_nodes - 1):
        arrive = region.t_start + d[0, i]
        begin = max(arrive, region.opening[i])
        back = begin + region.duration[i] + d[i, -1]
        if begin > region.closing[i]:
            bad.append((i, "closes", f"from {region.start_name!r} at {clock(region.t_start)} it is "
                        f"reached at {clock(arrive)} ({d[0, i]:g} minutes), after its latest "
                        f"start {clock(region.closing[i])}"))
        elif back > region.t_end:
            bad.append((i, "visit_minutes", f"a visit from {clock(begin)} for "
                        f"{region.duration[i]:g} minutes and the way back ({d[i, -1]:g} minutes) "
                        f"end at {clock(back)}, after the day's end {clock(region.t_end)}"))
    if bad:
        i, field, why = bad[0]
        others = "; ".join(f"{region.names[j]!r} ({records[j].unit} {records[j].row})"
                           for j, _, _ in bad[1:])
        raise records[i].error(field, f"no tourist can visit {region.names[i]!r} within the "
                               f"day: {why}" + (f". Also unreachable: {others}" if others else ""))
