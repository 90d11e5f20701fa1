"""The paper's tourist generator ("Generated Instances"), vectorised over tourists.

For a region with benchmark tourist (T_start^b, T_end^b, S_max^b) and day length T_day:

- start (= end) location uniform on [0,100]^2 (Solomon, Gavalas) or [-100,100]^2 (Cordeau);
  custom regions: uniform on the box of their nodes (:attr:`Region.start_box`);
- times on a 24-"hour" day (h = 24 / T_day):
  T_start ~ U(h·T_start^b − 4, min(15, h·T_end^b + 4)),
  T_end ~ U(max(12, T_start + 4), h·T_end^b + 4), both mapped back (÷ h) and rounded;
- scores ``uniform``: U(1, 1.1·S_max^b); ``correlated``: N(S_max^b·d_i/d_max, 10²) clipped to
  [1, 1.1·S_max^b]; ``around_default`` (custom regions): N(S_i, (0.2·S_max^b)²) around each
  point's default score S_i, clipped to [1, 1.1·S_max^b]; start and end score 0.

As in the paper, regions whose benchmark starts at 0 (Solomon, Cordeau) get negative start
times (the tourist waits for the openings).
"""

from __future__ import annotations

import zlib

import numpy as np

from optw.catalog.region import Region, Tourists

#: Seed of the fixed validation sets; each region's stream is keyed by (seed, crc32(region id)).
VALIDATION_SEED = 2925
VALIDATION_SIZE = 64
SCORE_KINDS = ("uniform", "correlated", "around_default")
CORRELATED_SCORE_STD = 10.0
#: ``around_default`` scores: standard deviation as a fraction of S_max^b.
AROUND_DEFAULT_STD = 0.2


def sample_scores(region: Region, k: int, rng: np.random.Generator, kind: str | None = None
                  ) -> np.ndarray:
    """K score vectors ``[K, n_nodes]`` (start and end 0) of the given kind."""
    kind = kind or region.default_score_kind
    if kind not in SCORE_KINDS:
        raise ValueError(f"unknown score kind {kind!r}; expected one of {SCORE_KINDS}")
    hi = 1.1 * region.s_max_benchmark
    n = region.n_points
    if kind == "uniform":
        return np.pad(rng.uniform(1.0, hi, size=(k, n)), ((0, 0), (1, 1)))
    if kind == "around_default":
        mean, std = region.score[1:-1], AROUND_DEFAULT_STD * region.s_max_benchmark
    else:
        d = region.duration[1:-1]
        mean = region.s_max_benchmark * d / d.max() if d.max() > 0 else np.zeros(n)
        std = CORRELATED_SCORE_STD
    return np.pad(np.clip(rng.normal(mean, std, size=(k, n)), 1.0, hi), ((0, 0), (1, 1)))


def sample_tourists(region: Region, k: int, rng: np.random.Generator | int | None = None,
                    score_kind: str | None = None, kind: str = "generated",
                    first_id: int = 0) -> Tourists:
    """K generated tourists of ``region`` (seeded, vectorised; thousands per second)."""
    if k < 0:
        raise ValueError(f"number of tourists must be >= 0, got {k}")
    rng = np.random.default_rng(rng)  # a Generator is returned as is
    (x_lo, x_hi), (y_lo, y_hi) = region.start_box
    start_xy = rng.uniform([x_lo, y_lo], [x_hi, y_hi], size=(k, 2))
    h = 24.0 / region.t_day
    ts_b, te_b = region.t_start * h, region.t_end * h
    ts = rng.uniform(ts_b - 4.0, min(15.0, te_b + 4.0), size=k)
    lb = np.maximum(12.0, ts + 4.0)
    te = rng.uniform(lb, np.maximum(lb, te_b + 4.0))
    scores = sample_scores(region, k, rng, score_kind)
    return Tourists(region.id, np.arange(first_id, first_id + k, dtype=np.int64), kind,
                    start_xy, np.round(ts / h), np.round(te / h), scores)


def validation_tourists(region: Region, k: int = VALIDATION_SIZE, seed: int = VALIDATION_SEED
                        ) -> Tourists:
    """The region's fixed validation set (ids 1..k; id 0 is the benchmark tourist)."""
    rng = np.random.default_rng([int(seed), zlib.crc32(region.id.encode())])
    return sample_tourists(region, k, rng, kind="validation", first_id=1)
