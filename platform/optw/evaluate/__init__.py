"""Evaluation statistics of the paper: gaps, bootstrap CIs, Wilcoxon tests, result tables.

Names are imported lazily, so the CLI (``optw.evaluate.cli``) loads without pandas/scipy.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "optw.evaluate.paper": (
        "against_paper", "load_paper_scores", "ours_from_regions", "ours_from_results",
        "render_against_paper",
    ),
    "optw.evaluate.protocol": (
        "EvaluateSettings", "evaluate_model", "gap_to_ils", "ils_validation_means",
        "validation_score",
    ),
    "optw.evaluate.results": (
        "REQUIRED", "ResultsError", "load_results", "read_table", "validate_results",
    ),
    "optw.evaluate.stats": ("bootstrap_ci", "gap", "wilcoxon_greater"),
    "optw.evaluate.tables": (
        "default_reference_path", "evaluate", "load_best_known", "pair_with_baseline",
        "paper_regions", "paper_summary", "pvalue_table", "region_table", "render_markdown",
        "summary_table", "to_markdown", "write_tables",
    ),
}
_WHERE = {name: mod for mod, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'optw.evaluate' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
