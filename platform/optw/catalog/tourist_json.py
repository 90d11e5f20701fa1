"""The one reader of tourists given as JSON-like dicts (``optw solve`` files, the MLflow pyfunc,
the planner's requests; :data:`TOURIST_FIELDS`, format in README.md); ``null`` counts as absent.
Errors are :class:`TouristError`, the message starting with the offending ``field`` (and
``tourist <index>`` when reading many)."""

from __future__ import annotations

import json
import math
import numbers
import reprlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from optw.catalog.region import Region, Tourists
from optw.errors import UserError

#: Every field of a tourist (the format of :meth:`Tourists.to_records`).
TOURIST_FIELDS = ("tourist", "region", "kind", "start", "t_start", "t_end", "scores")
#: Fields a tourist must give when the region's benchmark values are not the defaults.
REQUIRED_FIELDS = ("start", "t_start", "t_end", "scores")
SCORE_LIMIT = 1e9
#: Start coordinates may lie this many extents of the region's box outside it.
BOX_MARGIN = 100.0
MAX_ID_LENGTH = 200

TouristId = int | str


class TouristError(UserError):
    """A tourist that cannot be read: the offending ``field``, ``index`` when reading many."""

    def __init__(self, field: str, message: str, index: int | None = None):
        super().__init__(message)
        self.field, self.message, self.index = field, message, index

    def within(self, prefix: str) -> TouristError:
        """The same error with ``prefix`` (e.g. the file) in front of its message."""
        return TouristError(self.field, f"{prefix}: {self.message}", self.index)


def _error(field: str, problem: str) -> TouristError:
    return TouristError(field, f"{field}: {problem}")


@dataclass(frozen=True)
class TouristInput:
    """One validated tourist: its id (``None`` when not given), start, times, point scores."""

    id: TouristId | None
    start_xy: tuple[float, float]
    t_start: float
    t_end: float
    scores: np.ndarray  # [n_points] float64


@dataclass(frozen=True)
class TouristBatch:
    """Validated tourists as a :class:`Tourists` batch (``tourist_id`` = position) and the ids
    to show (the given ids, else positions)."""

    ids: list[TouristId]
    tourists: Tourists

    def __len__(self) -> int:
        return len(self.ids)

    @staticmethod
    def of(tourists: Tourists) -> TouristBatch:
        """A catalog batch as is, its own ids shown."""
        return TouristBatch([int(v) for v in tourists.tourist_id], tourists)


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother = 3, 40, 40


def describe(value: Any) -> str:
    """Type and a short repr (nesting and length cut) of a value for error messages."""
    text = _SHORT.repr(value)
    return f"{type(value).__name__} {text[:40] + '...' if len(text) > 40 else text}"


def load_json(text: str | bytes, where: str | None = None) -> Any:
    """``json.loads(text)``; unreadable JSON is a one-line UserError starting with ``where``."""
    prefix = f"{where}: " if where else ""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise UserError(f"{prefix}not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{prefix}not valid JSON: {exc.msg} (line {exc.lineno}, column "
                         f"{exc.colno})") from None
    except RecursionError:
        raise UserError(f"{prefix}JSON nested too deeply (arrays or objects inside each "
                         "other beyond Python's recursion limit)") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise UserError(f"{prefix}cannot read the JSON: {' '.join(str(exc).split())[:200]}") \
            from None


