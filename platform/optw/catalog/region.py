"""In-memory region and tourist objects shared by every later stage.

Conventions (the paper's, and ``shared/spec/published-checkpoints.md``):

- Node order: index 0 is the start, 1..n_points the points of interest in file order, and the
  last index ``n_nodes - 1`` the end, a copy of the start ("reach v_n" is uniform).
- Travel time is the Euclidean distance rounded DOWN to ``decimals`` decimals (1 for Solomon,
  2 for Cordeau and Gavalas). Rounded distances are whole hundredths, so times can be kept
  exact as integers in units of 0.01 (:data:`TIME_UNITS_PER_MINUTE`).
- ``opening``/``closing`` are the earliest and the LATEST START of a visit.
- A tourist changes the start (= end) location, the start and end times and the scores; the
  region's coordinates, durations and time windows stay fixed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

GROUPS = ("solomon", "cordeau", "gavalas")

#: The paper's subset of 28 regions used for most of its analysis.
PAPER_SUBSET = (
    "c101 c102 r101 r102 rc101 rc102 c201 c202 r201 r202 rc201 rc202 "
    "pr01 pr02 pr03 pr04 pr11 pr12 pr13 pr14 "
    "t101 t105 t114 t117 t201 t202 t203 t204"
).split()

#: Default score distribution of generated tourists per group (the paper's choice).
DEFAULT_SCORE_KIND = {"solomon": "uniform", "cordeau": "uniform", "gavalas": "correlated"}

#: Generated start locations are uniform on this square (per group).
START_BOX = {"solomon": (0.0, 100.0), "cordeau": (-100.0, 100.0), "gavalas": (0.0, 100.0)}

#: Exact time arithmetic: every rounded distance is a whole number of hundredths.
TIME_UNITS_PER_MINUTE = 100

_EPS = 1e-7  # guards floor() against sqrt results a hair below an exact decimal


def to_time_units(values: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """Times in minutes -> exact int64 time units (:data:`TIME_UNITS_PER_MINUTE` per minute)."""
    return np.rint(np.asarray(values, dtype=np.float64) * TIME_UNITS_PER_MINUTE).astype(np.int64)


def round_down(values: np.ndarray, decimals: int) -> np.ndarray:
    """Round non-negative values DOWN to ``decimals`` decimals (robust to float noise)."""
    scale = 10.0**decimals
    return np.floor(np.asarray(values, dtype=np.float64) * scale + _EPS) / scale


def distance_matrix(xy: np.ndarray, decimals: int) -> np.ndarray:
    """Rounded-down Euclidean distances between points ``xy[..., n, 2]`` -> ``[..., n, n]``."""
    xy = np.asarray(xy, dtype=np.float64)
    diff = xy[..., :, None, :] - xy[..., None, :, :]
    return round_down(np.sqrt((diff**2).sum(-1)), decimals)


@dataclass(frozen=True, eq=False)
class Region:
    """A fixed set of points of interest, with the benchmark tourist's start and times.

    Arrays are indexed by node (``n_nodes = n_points + 2``); the start and end nodes carry the
    benchmark tourist's location, opening ``t_start``, closing ``t_end``, duration 0, score 0.
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
    _dist_cache: dict = field(default_factory=dict, repr=False, compare=False)

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
        """Day length: max(T_end, max closing) (the paper's T_day^b)."""
        return float(max(self.t_end, self.closing.max()))

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
        return DEFAULT_SCORE_KIND[self.group]

    def coordinates(self, start_xy: np.ndarray | None = None) -> np.ndarray:
        """Node coordinates ``[n, 2]``, or ``[K, n, 2]`` with start/end at ``start_xy[K, 2]``."""
        xy = np.stack([self.x, self.y], axis=-1).astype(np.float64)
        if start_xy is None:
            return xy
        start_xy = np.asarray(start_xy, dtype=np.float64).reshape(-1, 2)
        out = np.broadcast_to(xy, (start_xy.shape[0], *xy.shape)).copy()
        out[:, 0] = start_xy
        out[:, -1] = start_xy
        return out

    def distances(self, start_xy: np.ndarray | None = None, f32: bool = False) -> np.ndarray:
        """Rounded travel times ``[n, n]`` (benchmark start) or ``[K, n, n]`` per start location.

        Only the start and end rows/columns depend on the start location, so the point-to-point
        block is computed once per region and cached. ``f32``: compute those rows in float32 as
        ``floor(k·sqrt(dx² + dy²)) / k`` (k = 10^decimals), as the paper's generator does for
        its own tourists (:attr:`Tourists.start_rows_f32`).
        """
        if "base" not in self._dist_cache:
            self._dist_cache["base"] = distance_matrix(self.coordinates(), self.decimals)
        base = self._dist_cache["base"]
        if start_xy is None:
            return base.copy()
        start_xy = np.asarray(start_xy, dtype=np.float64).reshape(-1, 2)
        xy = self.coordinates()
        if f32:
            k = np.float32(10**self.decimals)
            diff = start_xy.astype(np.float32)[:, None, :] - xy.astype(np.float32)[None, :, :]
            units = np.floor(k * np.sqrt((diff**2).sum(-1, dtype=np.float32)))
            d = units.astype(np.float64) / 10**self.decimals
        else:
            d = round_down(
                np.sqrt(((start_xy[:, None, :] - xy[None, :, :]) ** 2).sum(-1)), self.decimals
            )  # [K, n] from the new start to every node
        d[:, 0] = 0.0
        d[:, -1] = 0.0
        out = np.broadcast_to(base, (start_xy.shape[0], *base.shape)).copy()
        out[:, 0, :] = d
        out[:, -1, :] = d
        out[:, :, 0] = d
        out[:, :, -1] = d
        return out

    def tensors(self, device: str = "cpu", dtype=None) -> dict:
        """The region as torch tensors (node arrays and benchmark distance matrix)."""
        import torch

        dtype = dtype or torch.float32
        arrays = {
            "x": self.x,
            "y": self.y,
            "duration": self.duration,
            "opening": self.opening,
            "closing": self.closing,
            "score": self.score,
            "distance": self.distances(),
        }
        return {k: torch.as_tensor(v, dtype=dtype, device=device) for k, v in arrays.items()}


