"""Write a job's report folder (``index.html`` + ``plots/*.png``) atomically, and log it."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from optw.evaluate.tables import KIND_ORDER
from optw.outdir import OutDirError, check_out_dir, marker, replace_dir
from optw.report.data import JobData, load_job
from optw.report.html import render
from optw.report.plots import (
    finetune_chart,
    finetune_points,
    learning_curves,
    method_colors,
    region_gaps,
    slug,
    time_score,
    time_score_points,
)

INDEX = "index.html"
PLOTS = "plots"
ARTIFACT_DIR = "report"
#: The kind of a report folder (:mod:`optw.outdir`): only a folder holding its marker
#: (:data:`MARKER`), an empty one, or one of only ``index.html`` and ``plots/`` (a report
#: written before the marker, :data:`LEGACY`) is ever replaced.
OUT_KIND = "report"
MARKER = marker(OUT_KIND)
LEGACY = frozenset({INDEX, PLOTS})
#: The error of a folder a report may not replace.
ReportDirError = OutDirError


def check_report_dir(out: str | Path, option: str | None = None) -> Path:
    """``out`` resolved, when a report may be written there: absent, an empty folder, or a
    report folder. Raises :class:`~optw.outdir.OutDirError` for a file or a folder holding
    anything else (nothing is moved or deleted; ``option``, e.g. ``--out``, names it)."""
    return check_out_dir(out, OUT_KIND, LEGACY, option)


def _figures(data: JobData, plots: Path, groups: list[str],
             ) -> tuple[dict[str, str | None], pd.DataFrame, pd.DataFrame | None]:
    """The figures (id -> file beside the page, or None), the time/score points and the
    fine-tuning points (None: no fine-tuned model)."""
    figures: dict[str, str | None] = {}
    ft = None

    def rel(path: Path | None) -> str | None:
        return f"{PLOTS}/{path.name}" if path is not None else None

    # learning curves: the global models together; models trained from scratch per group
    starts = [c for c in data.children if c.stage == "global"]
    if starts:
        figures["curves_global"] = rel(learning_curves(
            starts, plots / "curves_global.png", "Learning curves of the global models"))
    for g in groups:
        scratch = [c for c in data.children if c.group == g and c.stage == "scratch"]
        if scratch:
            figures[f"curves_{g}"] = rel(learning_curves(
                scratch, plots / f"curves_{slug(g)}.png", f"Learning curves: {g}"))
    regions = data.tables.get("regions")
    finetuned = [c for c in data.children if c.stage == "finetune"]
    if finetuned:
        ft = finetune_points(finetuned, regions)
        figures["finetune"] = rel(finetune_chart(ft, groups, plots / "finetune.png"))
    methods = list(regions["method"]) if regions is not None and len(regions) else []
    if len(data.evaluation):
        methods += list(data.evaluation["method"])
    colors = method_colors(methods)
    for kind in KIND_ORDER:
        if regions is not None and len(regions) and (regions["kind"] == kind).any():
            figures[f"gaps_{kind}"] = rel(region_gaps(regions, kind, groups, colors,
                                                      plots / f"gaps_{kind}.png"))
    points = time_score_points(data)
    ils_seconds: dict[str, float] = {}
    if regions is not None and len(regions):
        bench = regions[regions["kind"] == "benchmark"].drop_duplicates("region")
        ils_seconds = bench.groupby("group")["ils_seconds"].mean().to_dict()
    figures["time_score"] = rel(time_score(points, groups, colors, ils_seconds,
                                           plots / "time_score.png"))
    return figures, points, ft


def write_report(parent_run_id: str, out_dir: str | Path, uri: str | None = None,
                 option: str | None = None) -> Path:
    """Write the report of the job whose parent run is ``parent_run_id`` into ``out_dir``,
    replaced as a whole (:func:`optw.outdir.replace_dir`: built in a hidden sibling folder and
    moved into place, so a failure leaves the old report, and a reader never sees a
    half-written one). Only a new or empty folder or a previous report is replaced: a file or
    a folder of other files is an :class:`~optw.outdir.OutDirError` (``option`` names it).
    Returns the path of ``index.html``."""
    out = check_report_dir(out_dir, option)
    data = load_job(parent_run_id, uri)
    with replace_dir(out_dir, OUT_KIND, f"of run {parent_run_id}", LEGACY, option) as tmp:
        (tmp / PLOTS).mkdir()
        groups = data.groups()
        figures, points, ft = _figures(data, tmp / PLOTS, groups)
        page = render(data, figures, groups, points, ft)
        (tmp / INDEX).write_text(page, encoding="utf-8")
    return out / INDEX


def write_and_log_report(parent_run_id: str, out_dir: str | Path, uri: str | None) -> Path:
    """:func:`write_report`, then log the folder as artifact ``report/`` of the parent run
    (what the job calls at its end). Returns the path of ``index.html``."""
    from optw.tracking.uri import get_client

    index = write_report(parent_run_id, out_dir, uri)
    get_client(uri).log_artifacts(parent_run_id, str(index.parent), ARTIFACT_DIR)
    return index
