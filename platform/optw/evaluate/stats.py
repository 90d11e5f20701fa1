"""The paper's statistics: score gaps to a baseline (negative: the model is better), percentile
bootstrap CIs of the mean over regions and one-sided Wilcoxon signed-rank p-values."""

from __future__ import annotations

import warnings

import numpy as np

N_RESAMPLES = 10_000
CI_LEVEL = 0.95
SEED = 0


def gap(baseline, model) -> np.ndarray:
    """Score gap in percent, ``(baseline - model) / baseline * 100``; NaN where baseline is 0."""
    b, m = (np.asarray(v, dtype=np.float64) for v in (baseline, model))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b != 0, (b - m) / b * 100.0, np.nan)


def bootstrap_ci(values, n_resamples: int = N_RESAMPLES, level: float = CI_LEVEL,
                 seed: int | np.random.Generator | None = SEED) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean of ``values``; (nan, nan) for no values."""
    x = np.asarray(values, dtype=np.float64).ravel()
    if x.size == 0:
        return float("nan"), float("nan")
    if np.isnan(x).any():
        raise ValueError("bootstrap_ci got NaN values")
    rng = np.random.default_rng(seed)
    means = np.empty(n_resamples, dtype=np.float64)
    chunk = max(1, 2_000_000 // x.size)  # bounds memory for long inputs
    for lo in range(0, n_resamples, chunk):
        hi = min(n_resamples, lo + chunk)
        means[lo:hi] = x[rng.integers(0, x.size, size=(hi - lo, x.size))].mean(axis=1)
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def wilcoxon_greater(x, y) -> float:
    """One-sided Wilcoxon signed-rank p-value for H1: ``x`` > ``y`` (paired); 1 if all equal."""
    from scipy.stats import wilcoxon

    a, b = (np.asarray(v, dtype=np.float64).ravel() for v in (x, y))
    if a.shape != b.shape:
        raise ValueError(f"paired samples differ in length: {a.size} vs {b.size}")
    if a.size == 0:
        return float("nan")
    if not np.any(a - b):
        return 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(wilcoxon(a, b, alternative="greater").pvalue)