@dataclass(frozen=True, eq=False)
class Tourists:
    """A batch of K tourists of one region (numpy arrays with leading dimension K).

    ``scores[K, n_nodes]`` includes the start and end nodes (score 0). ``kind`` is
    ``benchmark``, ``validation``, ``paper`` (the paper's own sets) or ``generated``.
    """

    region_id: str
    tourist_id: np.ndarray  # [K] int
    kind: str
    start_xy: np.ndarray  # [K, 2]
    t_start: np.ndarray  # [K]
    t_end: np.ndarray  # [K]
    scores: np.ndarray  # [K, n_nodes]
    #: travel times from the start computed in float32 (the paper's own sets, ``kind="paper"``)
    start_rows_f32: bool = False

    def __len__(self) -> int:
        return int(self.t_start.shape[0])

    def __getitem__(self, idx) -> Tourists:
        """Sub-batch by int, slice or index array (always a batch, never a scalar)."""
        if isinstance(idx, (int, np.integer)):
            idx = slice(int(idx), int(idx) + 1) if idx != -1 else slice(-1, None)
        return Tourists(
            region_id=self.region_id,
            tourist_id=self.tourist_id[idx],
            kind=self.kind,
            start_xy=self.start_xy[idx],
            t_start=self.t_start[idx],
            t_end=self.t_end[idx],
            scores=self.scores[idx],
            start_rows_f32=self.start_rows_f32,
        )

    def distances(self, region: Region) -> np.ndarray:
        """Travel times ``[K, n, n]`` of these tourists in ``region`` (:meth:`Region.distances`
        from each start, in float32 where :attr:`start_rows_f32`)."""
        return region.distances(self.start_xy, self.start_rows_f32)

    @staticmethod
    def concat(batches: list[Tourists]) -> Tourists:
        if not batches or len({b.region_id for b in batches}) != 1:
            raise ValueError("Tourists.concat needs a non-empty list of one region's tourists")
        kinds = {b.kind for b in batches}
        if len({b.start_rows_f32 for b in batches}) != 1:
            raise ValueError("Tourists.concat cannot mix float32 (paper) and float64 start rows")
        return Tourists(
            region_id=batches[0].region_id,
            tourist_id=np.concatenate([b.tourist_id for b in batches]),
            kind=kinds.pop() if len(kinds) == 1 else "mixed",
            start_xy=np.concatenate([b.start_xy for b in batches]),
            t_start=np.concatenate([b.t_start for b in batches]),
            t_end=np.concatenate([b.t_end for b in batches]),
            scores=np.concatenate([b.scores for b in batches]),
            start_rows_f32=batches[0].start_rows_f32,
        )

    def to_records(self) -> list[dict]:
        """One JSON-friendly dict per tourist (the tourist-file format of the CLI)."""
        return [
            {
                "region": self.region_id,
                "tourist": int(self.tourist_id[i]),
                "kind": self.kind,
                "start": [float(self.start_xy[i, 0]), float(self.start_xy[i, 1])],
                "t_start": float(self.t_start[i]),
                "t_end": float(self.t_end[i]),
                "scores": [float(s) for s in self.scores[i]],
            }
            for i in range(len(self))
        ]


def benchmark_tourist(region: Region) -> Tourists:
    """The region file's own tourist (tourist id 0)."""
    return Tourists(
        region_id=region.id,
        tourist_id=np.zeros(1, dtype=np.int64),
        kind="benchmark",
        start_xy=np.array([region.start_xy], dtype=np.float64),
        t_start=np.array([region.t_start], dtype=np.float64),
        t_end=np.array([region.t_end], dtype=np.float64),
        scores=region.score[None, :].astype(np.float64),
    )
