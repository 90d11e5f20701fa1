"""Write a job's report folder (``index.html`` + ``plots/*.png``) atomically, and log it."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from optw.evaluate.tables import KIND_ORDER
from optw.outdir import check_out_dir, replace_dir
from optw.report import plots
from optw.report.data import JobData, load_job
from optw.report.html import render

INDEX = "index.html"
PLOTS = "plots"
ARTIFACT_DIR = "report"
#: The kind of a report folder (:mod:`optw.outdir`); :data:`LEGACY`: one from before markers.
OUT_KIND = "report"
LEGACY = frozenset({INDEX, PLOTS})


def _figures(data: JobData, folder: Path, groups: list[str],
             ) -> tuple[dict[str, str | None], pd.DataFrame, pd.DataFrame | None]:
    """The figures (id -> file or None), the time/score and fine-tuning points (or None)."""
    figures: dict[str, str | None] = {}

    def png(fig: Figure | None, name: str) -> str | None:
        """``fig`` written as ``name`` in the plots folder, by its path in the report."""
        return None if plots.write_png(fig, folder / name) is None else f"{PLOTS}/{name}"

    # learning curves: the global models together, the models trained from scratch per group
    figures["curves_global"] = png(plots.learning_curves(
        [c for c in data.children if c.stage == "global"], "Learning curves of the global models"),
        "curves_global.png")
    for g in groups:
        scratch = [c for c in data.children if c.group == g and c.stage == "scratch"]
        figures[f"curves_{g}"] = png(plots.learning_curves(scratch, f"Learning curves: {g}"),
                                     f"curves_{plots.slug(g)}.png")
    regions = data.tables.get("regions", pd.DataFrame(
        columns=["region", "group", "kind", "method", "ils_seconds"]))
    ft = (plots.finetune_points(data.children, regions)
          if any(c.stage == "finetune" for c in data.children) else None)
    if ft is not None:
        figures["finetune"] = png(plots.finetune_figure(ft, groups), "finetune.png")
    colors = plots.method_colors(list(regions["method"]) + list(data.evaluation["method"]))
    for kind in KIND_ORDER:
        if (regions["kind"] == kind).any():
            figures[f"gaps_{kind}"] = png(plots.region_gaps_figure(regions, kind, groups, colors),
                                          f"gaps_{kind}.png")
    points = plots.ils_points(data, plots.time_score_points(data))
    figures["time_score"] = png(plots.time_score_figure(points, groups, colors), "time_score.png")
    return figures, points, ft


def write_report(parent_run_id: str, out_dir: str | Path, uri: str | None = None,
                 option: str | None = None) -> Path:
    """Write the report of ``parent_run_id``'s job as the folder ``out_dir``; returns its index."""
    out = check_out_dir(out_dir, OUT_KIND, LEGACY, option)  # before reading the store
    data = load_job(parent_run_id, uri)
    with replace_dir(out_dir, OUT_KIND, f"of run {parent_run_id}", LEGACY, option) as tmp:
        (tmp / PLOTS).mkdir()
        groups = data.groups()
        figures, points, ft = _figures(data, tmp / PLOTS, groups)
        (tmp / INDEX).write_text(render(data, figures, groups, points, ft), encoding="utf-8")
    return out / INDEX


def write_and_log_report(parent_run_id: str, out_dir: str | Path, uri: str | None) -> Path:
    """:func:`write_report`, then log the folder as the parent run's artifact ``report/``."""
    from optw.tracking.uri import get_client

    index = write_report(parent_run_id, out_dir, uri)
    get_client(uri).log_artifacts(parent_run_id, str(index.parent), ARTIFACT_DIR)
    return index
