"""Named preference profiles: one score per point of interest of a region."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from optw.catalog import Region
from optw.checks import echoed
from optw.serve.errors import PlanError

DEFAULT_PREFERENCE = "balanced"


def _by_duration(region: Region, longer: bool) -> np.ndarray:
    d = region.duration[1:-1].astype(np.float64)
    hi = region.s_max_benchmark
    if d.max() <= d.min():
        return np.ones_like(d)
    rel = (d - d.min()) / (d.max() - d.min())
    return np.clip(hi * (rel if longer else 1.0 - rel), 1.0, hi)


#: Named preference profiles: region -> one score per point of interest (all >= 0).
PREFERENCES: dict[str, tuple[str, Callable[[Region], np.ndarray]]] = {
    "balanced": ("the benchmark's own scores of the points",
                 lambda r: r.score[1:-1].astype(np.float64)),
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
        raise PlanError(422, "preference", f"preference: unknown profile {echoed(name)!r}; known: "
                        f"{', '.join(PREFERENCES)}")
    return PREFERENCES[name][1](region)
