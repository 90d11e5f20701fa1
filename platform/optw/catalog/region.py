"""In-memory region and tourist objects shared by every later stage.

Node 0 is the start, 1..n_points the points of interest in file order, the last node the end (a
copy of the start). Travel time is the Euclidean distance rounded DOWN to ``decimals`` decimals,
kept exact as integer time units. ``opening``/``closing`` are the earliest and the LATEST START
of a visit. A tourist changes the start (= end) location, the start and end times and the
scores. Custom regions keep this shape (``x``/``y`` in minutes, times in minutes since midnight).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np
import numpy.typing as npt

from optw.errors import UserError

#: The benchmark groups; custom regions carry any other group name (:data:`CUSTOM_GROUP`).
GROUPS = ("solomon", "cordeau", "gavalas")
CUSTOM_GROUP = "custom"

#: The paper's subset of 28 regions used for most of its analysis.
PAPER_SUBSET = (
    "c101 c102 r101 r102 rc101 rc102 c201 c202 r201 r202 rc201 rc202 "
    "pr01 pr02 pr03 pr04 pr11 pr12 pr13 pr14 "
    "t101 t105 t114 t117 t201 t202 t203 t204"
).split()

#: Score distribution of generated tourists per group (custom groups: CUSTOM_SCORE_KIND).
DEFAULT_SCORE_KIND = {"solomon": "uniform", "cordeau": "uniform", "gavalas": "correlated"}
CUSTOM_SCORE_KIND = "around_default"

#: Generated start locations are uniform on this square (per group).
START_BOX = {"solomon": (0.0, 100.0), "cordeau": (-100.0, 100.0), "gavalas": (0.0, 100.0)}

#: Exact time arithmetic: every rounded distance is a whole number of hundredths.
TIME_UNITS_PER_MINUTE = 100

_EPS = 1e-7  # guards floor() against sqrt results a hair below an exact decimal
#: :meth:`Region.distances` warns when its result would take more than this.
DISTANCES_WARN_BYTES = 512 * 2**20
#: Custom regions' times are minutes since midnight: their day is at least this long.
MINUTES_PER_DAY = 1440.0
EARTH_RADIUS_KM = 6371.0088
#: A start closer than this (minutes, planar) to a node uses that node's matrix row.
MATRIX_MATCH_TOL = 1e-6
#: Largest |time| in minutes that :func:`to_time_units` converts (far inside int64).
MAX_TIME_MINUTES = 1e12


def haversine_km(lat1, lon1, lat2, lon2) -> np.ndarray:
    """Great-circle distance in km between points given in degrees (broadcasting)."""
    p1, p2 = np.radians(lat1), np.radians(lat2)
    dlon = np.radians(np.asarray(lon2, dtype=np.float64) - np.asarray(lon1, dtype=np.float64))
    h = np.sin((p2 - p1) / 2) ** 2 + np.cos(p1) * np.cos(p2) * np.sin(dlon / 2) ** 2
    return 2.0 * EARTH_RADIUS_KM * np.arcsin(np.sqrt(np.clip(h, 0.0, 1.0)))


def to_time_units(values: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """Times in minutes -> exact int64 time units; :class:`~optw.errors.UserError` for a time
    that is not finite or beyond :data:`MAX_TIME_MINUTES` (which int64 would wrap)."""
    arr = np.asarray(values, dtype=np.float64)
    if not (ok := np.abs(arr) <= MAX_TIME_MINUTES).all():  # NaN fails too
        raise UserError(f"time {arr[~ok].flat[0]!r} minutes is not finite or beyond "
                        f"±{MAX_TIME_MINUTES:g} (a travel time, opening, closing or visit of the "
                        "region or tourist)")
    return np.rint(arr * TIME_UNITS_PER_MINUTE).astype(np.int64)


def round_down(values: np.ndarray, decimals: int) -> np.ndarray:
    """Round non-negative values DOWN to ``decimals`` decimals (robust to float noise)."""
    scale = 10.0**decimals
    return np.floor(np.asarray(values, dtype=np.float64) * scale + _EPS) / scale


@dataclass(frozen=True, eq=False)
class Region:
    """A fixed set of points of interest, with the benchmark tourist's start and times.

    Arrays are indexed by node; the start and end nodes carry the benchmark tourist's location,
    opening ``t_start``, closing ``t_end``, duration 0, score 0. Custom regions also set the
    fields after ``source_hash``: ``metric`` ``"haversine"`` is great-circle, ``origin`` the
    centre of the projection to ``x``/``y``, ``travel`` ``[n, n]`` matrix minutes (NaN: none).
    """

    id: str
    group: str
    x: np.ndarray
    y: np.ndarray
    duration: np.ndarray
    opening: np.ndarray
    closing: np.ndarray
    score: np.ndarray  # the benchmark tourist's scores
    t_start: float
    t_end: float
    decimals: int
    source_file: str = ""
    source_hash: str = ""
    names: tuple[str, ...] | None = None
    start_name: str | None = None
    coords: str = "xy"
    lat: np.ndarray | None = None
    lon: np.ndarray | None = None
    metric: str = "euclidean"
    speed_kmh: float | None = None
    origin: tuple[float, float] | None = None
    travel: np.ndarray | None = field(default=None, repr=False)

    def __post_init__(self) -> None:  # JSON round trips (a model's region.json) give lists
        if self.names is not None and not isinstance(self.names, tuple):
            object.__setattr__(self, "names", tuple(str(n) for n in self.names))
        if self.origin is not None and not isinstance(self.origin, tuple):
            object.__setattr__(self, "origin", tuple(float(v) for v in self.origin))

    @property
    def n_nodes(self) -> int:
        return int(self.x.shape[0])

    @property
    def n_points(self) -> int:
        return self.n_nodes - 2

    @property
    def start_xy(self) -> tuple[float, float]:
        return float(self.x[0]), float(self.y[0])

    @property
    def t_day(self) -> float:
        """Day length: max(T_end, max closing) (the paper's T_day^b); for custom regions at
        least :data:`MINUTES_PER_DAY`, so the generator's 24-"hour" day is the clock's."""
        day = float(max(self.t_end, self.closing.max()))
        return max(day, MINUTES_PER_DAY) if self.is_custom else day

    @property
    def t_max(self) -> float:
        """Time normaliser: max(T_day, T_end + floor(T_day*4/24)) (published checkpoints)."""
        return float(max(self.t_day, self.t_end + np.floor(self.t_day * 4 / 24)))

    @property
    def s_max_benchmark(self) -> float:
        """Largest benchmark score S_max^b."""
        return float(self.score.max())

    @property
    def s_max(self) -> float:
        """Score normaliser round(1.1 * S_max^b), an upper bound of generated scores."""
        return float(round(1.1 * self.s_max_benchmark))

    @property
    def max_duration(self) -> float:
        return float(self.duration.max())

    @property
    def default_score_kind(self) -> str:
        return DEFAULT_SCORE_KIND.get(self.group, CUSTOM_SCORE_KIND)

    @property
    def is_custom(self) -> bool:
        """A region added with ``optw catalog add`` (not a benchmark group)."""
        return self.group not in GROUPS

    @property
    def start_box(self) -> tuple[tuple[float, float], tuple[float, float]]:
        """``(x_lo, x_hi), (y_lo, y_hi)`` of generated start locations."""
        if self.group in START_BOX:
            lo, hi = START_BOX[self.group]
            return (lo, hi), (lo, hi)
        return ((float(self.x.min()), float(self.x.max())),
                (float(self.y.min()), float(self.y.max())))

    def _projection(self) -> tuple[float, float, float]:
        """Minutes of travel per radian and the ``origin`` (lat, lon) of a lat/lon region."""
        if self.coords != "latlon" or self.origin is None or not self.speed_kmh:
            raise UserError(f"region {self.id} has planar x/y coordinates, not lat/lon")
        return EARTH_RADIUS_KM * 60.0 / float(self.speed_kmh), *self.origin

    def to_xy(self, lat, lon):
        """Planar ``(x, y)`` in minutes of travel (east, north of ``origin``) of ``lat``/``lon``
        in degrees (floats or arrays); a UserError for xy regions."""
        k, lat0, lon0 = self._projection()
        dlon = (np.asarray(lon, dtype=np.float64) - lon0 + 180.0) % 360.0 - 180.0
        x = k * np.cos(np.radians(lat0)) * np.radians(dlon)
        y = k * np.radians(np.asarray(lat, dtype=np.float64) - lat0)
        return (float(x), float(y)) if np.ndim(x) == 0 else (x, y)

    def to_latlon(self, x, y):
        """``(lat, lon)`` in degrees of planar ``x``/``y`` (inverse of :meth:`to_xy`)."""
        k, lat0, lon0 = self._projection()
        lat = lat0 + np.degrees(np.asarray(y, dtype=np.float64) / k)
        lon = lon0 + np.degrees(np.asarray(x, dtype=np.float64) / (k * np.cos(np.radians(lat0))))
        lon = (lon + 180.0) % 360.0 - 180.0
        return (float(lat), float(lon)) if np.ndim(lat) == 0 else (lat, lon)

    def coordinates(self, start_xy: np.ndarray | None = None) -> np.ndarray:
        """Node coordinates ``[n, 2]``, or ``[K, n, 2]`` with start/end at ``start_xy[K, 2]``."""
        xy = np.stack([self.x, self.y], axis=-1).astype(np.float64)
        if start_xy is None:
            return xy
        start_xy = np.asarray(start_xy, dtype=np.float64).reshape(-1, 2)
        out = np.broadcast_to(xy, (start_xy.shape[0], *xy.shape)).copy()
        out[:, 0] = out[:, -1] = start_xy
        return out

    def distances(self, start_xy: np.ndarray | None = None, f32: bool = False) -> np.ndarray:
        """Rounded travel times ``[n, n]`` (benchmark start) or ``[K, n, n]`` per start location;
        ``f32``: start rows as :func:`float32_start_rows` (Euclidean regions only). Past
        :data:`DISTANCES_WARN_BYTES` a ``RuntimeWarning`` points to :meth:`iter_distances`."""
        custom = self.metric != "euclidean" or self.travel is not None
        block = self._block
        if start_xy is None and not custom:
            return block.copy()
        start = np.asarray(self.start_xy if start_xy is None else start_xy,
                           dtype=np.float64).reshape(-1, 2)
        size = 8 * len(start) * self.n_nodes**2
        if start_xy is not None and size > DISTANCES_WARN_BYTES:
            warnings.warn(f"region {self.id}: travel times of {len(start)} tourists take "
                          f"{size / 2**20:.0f} MiB (8·K·n² bytes); Region.iter_distances "
                          "gives them in chunks", RuntimeWarning, stacklevel=2)
        if f32 and not custom:
            d_from = d_to = float32_start_rows(start, self.coordinates(), self.decimals)
        else:
            d_from, d_to = self._start_rows(start)
        d_from[:, [0, -1]] = d_to[:, [0, -1]] = 0.0
        out = np.broadcast_to(block, (start.shape[0], *block.shape)).copy()
        out[:, 0, :] = out[:, -1, :] = d_from  # start -> node
        out[:, :, 0] = out[:, :, -1] = d_to  # node -> start (= end)
        return out[0] if start_xy is None else out

    def iter_distances(self, start_xy: np.ndarray, chunk: int = 1024, f32: bool = False):
        """:meth:`distances` of ``start_xy[K, 2]`` in chunks: yields ``(slice, [k, n, n])``
        with ``k <= chunk`` tourists each, so memory stays ``8·chunk·n²`` bytes."""
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk}")
        start_xy = np.asarray(start_xy, dtype=np.float64).reshape(-1, 2)
        for lo in range(0, len(start_xy), chunk):
            part = slice(lo, min(lo + chunk, len(start_xy)))
            yield part, self.distances(start_xy[part], f32)

    def _raw_minutes(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Unrounded minutes between points ``[..., 2]`` (lat/lon for haversine, else x/y)."""
        if self.metric == "haversine":
            km = haversine_km(a[..., 0], a[..., 1], b[..., 0], b[..., 1])
            return km * 60.0 / float(self.speed_kmh)
        return np.sqrt(((a - b) ** 2).sum(-1))

    @cached_property
    def _block(self) -> np.ndarray:
        """Node-to-node times (computed once): the metric, the matrix where it has a value."""
        pts = np.stack([self.lat, self.lon], -1) if self.metric == "haversine" \
            else self.coordinates()
        block = round_down(self._raw_minutes(pts[:, None], pts[None, :]), self.decimals)
        if self.travel is not None:
            block = np.where(np.isnan(self.travel), block, np.nan_to_num(self.travel))
        np.fill_diagonal(block, 0.0)
        return block

    def _start_rows(self, start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Times ``[K, n]`` from and to each start: the metric; with a matrix, a start within
        :data:`MATRIX_MATCH_TOL` of a node takes that node's matrix row and column."""
        xy = self.coordinates()
        near = np.sqrt(((start[:, None, :] - xy[None, :-1, :]) ** 2).sum(-1)) <= MATRIX_MATCH_TOL
        pts, nodes = start, xy
        if self.metric == "haversine":
            slat, slon = self.to_latlon(start[:, 0], start[:, 1])
            at = near.any(axis=1)  # a start on a node: that node's exact lat/lon
            first = near.argmax(axis=1)[at]
            slat[at], slon[at] = self.lat[first], self.lon[first]
            pts, nodes = np.stack([slat, slon], -1), np.stack([self.lat, self.lon], -1)
        d_from = round_down(self._raw_minutes(pts[:, None], nodes[None]), self.decimals)
        d_to = d_from.copy()
        if self.travel is not None:
            for k in np.flatnonzero(near.any(axis=1)):
                for m in np.flatnonzero(near[k]):
                    row, col = self.travel[m], self.travel[:, m]
                    if np.isnan(np.delete(row, m)).all():
                        continue  # no matrix row for this node: keep the metric
                    d_from[k] = np.where(np.isnan(row), d_from[k], row)
                    d_to[k] = np.where(np.isnan(col), d_to[k], col)
                    break
        return d_from, d_to


_TOURIST_ARRAYS = ("tourist_id", "start_xy", "t_start", "t_end", "scores")


@dataclass(frozen=True, eq=False)
class Tourists:
    """A batch of K tourists of one region (numpy arrays with leading dimension K); ``scores``
    include the start and end nodes (score 0)."""

    region_id: str
    tourist_id: np.ndarray  # [K] int
    kind: str
    start_xy: np.ndarray  # [K, 2]
    t_start: np.ndarray  # [K]
    t_end: np.ndarray  # [K]
    scores: np.ndarray  # [K, n_nodes]
    start_rows_f32: bool = False  # start rows in float32 (the paper's sets, ``kind="paper"``)

    def __len__(self) -> int:
        return int(self.t_start.shape[0])

    def __getitem__(self, idx) -> Tourists:
        """Sub-batch by int, slice or index array (always a batch, never a scalar)."""
        if isinstance(idx, (int, np.integer)):
            idx = slice(int(idx), int(idx) + 1) if idx != -1 else slice(-1, None)
        return replace(self, **{k: getattr(self, k)[idx] for k in _TOURIST_ARRAYS})

    def distances(self, region: Region) -> np.ndarray:
        """:meth:`Region.distances` ``[K, n, n]`` from these tourists' starts."""
        return region.distances(self.start_xy, self.start_rows_f32)

    @staticmethod
    def concat(batches: list[Tourists]) -> Tourists:
        if not batches or len({b.region_id for b in batches}) != 1:
            raise ValueError("Tourists.concat needs a non-empty list of one region's tourists")
        kinds = {b.kind for b in batches}
        if len({b.start_rows_f32 for b in batches}) != 1:
            raise ValueError("Tourists.concat cannot mix float32 (paper) and float64 start rows")
        return replace(batches[0], kind=kinds.pop() if len(kinds) == 1 else "mixed",
                       **{k: np.concatenate([getattr(b, k) for b in batches])
                          for k in _TOURIST_ARRAYS})

    def to_records(self) -> list[dict]:
        """One JSON-friendly dict per tourist (the tourist-file format of the CLI)."""
        return [{"region": self.region_id, "tourist": int(self.tourist_id[i]), "kind": self.kind,
                 "start": [float(self.start_xy[i, 0]), float(self.start_xy[i, 1])],
                 "t_start": float(self.t_start[i]), "t_end": float(self.t_end[i]),
                 "scores": [float(s) for s in self.scores[i]]}
                for i in range(len(self))]


def _f32(a: np.ndarray) -> np.ndarray:
    """``a`` rounded to the nearest float32 (ties to even) and held as float64."""
    return np.asarray(a, dtype=np.float64).astype(np.float32).astype(np.float64)


def float32_start_rows(start_xy: np.ndarray, xy: np.ndarray, decimals: int) -> np.ndarray:
    """Travel times ``[K, n]`` from each start to every node as the paper's generator computes
    them in float32: ``floor(k·sqrt(dx² + dy²)) / k`` with k = 10^decimals. Each operation is
    done in float64 and rounded to float32 on its own (exact, as 53 ≥ 2·24 + 2 bits): the IEEE
    float32 rows on every machine, whatever its float32 kernels, FMA contraction or threads."""
    a = _f32(np.asarray(start_xy, dtype=np.float64).reshape(-1, 2))[:, None, :]
    b = _f32(np.asarray(xy, dtype=np.float64))[None, :, :]
    diff = _f32(a - b)
    sq = _f32(diff * diff)
    total = _f32(sq[..., 0] + sq[..., 1])
    k = float(10**decimals)
    return np.floor(_f32(k * _f32(np.sqrt(total)))) / k


def benchmark_tourist(region: Region) -> Tourists:
    """The region file's own tourist (tourist id 0)."""
    return Tourists(region.id, np.zeros(1, dtype=np.int64), "benchmark",
                    np.array([region.start_xy], np.float64), np.array([region.t_start], np.float64),
                    np.array([region.t_end], np.float64), region.score[None, :].astype(np.float64))
