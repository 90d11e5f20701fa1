"""Baselines: the ILS heuristic of Vansteenwegen et al. (2009) and its stored results
(imported lazily, so the CLI loads without numba/pandas)."""

from __future__ import annotations

import importlib

_EXPORTS = {
    "optw.baselines.ils": ("ILS_VERSION", "MAX_ITER_NO_IMPROVE", "IlsProblem", "IlsResult",
                           "RouteState", "solve_ils", "solve_ils_batch", "solve_problem"),
    "optw.baselines.store": ("IlsRun", "ils_store_path", "load_ils_results",
                             "run_ils_baseline", "write_ils_results"),
}
_WHERE = {name: mod for mod, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'optw.baselines' has no attribute {name!r}")