def finite_number(value: Any, field: str) -> float:
    """``value`` as a float; :class:`TouristError` unless it is a finite int or float."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise _error(field, f"expected a number, got {describe(value)}")
    try:
        out = float(value)
    except OverflowError:
        out = math.inf
    if not math.isfinite(out):
        raise _error(field, f"expected a finite number, got {value!r}")
    return out


def start_box(region: Region) -> tuple[tuple[float, float], tuple[float, float]]:
    """Accepted ``(x_lo, x_hi), (y_lo, y_hi)`` of a start: the box of the region's points and
    generated starts, widened on every side by :data:`BOX_MARGIN` times its larger side."""
    (bx_lo, bx_hi), (by_lo, by_hi) = region.start_box
    x_lo, x_hi = min(bx_lo, float(region.x.min())), max(bx_hi, float(region.x.max()))
    y_lo, y_hi = min(by_lo, float(region.y.min())), max(by_hi, float(region.y.max()))
    pad = BOX_MARGIN * max(x_hi - x_lo, y_hi - y_lo, 1.0)
    return (x_lo - pad, x_hi + pad), (y_lo - pad, y_hi + pad)


def _is_vector(value: Any) -> bool:
    return isinstance(value, (list, tuple)) or (isinstance(value, np.ndarray) and value.ndim == 1)


def _id(value: Any) -> TouristId:
    if isinstance(value, str):
        if not value or len(value) > MAX_ID_LENGTH:
            raise _error("tourist", f"a string id needs 1..{MAX_ID_LENGTH} characters, got "
                         f"{len(value)}")
        return value
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise _error("tourist", f"expected an integer or string id, got {describe(value)}")
    return int(value)


def _start(value: Any, region: Region) -> tuple[float, float]:
    if isinstance(value, Mapping):
        if set(value) != {"x", "y"}:
            raise _error("start", f"expected {{\"x\": number, \"y\": number}}, got keys "
                         f"{sorted(map(str, value))}")
        x, y = value["x"], value["y"]
    elif _is_vector(value) and len(value) == 2:
        x, y = value
    else:
        raise _error("start", f"expected [x, y] or {{\"x\": x, \"y\": y}}, got {describe(value)}")
    xy = (finite_number(x, "start.x"), finite_number(y, "start.y"))
    for axis, v, (lo, hi) in zip("xy", xy, start_box(region), strict=True):
        if not lo <= v <= hi:
            raise _error(f"start.{axis}", f"{v:g} is outside [{lo:g}, {hi:g}], the box around "
                         f"region {region.id}")
    return xy


def _time(value: Any, field: str, region: Region) -> float:
    t = finite_number(value, field)
    lo, hi = -region.t_max, 2.0 * region.t_max  # the day widened: generated starts may be < 0
    if not lo <= t <= hi:
        raise _error(field, f"{t:g} is outside [{lo:g}, {hi:g}] minutes (the day [0, "
                     f"{region.t_max:g}] of region {region.id} widened by its length)")
    return t


def _scores(value: Any, region: Region) -> np.ndarray:
    n_points, n_nodes = region.n_points, region.n_nodes
    if not _is_vector(value):
        raise _error("scores", f"expected a list of {n_points} numbers (one per point of "
                     f"{region.id}), got {describe(value)}")
    if len(value) not in (n_points, n_nodes):
        raise _error("scores", f"expected {n_points} values (one per point of {region.id}) or "
                     f"{n_nodes} (one per node), got {len(value)}")
    out = np.empty(len(value), dtype=np.float64)
    for i, v in enumerate(value):
        out[i] = finite_number(v, f"scores[{i}]")
        if not 0.0 <= out[i] <= SCORE_LIMIT:
            raise _error(f"scores[{i}]", f"{out[i]:g} is outside [0, {SCORE_LIMIT:g}]")
    return out if len(out) == n_points else out[1:-1].copy()


def read_tourist(data: Any, region: Region, *, defaults: bool = False) -> TouristInput:
    """Read and validate one tourist of ``region`` from a dict (:class:`TouristError`);
    ``defaults``: absent fields take the region's benchmark values (else they are required)."""
    if not isinstance(data, Mapping):
        raise _error("tourist", f"expected an object, got {describe(data)}")
    if unknown := sorted(str(k) for k in set(data) - set(TOURIST_FIELDS)):
        raise _error(unknown[0], f"unknown field(s) {unknown}; allowed: {list(TOURIST_FIELDS)}")
    given = {k: v for k, v in data.items() if v is not None}
    if missing := [k for k in REQUIRED_FIELDS if not defaults and k not in given]:
        raise _error(missing[0], f"missing; a tourist needs {list(REQUIRED_FIELDS)}")
    tid = _id(given["tourist"]) if "tourist" in given else None
    if "region" in given and (not isinstance(given["region"], str) or given["region"] != region.id):
        raise _error("region", f"{describe(given['region'])} is not this tourist's region "
                     f"{region.id}")
    if "kind" in given and not isinstance(given["kind"], str):
        raise _error("kind", f"expected a string, got {describe(given['kind'])}")
    start = _start(given["start"], region) if "start" in given else region.start_xy
    t_start = _time(given["t_start"], "t_start", region) if "t_start" in given else region.t_start
    t_end = _time(given["t_end"], "t_end", region) if "t_end" in given else region.t_end
    if t_end <= t_start:
        raise _error("t_end", f"{t_end:g} is not after t_start {t_start:g}")
    scores = (_scores(given["scores"], region) if "scores" in given
              else region.score[1:-1].astype(np.float64))
    return TouristInput(tid, start, t_start, t_end, scores)


def tourist_batch(region: Region, items: Sequence[TouristInput], kind: str) -> TouristBatch:
    """Validated tourists -> :class:`TouristBatch` (ids: the given ones, else positions)."""
    if not items:
        raise _error("tourists", "no tourist given")
    scores = np.pad(np.array([item.scores for item in items], np.float64), ((0, 0), (1, 1)))
    tourists = Tourists(
        region_id=region.id, tourist_id=np.arange(len(items), dtype=np.int64), kind=kind,
        start_xy=np.array([item.start_xy for item in items], dtype=np.float64),
        t_start=np.array([item.t_start for item in items], dtype=np.float64),
        t_end=np.array([item.t_end for item in items], dtype=np.float64), scores=scores)
    ids = [i if item.id is None else item.id for i, item in enumerate(items)]
    return TouristBatch(ids, tourists)


def read_tourists(records: Any, region: Region, *, defaults: bool = False,
                  kind: str = "generated") -> TouristBatch:
    """Read a list of tourist dicts with :func:`read_tourist`; errors start with ``tourist i``."""
    if not isinstance(records, (list, tuple)):
        raise _error("tourists", f"expected a list of objects, got {describe(records)}")
    items = []
    for i, rec in enumerate(records):
        try:
            items.append(read_tourist(rec, region, defaults=defaults))
        except TouristError as exc:
            tid = rec.get("tourist") if isinstance(rec, Mapping) else None
            label = f" ({tid!r})" if isinstance(tid, (str, int)) and exc.field != "tourist" else ""
            raise TouristError(exc.field, f"tourist {i}{label}: {exc.message}", i) from None
    return tourist_batch(region, items, kind)
