"""Evaluation statistics of the paper: gaps, bootstrap CIs, Wilcoxon tests, result tables
(imported lazily, so the CLI loads without pandas/scipy)."""

from __future__ import annotations

import importlib

_WHERE = {
    "ResultsError": "results", "validate_results": "results", "bootstrap_ci": "stats",
    "gap": "stats", "wilcoxon_greater": "stats", "evaluate": "tables",
    "load_best_known": "tables", "to_markdown": "tables", "write_tables": "tables",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(f"optw.evaluate.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'optw.evaluate' has no attribute {name!r}")
