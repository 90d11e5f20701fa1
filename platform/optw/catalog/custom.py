"""Custom regions ("bring your own region"): a points file (CSV or GeoJSON) and an optional
travel-time matrix (CSV) -> a :class:`~optw.catalog.region.Region` (``docs/custom-regions.md``).

Points: one place per CSV row / GeoJSON Point feature, columns (properties) ``name``, ``lat`` +
``lon`` (GeoJSON: the geometry) or ``x`` + ``y``, ``visit_minutes``, ``opens``, ``closes``,
``score``. The FIRST row / feature is the default start (= end) place: its ``opens``/``closes``
are the day (``t_start``, ``t_end``), its ``visit_minutes`` and ``score`` empty or 0. Times are
``"HH:MM"`` or minutes since midnight; ``closes`` is the LATEST START of a visit.

Travel times: great-circle distance ÷ ``speed_kmh`` (lat/lon) or Euclidean distance (x/y, in
minutes), rounded DOWN to :data:`CUSTOM_DECIMALS` decimals; a matrix (rows and columns labelled
by place name, or by node index 0 = start place, 1..N = points in file order) replaces them
between the places it lists.

Every problem raises :class:`CustomRegionError` (a ``ValueError``) naming the file, the row
(1-based data row; ``feature N`` in GeoJSON) and the field.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
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
#: Column names (after lower-casing and stripping) and the aliases accepted for them.
COLUMNS = ("name", "lat", "lon", "x", "y", "visit_minutes", "opens", "closes", "score")
ALIASES = {"latitude": "lat", "longitude": "lon", "lng": "lon", "duration": "visit_minutes"}
RESERVED_NAMES = ("start", "end")
#: Latest time of day accepted ("47:59": places open past midnight); also the longest visit.
MAX_MINUTES = 48 * 60 - 1
#: Largest |x| and |y| of planar points, in minutes of travel from the origin (about 69 days).
MAX_XY = 1e5
#: Longest travel time of a matrix entry, in minutes (larger values are refused: an entry
#: that should never be travelled is better left out of a route by its time windows).
MAX_TRAVEL_MINUTES = 1e5
# Every number that enters is finite and bounded: coordinates (lat/lon by their ranges, x/y by
# MAX_XY), times and visits by MAX_MINUTES, scores by SCORE_LIMIT (as in tourist files), travel
# times by MAX_TRAVEL_MINUTES, speed by MAX_SPEED_KMH.
_HHMM = re.compile(r"^(\d{1,2}):(\d{2})$")


class CustomRegionError(UserError):
    """A bad custom region input: ``path`` (None for the region id / options), ``row``
    (1-based data row or feature; None for the whole file), ``field`` and ``problem``."""

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


@dataclass
class _Record:
    """One place as read: raw field values, its position and how to name it."""

    row: int
    line: int | None
    unit: str
    values: dict[str, Any]
    geometry: tuple[float, float] | None = None  # GeoJSON (lat, lon)


@dataclass(frozen=True)
class PlaceRows:
    """Parsed places (index 0 = start place) and their coordinates."""

    names: list[str]
    coords: str  # "latlon" | "xy"
    a: np.ndarray  # lat or x
    b: np.ndarray  # lon or y
    duration: np.ndarray
    opening: np.ndarray
    closing: np.ndarray
    score: np.ndarray
    records: list[_Record]


def check_id(value: str, what: str = "region") -> str:
    """``value`` if it is a safe identifier (:data:`SAFE_ID`), else :class:`CustomRegionError`."""
    if not isinstance(value, str) or not SAFE_ID.match(value):
        raise CustomRegionError(None, None, what, f"{what} {value!r} is not a safe identifier: "
                                "1-40 characters, a lower-case letter first, then lower-case "
                                "letters, digits, '_' or '-'")
    return value


def check_region_id(region_id: str, group: str, groups: Iterable[str] = ()) -> None:
    """A custom region id and group: safe identifiers; the id must not be (or look like) a
    benchmark region, nor be a group name (a benchmark group, ``custom``, ``group`` or one of
    ``groups``, the catalog's); the group must not be a benchmark group."""
    check_id(region_id, "region")
    check_id(group, "group")
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


# ----------------------------------------------------------------------------- reading


def _read_text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise CustomRegionError(path, None, None, f"not UTF-8 text ({exc.reason} at byte "
                                f"{exc.start})") from None
    except OSError as exc:  # a folder, no permission
        raise CustomRegionError(path, None, None, f"cannot read it ({exc.strerror or exc})"
                                ) from None


def _canon(header: str) -> str:
    key = header.strip().lower()
    return ALIASES.get(key, key)


def _csv_records(path: Path, text: str) -> list[_Record]:
    reader = csv.reader(io.StringIO(text))
    rows = [(reader.line_num, r) for r in reader]
    rows = [(no, r) for no, r in rows if any(c.strip() for c in r)]
    if not rows:
        raise CustomRegionError(path, None, None, "the file is empty (a header row and one row "
                                "per place expected)")
    if len(rows) == 1:
        raise CustomRegionError(path, None, None, "the file has a header but no rows (one row "
                                "per place expected: the start place, then the points of "
                                "interest)")
    head_line, header = rows[0]
    keys = [_canon(h) for h in header]
    seen = set()
    for k in keys:
        if k and k in seen:
            raise CustomRegionError(path, None, k, f"column {k!r} appears twice in the header")
        seen.add(k)
    out = []
    for i, (no, cells) in enumerate(rows[1:], 1):
        if len(cells) > len(keys):
            raise CustomRegionError(path, i, None, f"{len(cells)} cells, but the header has "
                                    f"{len(keys)} columns", line=no)
        values = {k: (cells[j].strip() if j < len(cells) else "") for j, k in enumerate(keys)
                  if k}
        out.append(_Record(i, no, "row", values))
    return out


def _geojson_records(path: Path, text: str) -> list[_Record]:
    try:
        doc = load_json(text)
    except ValueError as exc:
        raise CustomRegionError(path, None, None, str(exc)) from None
    if not isinstance(doc, dict) or doc.get("type") != "FeatureCollection" \
            or not isinstance(doc.get("features"), list):
        raise CustomRegionError(path, None, "type", "expected a GeoJSON FeatureCollection "
                                "with a list of features")
    out = []
    for i, feat in enumerate(doc["features"], 1):
        if not isinstance(feat, dict) or feat.get("type") != "Feature":
            raise CustomRegionError(path, i, "type", "not a GeoJSON Feature", unit="feature")
        props = feat.get("properties") or {}
        if not isinstance(props, dict):
            raise CustomRegionError(path, i, "properties", "properties must be an object",
                                    unit="feature")
        values = {}
        for k, v in props.items():
            key = _canon(str(k))
            if key in values:
                raise CustomRegionError(path, i, key, f"property {key!r} given twice",
                                        unit="feature")
            values[key] = v
        if "lat" in values or "lon" in values:
            raise CustomRegionError(path, i, "lat" if "lat" in values else "lon",
                                    "GeoJSON places take lat/lon from the Point geometry, not "
                                    "from properties", unit="feature")
        geom, geometry = feat.get("geometry"), None
        if geom is not None:
            coords = geom.get("coordinates") if isinstance(geom, dict) else None
            if not isinstance(geom, dict) or geom.get("type") != "Point" \
                    or not isinstance(coords, list) or len(coords) not in (2, 3):
                raise CustomRegionError(path, i, "geometry", "expected a Point geometry "
                                        "[lon, lat]", unit="feature")
            lon, lat = (_number(path, i, f, v, "feature") for f, v in
                        (("lon", coords[0]), ("lat", coords[1])))
            geometry = (lat, lon)
        out.append(_Record(i, None, "feature", values, geometry))
    return out


def _err(rec: _Record, path: Path, field: str, problem: str) -> CustomRegionError:
    return CustomRegionError(path, rec.row, field, problem, unit=rec.unit, line=rec.line)


def _blank(v: Any) -> bool:
    return v is None or (isinstance(v, str) and not v.strip())


def _number(path: Path, row: int, field: str, v: Any, unit: str = "row",
            line: int | None = None) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise CustomRegionError(path, row, field, f"expected a number, got {describe(v)}", unit,
                                line)
    try:
        out = float(v)
    except (ValueError, OverflowError):
        raise CustomRegionError(path, row, field, f"non-numeric value {v!r}", unit,
                                line) from None
    if not math.isfinite(out):
        raise CustomRegionError(path, row, field, f"non-finite value {v!r}", unit, line)
    return out


def _value(rec: _Record, path: Path, field: str, limit: float | None = None,
           what: str = "value") -> float:
    """The record's number ``field``; with ``limit``: ``|value| <= limit``."""
    v = rec.values.get(field)
    if _blank(v):
        raise _err(rec, path, field, "missing value")
    out = _number(path, rec.row, field, v, rec.unit, rec.line)
    if limit is not None and abs(out) > limit:
        raise _err(rec, path, field, f"{what} {out:g} is outside [-{limit:g}, {limit:g}]")
    return out


def _time(rec: _Record, path: Path, field: str) -> float:
    v = rec.values.get(field)
    if _blank(v):
        raise _err(rec, path, field, "missing value (a time \"HH:MM\" or minutes since "
                   "midnight)")
    m = _HHMM.match(v.strip()) if isinstance(v, str) else None
    if m:
        h, mi = int(m.group(1)), int(m.group(2))
        if mi > 59 or h * 60 + mi > MAX_MINUTES:
            raise _err(rec, path, field, f"bad time {v!r} (HH:MM up to 47:59)")
        return float(h * 60 + mi)
    if isinstance(v, str) and ":" in v:
        raise _err(rec, path, field, f"bad time {v!r} (expected \"HH:MM\" or minutes)")
    t = _number(path, rec.row, field, v, rec.unit, rec.line)
    if t < 0:
        raise _err(rec, path, field, f"negative time {t:g}")
    if t > MAX_MINUTES:
        raise _err(rec, path, field, f"time {t:g} is after 47:59 ({MAX_MINUTES} minutes)")
    return t


def _place_rows(path: Path) -> PlaceRows:
    kind = POINT_FILE_TYPES.get(path.suffix.lower())
    if kind is None:
        raise CustomRegionError(path, None, None, f"unknown file type {path.suffix!r}; points "
                                f"files are {', '.join(POINT_FILE_TYPES)}")
    if not path.is_file():
        raise CustomRegionError(path, None, None, "file not found")
    text = _read_text(path)
    records = _csv_records(path, text) if kind == "csv" else _geojson_records(path, text)
    if kind == "csv":
        header = set().union(*(r.values for r in records)) if records else set()
        if {"lat", "lon"} & header and {"x", "y"} & header:
            raise CustomRegionError(path, None, "x", "mixed coordinates: the header has "
                                    "lat/lon AND x/y columns; give one pair")
        for need in ("name", "visit_minutes", "opens", "closes", "score"):
            if need not in header:
                raise CustomRegionError(path, None, need, f"missing column {need!r}; columns "
                                        f"are {', '.join(COLUMNS)}")
        if not ({"lat", "lon"} <= header or {"x", "y"} <= header):
            raise CustomRegionError(path, None, "lat", "missing coordinate columns: lat and lon "
                                    "(degrees) or x and y (minutes)")
    if len(records) < 1 + MIN_POINTS:
        raise CustomRegionError(path, None, None, f"{len(records)} places; at least "
                                f"{1 + MIN_POINTS} expected (the start place, then at least "
                                f"{MIN_POINTS} points of interest)")
    names, a, b, dur, opening, closing, score = [], [], [], [], [], [], []
    coords = None
    seen: dict[str, int] = {}
    for i, rec in enumerate(records):
        name = rec.values.get("name")
        if _blank(name) or not isinstance(name, str):
            raise _err(rec, path, "name", "missing name" if _blank(name) else
                       f"name must be text, got {describe(name)}")
        name = name.strip()
        if len(name) > 200:
            raise _err(rec, path, "name", "name longer than 200 characters")
        key = name.casefold()
        if key in seen:
            raise _err(rec, path, "name", f"duplicate name {name!r} (also {rec.unit} "
                       f"{seen[key]}; names are compared without case)")
        if i > 0 and key in RESERVED_NAMES:
            raise _err(rec, path, "name", f"{name!r} is reserved for the route's start and end "
                       "nodes; rename the place")
        seen[key] = rec.row
        # coordinates
        has_xy = not (_blank(rec.values.get("x")) and _blank(rec.values.get("y")))
        if rec.unit == "feature":
            if rec.geometry is not None and has_xy:
                raise _err(rec, path, "x", "mixed coordinates: a Point geometry AND x/y "
                           "properties; give one")
            this = "latlon" if rec.geometry is not None else "xy"
        else:
            this = "latlon" if "lat" in rec.values else "xy"
        if coords is None:
            coords = this
        elif this != coords:
            raise _err(rec, path, "geometry" if this == "latlon" else "x", "mixed coordinates: "
                       f"this place has {this}, the first has {coords}")
        if this == "latlon":
            if rec.geometry is not None:
                la, lo = rec.geometry
            else:
                la, lo = _value(rec, path, "lat"), _value(rec, path, "lon")
            if not -90.0 <= la <= 90.0:
                raise _err(rec, path, "lat", f"latitude {la:g} is outside [-90, 90]")
            if not -180.0 <= lo <= 180.0:
                raise _err(rec, path, "lon", f"longitude {lo:g} is outside [-180, 180]")
            a.append(la)
            b.append(lo)
        else:
            if rec.unit == "feature" and not has_xy:
                raise _err(rec, path, "geometry", "missing: a Point geometry or x/y properties")
            for axis, out in (("x", a), ("y", b)):
                out.append(_value(rec, path, axis, MAX_XY, f"{axis} (minutes of travel)"))
        o, c = _time(rec, path, "opens"), _time(rec, path, "closes")
        if i == 0:
            for f in ("visit_minutes", "score"):
                v = rec.values.get(f)
                if not _blank(v) and _number(path, rec.row, f, v, rec.unit, rec.line) != 0:
                    raise _err(rec, path, f, f"the first {rec.unit} is the start (= end) place "
                               f"of the day ({name!r}); its {f} must be empty or 0")
            if c <= o:
                raise _err(rec, path, "closes", f"the day of the start place ends at "
                           f"{_clock(c)}, not after it starts ({_clock(o)})")
            d, s = 0.0, 0.0
        else:
            d, s = _value(rec, path, "visit_minutes"), _value(rec, path, "score")
            if d < 0:
                raise _err(rec, path, "visit_minutes", f"negative visit duration {d:g}")
            if d > MAX_MINUTES:
                raise _err(rec, path, "visit_minutes", f"visit duration {d:g} is longer than "
                           f"{MAX_MINUTES} minutes (47:59)")
            if s < 0:
                raise _err(rec, path, "score", f"negative score {s:g}")
            if s > SCORE_LIMIT:
                raise _err(rec, path, "score", f"score {s:g} is above {SCORE_LIMIT:g}")
            if c < o:
                raise _err(rec, path, "closes", f"closing time {_clock(c)} is before opening "
                           f"time {_clock(o)}")
        names.append(name)
        dur.append(d)
        opening.append(o)
        closing.append(c)
        score.append(s)
    if max(score) < 1:
        raise CustomRegionError(path, None, "score", f"the largest score is {max(score):g}; at "
                                "least one point needs a score of 1 or more")
    arr = lambda v: np.asarray(v, dtype=np.float64)  # noqa: E731
    return PlaceRows(names, coords, arr(a), arr(b), arr(dur), arr(opening), arr(closing),
                     arr(score), records)


def _clock(minutes: float) -> str:
    m = int(round(minutes))
    return f"{m // 60:02d}:{m % 60:02d}"


def read_matrix(path: Path, names: list[str], decimals: int = CUSTOM_DECIMALS) -> np.ndarray:
    """A travel-time matrix CSV -> ``[P, P]`` minutes between the places (index 0 = start place,
    1..N = points), NaN where not given. Header row: a corner cell, then column labels; each
    row: its label, then minutes. Labels are place names (case-insensitive), else node indices.
    Every point of interest must be listed; the start place may be."""
    if path.suffix.lower() != ".csv":
        raise CustomRegionError(path, None, None, f"unknown file type {path.suffix!r}; a "
                                "travel-time matrix is a .csv file")
    if not path.is_file():
        raise CustomRegionError(path, None, None, "file not found")
    reader = csv.reader(io.StringIO(_read_text(path)))
    rows = [(reader.line_num, r) for r in reader]
    rows = [(no, [c.strip() for c in r]) for no, r in rows if any(c.strip() for c in r)]
    if len(rows) < 2:
        raise CustomRegionError(path, None, None, "empty matrix: a header row of place names "
                                "and one row per place expected")
    by_key = {n.casefold(): i for i, n in enumerate(names)}

    def place(label: str, row: int | None, line: int | None, field: str | None) -> int:
        if label.casefold() in by_key:
            return by_key[label.casefold()]
        if re.fullmatch(r"\d+", label) and int(label) < len(names):
            return int(label)
        raise CustomRegionError(path, row, field, f"unknown place {label!r}: not a name of "
                                f"the points file nor a node index 0..{len(names) - 1}",
                                line=line)

    head_line, header = rows[0]
    labels = header[1:]
    cols = []
    for lab in labels:
        if not lab:
            raise CustomRegionError(path, None, None, "empty column label in the header",
                                    line=head_line)
        j = place(lab, None, None, lab)
        if j in cols:
            raise CustomRegionError(path, None, lab, f"place {names[j]!r} has two columns")
        cols.append(j)
    data = rows[1:]
    if len(data) != len(cols):
        raise CustomRegionError(path, None, None, f"not square: {len(cols)} columns but "
                                f"{len(data)} rows")
    out = np.full((len(names), len(names)), np.nan)
    row_places = []
    for r, (no, cells) in enumerate(data, 1):
        if len(cells) != len(header):
            raise CustomRegionError(path, r, None, f"not square: {len(cells) - 1} values, the "
                                    f"header has {len(cols)} columns", line=no)
        i = place(cells[0], r, no, header[0] or "label")
        if i in row_places:
            raise CustomRegionError(path, r, header[0] or "label", f"place {names[i]!r} has "
                                    "two rows", line=no)
        row_places.append(i)
        for j, lab, v in zip(cols, labels, cells[1:], strict=True):
            if not v:
                raise CustomRegionError(path, r, lab, "missing travel time", line=no)
            t = _number(path, r, lab, v, line=no)
            if t < 0:
                raise CustomRegionError(path, r, lab, f"negative travel time {t:g}", line=no)
            if t > MAX_TRAVEL_MINUTES:
                raise CustomRegionError(path, r, lab, f"travel time {t:g} is above "
                                        f"{MAX_TRAVEL_MINUTES:g} minutes", line=no)
            if i == j and t != 0:
                raise CustomRegionError(path, r, lab, f"travel time from {names[i]!r} to itself "
                                        f"is {t:g}, not 0", line=no)
            out[i, j] = t
    if sorted(row_places) != sorted(cols):
        extra = sorted(set(row_places) ^ set(cols))
        raise CustomRegionError(path, None, None, "rows and columns list different places: "
                                + ", ".join(repr(names[k]) for k in extra))
    missing = [names[k] for k in range(1, len(names)) if k not in cols]
    if missing:
        raise CustomRegionError(path, None, None, f"{len(missing)} point(s) of interest have no "
                                f"row and column: {', '.join(map(repr, missing[:10]))}"
                                + (" ..." if len(missing) > 10 else ""))
    return np.where(np.isnan(out), np.nan, round_down(np.nan_to_num(out), decimals))


# ----------------------------------------------------------------------------- building


def build_custom_region(
    region_id: str,
    points: Path | str,
    travel_times: Path | str | None = None,
    speed_kmh: float | None = None,
    group: str = CUSTOM_GROUP,
    source_file: str | None = None,
) -> Region:
    """Read and check a custom region (:class:`CustomRegionError` on any problem)."""
    check_region_id(region_id, group)
    points = Path(points)
    rows = _place_rows(points)
    if rows.coords == "xy" and speed_kmh is not None:
        raise CustomRegionError(None, None, "--speed-kmh", "only lat/lon points take a speed; "
                                "x/y coordinates are minutes already")
    speed = None
    if rows.coords == "latlon":
        speed = DEFAULT_SPEED_KMH if speed_kmh is None else float(speed_kmh)
        if not (math.isfinite(speed) and 0 < speed <= MAX_SPEED_KMH):
            raise CustomRegionError(None, None, "--speed-kmh", f"speed {speed_kmh!r} km/h must "
                                    f"be in (0, {MAX_SPEED_KMH:g}]")
        if float(rows.b.max() - rows.b.min()) > 180.0:
            raise CustomRegionError(points, None, "lon", "the places span more than 180° of "
                                    "longitude (across the antimeridian); not supported")
    start = 0

    def node(v: np.ndarray) -> np.ndarray:
        return np.concatenate([v, v[start:start + 1]])

    t_start, t_end = float(rows.opening[0]), float(rows.closing[0])
    kw: dict[str, Any] = {}
    lat = lon = None
    if rows.coords == "latlon":
        lat, lon = node(rows.a), node(rows.b)
        origin = (float((lat.min() + lat.max()) / 2), float((lon.min() + lon.max()) / 2))
        proto = Region(id=region_id, group=group, x=lat, y=lon, duration=lat, opening=lat,
                       closing=lat, score=lat, t_start=0, t_end=0, decimals=0,
                       coords="latlon", speed_kmh=speed, origin=origin)
        x, y = proto.to_xy(lat, lon)
        kw.update(coords="latlon", lat=lat, lon=lon, metric="haversine", speed_kmh=speed,
                  origin=origin)
    else:
        x, y = node(rows.a), node(rows.b)
    travel = None
    if travel_times is not None:
        m = read_matrix(Path(travel_times), rows.names)
        travel = np.full((len(x), len(x)), np.nan)
        travel[:-1, :-1] = m
        travel[-1, :] = travel[0, :]
        travel[:, -1] = travel[:, 0]
        travel[0, -1] = travel[-1, 0] = travel[-1, -1] = travel[0, 0] = 0.0
        if np.isnan(travel[0, 1:-1]).all():  # start place not in the matrix: metric rows
            travel[0, :] = travel[-1, :] = travel[:, 0] = travel[:, -1] = np.nan
    opening, closing = node(rows.opening), node(rows.closing)
    opening[-1], closing[-1] = t_start, t_end
    region = Region(
        id=region_id, group=group, x=np.asarray(x, dtype=np.float64),
        y=np.asarray(y, dtype=np.float64), duration=node(rows.duration), opening=opening,
        closing=closing, score=node(rows.score), t_start=t_start, t_end=t_end,
        decimals=CUSTOM_DECIMALS, source_file=source_file or points.name,
        source_hash=file_sha256(points), names=("start", *rows.names[1:], "end"),
        start_name=rows.names[0], travel=travel, **kw,
    )
    _check_reachable(region, rows, points)
    return region


def _check_reachable(region: Region, rows: PlaceRows, path: Path) -> None:
    """Every point must be visitable by a tourist of the default day from the default start."""
    d = region.distances()
    bad = []
    for i in range(1, region.n_nodes - 1):
        arrive = region.t_start + d[0, i]
        begin = max(arrive, region.opening[i])
        back = begin + region.duration[i] + d[i, -1]
        if begin > region.closing[i]:
            bad.append((i, "closes", f"from {rows.names[0]!r} at {_clock(region.t_start)} it is "
                        f"reached at {_clock(arrive)} ({d[0, i]:g} minutes), after its latest "
                        f"start {_clock(region.closing[i])}"))
        elif back > region.t_end:
            bad.append((i, "visit_minutes", f"a visit from {_clock(begin)} for "
                        f"{region.duration[i]:g} minutes and the way back ({d[i, -1]:g} "
                        f"minutes) end at {_clock(back)}, after the day's end "
                        f"{_clock(region.t_end)}"))
    if bad:
        i, field, why = bad[0]
        rec = rows.records[i]
        others = "; ".join(f"{rows.names[j]!r} ({rows.records[j].unit} {rows.records[j].row})"
                           for j, _, _ in bad[1:])
        raise _err(rec, path, field, f"no tourist can visit {rows.names[i]!r} within the day: "
                   f"{why}" + (f". Also unreachable: {others}" if others else ""))
