"""Write a job's report folder (``index.html`` + ``plots/*.png``) atomically, and log it."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from optw.evaluate.tables import KIND_ORDER
from optw.report.data import JobData, load_job
from optw.report.html import render
from optw.report.plots import (
    method_colors,
    region_gaps,
    slug,
    time_score,
    time_score_points,
    training_curves,
)

INDEX = "index.html"
PLOTS = "plots"
ARTIFACT_DIR = "report"
#: Written into every report folder: only a folder holding it (or an empty one, or one of
#: only ``index.html`` and ``plots/`` from before the marker) is ever replaced.
MARKER = ".optw-report"


class ReportDirError(ValueError):
    """The output path is a file, or a folder that is not a report: it is never replaced."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"{path} {reason}")
        self.path, self.reason = path, reason


def check_report_dir(out: str | Path) -> Path:
    """``out`` resolved, when a report may be written there: absent, an empty folder, or a
    report folder (:data:`MARKER`). Raises :class:`ReportDirError` for a file or a folder
    holding anything else (nothing is moved or deleted)."""
    out = Path(out).resolve()
    if not out.exists():
        if out.is_symlink():
            raise ReportDirError(out, "is a broken link; choose another folder")
        return out
    if not out.is_dir():
        raise ReportDirError(out, "is a file, not a folder; choose a new or a report folder")
    names = {p.name for p in out.iterdir()}
    if MARKER in names or names <= {INDEX, PLOTS}:
        return out
    shown = ", ".join(sorted(names)[:3]) + (", ..." if len(names) > 3 else "")
    raise ReportDirError(out, f"holds other files ({shown}) and is not a report folder; "
                         "choose a new or an empty folder (a report replaces its folder)")


def _figures(data: JobData, plots: Path, groups: list[str]) -> tuple[dict[str, str | None],
                                                                        object]:
    figures: dict[str, str | None] = {}

    def rel(path: Path | None) -> str | None:
        return f"{PLOTS}/{path.name}" if path is not None else None

    for g in groups:
        figures[f"curves_{g}"] = rel(training_curves(data.children, g,
                                                     plots / f"curves_{slug(g)}.png"))
    regions = data.tables.get("regions")
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
    return figures, points


def write_report(parent_run_id: str, out_dir: str | Path, uri: str | None = None) -> Path:
    """Write the report of the job whose parent run is ``parent_run_id`` into ``out_dir``
    (replaced as a whole: built in a temporary sibling folder and moved into place, so a
    failure leaves the old report, and a reader never sees a half-written one). Only a new
    or empty folder or a previous report is replaced: a file or a folder of other files is a
    :class:`ReportDirError` (:func:`check_report_dir`). Returns the path of ``index.html``."""
    out = check_report_dir(out_dir)
    data = load_job(parent_run_id, uri)
    out.parent.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:8]
    tmp = out.parent / f".{out.name}.tmp-{tag}"
    old = out.parent / f".{out.name}.old-{tag}"
    (tmp / PLOTS).mkdir(parents=True)
    try:
        groups = data.groups()
        figures, points = _figures(data, tmp / PLOTS, groups)
        page = render(data, figures, groups, points)
        (tmp / INDEX).write_text(page, encoding="utf-8")
        (tmp / MARKER).write_text(f"optw report of run {parent_run_id}\n", encoding="utf-8")
        check_report_dir(out)  # still a report folder (or none) after the build
        if out.exists():
            os.replace(out, old)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old.exists() and not out.exists():
            os.replace(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)
    return out / INDEX


def write_and_log_report(parent_run_id: str, out_dir: str | Path, uri: str | None) -> Path:
    """:func:`write_report`, then log the folder as artifact ``report/`` of the parent run
    (what the job calls at its end). Returns the path of ``index.html``."""
    from optw.tracking.uri import get_client

    index = write_report(parent_run_id, out_dir, uri)
    get_client(uri).log_artifacts(parent_run_id, str(index.parent), ARTIFACT_DIR)
    return index
