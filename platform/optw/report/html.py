"""The report page: one self-contained HTML file (inline CSS, no scripts, no network) that
shows the PNG figures beside it and the job's tables."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from html import escape
from typing import Any

import pandas as pd

from optw.evaluate.tables import KIND_LABEL, KIND_ORDER
from optw.report.data import DemoUse, JobData
from optw.tracking.uri import sqlite_path

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;
margin:0;color:#1d232a;background:#fafbfc;line-height:1.45}
header{background:#23313f;color:#fff;padding:18px 32px}
header h1{margin:0 0 4px;font-size:1.5em}
header .meta{font-size:.9em;opacity:.85}
header .meta+.meta{margin-top:3px}
nav{padding:8px 32px;background:#e9eef3;font-size:.9em}
nav a{margin-right:14px;color:#23313f}
main{padding:8px 32px 40px;max-width:1500px}
section{margin-top:26px}
h2{border-bottom:2px solid #d5dde5;padding-bottom:4px;font-size:1.25em}
h3{font-size:1.05em;margin:18px 0 6px}
figure{margin:10px 0 18px;background:#fff;border:1px solid #e1e6eb;padding:8px;
display:inline-block;max-width:100%}
figure img{max-width:100%;height:auto;display:block}
table{border-collapse:collapse;font-size:.85em;background:#fff;margin:6px 0 14px}
th,td{border:1px solid #d5dde5;padding:3px 8px;text-align:right;white-space:nowrap}
th{background:#eef2f6;white-space:normal;vertical-align:bottom}
.scroll{overflow-x:auto;max-width:100%;margin:6px 0 14px}
.scroll table{margin:0}
td.l,th.l{text-align:left}
tr:nth-child(even) td{background:#f7f9fb}
code,pre{background:#eef2f6;padding:1px 4px;border-radius:3px;font-size:.9em}
pre{padding:8px;overflow-x:auto}
.note{color:#666;font-size:.9em}
.status-FINISHED{color:#1a7f37}.status-FAILED,.status-KILLED{color:#c62828}
.status-RUNNING{color:#b26a00}
details{margin:8px 0}
summary{cursor:pointer;font-weight:600}
"""


def _fmt(v: Any, digits: int = 2) -> str:
    if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, float):
        return f"{v:.2g}" if v != 0 and abs(v) < 10 ** -digits else f"{v:.{digits}f}"
    return str(v)


def _num(row: Mapping[str, Any] | pd.Series, col: str) -> float:
    try:
        return float(row.get(col, math.nan))
    except (TypeError, ValueError):
        return math.nan


def _with_ci(row: pd.Series, col: str, digits: int = 2) -> str:
    """``value [lo, hi]`` from columns ``col``, ``col_lo``, ``col_hi``."""
    v, lo, hi = _num(row, col), _num(row, f"{col}_lo"), _num(row, f"{col}_hi")
    if math.isnan(v):
        return "–"
    ci = "" if math.isnan(lo) or math.isnan(hi) else f" [{lo:.{digits}f}, {hi:.{digits}f}]"
    return f"{v:.{digits}f}{ci}"


def table(df: pd.DataFrame, left: tuple[str, ...] = (), raw: tuple[str, ...] = ()) -> str:
    """A DataFrame as an HTML table (``raw`` columns hold HTML; ``left`` ones left-aligned) in
    a box that scrolls sideways when the table is wider than the page."""
    head = "".join(f'<th class="{"l" if c in left else ""}">{escape(str(c))}</th>'
                   for c in df.columns)

    def cell(c: Any, v: Any) -> str:
        v = v.item() if hasattr(v, "item") and not isinstance(v, str) else v
        cls = ' class="l"' if c in left else ""
        return f"<td{cls}>{v if c in raw else escape(_fmt(v))}</td>"

    rows = ["<tr>" + "".join(cell(c, v) for c, v in zip(df.columns, rec, strict=True)) + "</tr>"
            for rec in df.itertuples(index=False, name=None)]
    return (f'<div class="scroll"><table><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table></div>")


def _details(summary: str, body: str) -> str:
    return f"<details><summary>{summary}</summary>{body}</details>"


def _section(anchor: str, title: str, note: str, *body: str) -> str:
    note = f'<p class="note">{note}</p>' if note else ""
    return "\n".join([f'<section id="{anchor}"><h2>{title}</h2>{note}', *body, "</section>"])


def summary_tables(summary: pd.DataFrame, groups: list[str]) -> str:
    """One table per group of the job's summary table (means, CIs, p-value against ILS)."""
    out = []
    for g in groups:
        rows = [{
            "method": r["method"], "tourists": KIND_LABEL.get(r["kind"], r["kind"]),
            "regions": r.get("regions"), "n tourists": r.get("tourists"),
            "best-known": _num(r, "best_known"), "ILS": _num(r, "ils"),
            "model": _num(r, "model"),
            "gap to ILS % [95% CI]": _with_ci(r, "gap_ils"),
            "gap to best-known % [95% CI]": _with_ci(r, "gap_bk"),
            "time s [95% CI]": _with_ci(r, "seconds", digits=4),
            "p (model > ILS)": _fmt(_num(r, "p_better_than_ils"), 3),
        } for _, r in summary[summary["group"].astype(str) == g].iterrows()]
        if rows:
            out.append(f"<h3>{escape(g)}</h3>" + table(pd.DataFrame(rows),
                                                        left=("method", "tourists")))
    return "\n".join(out)


def against_paper_section(regions: pd.DataFrame | None) -> str:
    """Ours beside the paper's columns: the group table, then the per-region ones folded."""
    from optw.evaluate import paper

    if regions is None or not regions["kind"].isin(paper.KINDS).any():
        return ('<p class="note">No results on the paper\'s tourists or the benchmark '
                "tourists.</p>")
    try:
        scores = paper.load_paper_scores()
    except (OSError, ValueError) as exc:
        return f'<p class="note">No paper tables to compare with: {escape(str(exc))}</p>'
    tables = paper.against_paper(paper.ours_from_regions(regions), scores)
    if tables["paper_groups"].empty:
        return ('<p class="note">No region and method of this job has a number in the '
                "paper's tables.</p>")
    parts = [table(paper.group_view(tables["paper_groups"]),
                   left=("tourists", "group", "ours", "paper column"))]
    for kind in paper.KINDS:
        if (tables["paper_regions"]["kind"] == kind).any():
            parts.append(_details(f"Per region, {escape(KIND_LABEL[kind])} tourists",
                                  table(paper.region_view(tables["paper_regions"], kind),
                                        left=("group", "region", "exact"))))
    return "\n".join(parts)


def _mlflow_links(data: JobData) -> str:
    """How to open the runs in MLflow: links for a server, the ``mlflow ui`` command else."""
    url = data.run_url(data.parent_run_id)
    exp = f"experiment {escape(data.experiment_name)}, id {escape(data.experiment_id)}"
    if url:
        return (f'<p>Parent run: <a href="{escape(url)}">{escape(data.parent_run_id)}</a> '
                f"({exp}) on <code>{escape(data.uri)}</code>.</p>")
    db = sqlite_path(data.uri)
    cmd = f"mlflow ui --backend-store-uri {data.uri} --port 5000"
    where = (f"the local store <code>{escape(str(db))}</code>" if db is not None
             else f"<code>{escape(data.uri)}</code>")
    return (f"<p>The runs are in {where}. Open them with</p><pre>{escape(cmd)}</pre>"
            f"<p class=\"note\">then http://127.0.0.1:5000/#/experiments/"
            f"{escape(data.experiment_id)}/runs/&lt;run id&gt;. Parent run: "
            f"<code>{escape(data.parent_run_id)}</code> ({exp}).</p>")


def runs_table(data: JobData) -> str:
    """Every child run (stage, model, group, what it started from, status, validation score,
    version, run id/link), folded: a long list that the page's figures should not follow."""
    rows = []
    for c in sorted(data.children, key=lambda c: (c.group, c.stage, c.key)):
        url = data.run_url(c.run_id)
        rid = (f'<a href="{escape(url)}">{escape(c.run_id)}</a>' if url
               else f"<code>{escape(c.run_id)}</code>")
        rows.append({"stage": c.stage, "model": c.key, "group": c.group,
                     "started from": c.started_from or "–",
                     "status": f'<span class="status-{escape(c.status)}">'
                               f"{escape(c.status)}</span>",
                     "val_score": _num(c.tags, "val_score"),
                     "version": c.tags.get("version", "") or "–", "run": rid})
    if not rows:
        return '<p class="note">No child runs.</p>'
    failed = sum(c.status in ("FAILED", "KILLED") for c in data.children)
    what = f"{len(rows)} child run{'s' if len(rows) > 1 else ''}" + (
        f', <span class="status-FAILED">{failed} failed</span>' if failed else "")
    return _details(what, table(pd.DataFrame(rows), raw=("status", "run"), left=(
        "stage", "model", "group", "started from", "status", "run")))


def _figure(src: str | None, alt: str) -> str:
    return (f'<figure><img src="{escape(src)}" alt="{escape(alt)}"></figure>' if src
            else f'<p class="note">{escape(alt)}: no data.</p>')


def _when(ms: int | None) -> str:
    return dt.datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S") if ms else "–"


_STAGE_RUNS = {"finetune": "fine-tuning", "global": "global-model", "scratch": "scratch"}


def demonstrations_line(uses: list[DemoUse]) -> str:
    """What the job learned from demonstrations (ILS routes), per stage; "" when nothing."""
    parts = []
    for u in uses:
        how = [f"{u.demos} per region"]
        if u.imitation_epochs:
            how.append(f"{u.imitation_epochs} imitation epoch"
                       f"{'s' if u.imitation_epochs > 1 else ''} before REINFORCE")
        if u.demo_tourists:
            how.append("REINFORCE tourists drawn from them")
        runs = f"{u.runs} {_STAGE_RUNS.get(u.stage, u.stage)} run{'s' if u.runs > 1 else ''}"
        parts.append(f"{runs}: {', '.join(how)}")
    return f"Learned from demonstrations (ILS routes): {'; '.join(parts)}" if parts else ""


def job_lines(data: JobData) -> list[str]:
    """The header's lines on the released global models and demonstrations the job used."""
    lines = []
    if releases := data.releases():
        lines.append(f"Started from released global model{'s' if len(releases) > 1 else ''}: "
                     + "; ".join(releases))
    if demos := demonstrations_line(data.demonstrations()):
        lines.append(demos)
    return lines


def _curves_section(figures: dict[str, str | None], groups: list[str], releases: list[str]) -> str:
    keys = [("curves_global", "learning curves of the global models"),
            *((f"curves_{g}", f"learning curves {g}") for g in groups)]
    shown = [_figure(figures[key], alt) for key, alt in keys if figures.get(key)]
    return _section(
        "curves", "Learning curves",
        "Per model, over epochs: the training reward (mean over the epoch's sampled routes, logged "
        "every few epochs) and, at each validation, the mean greedy score on the validation "
        "tourists, the benchmark tourist's greedy score and the gap to ILS on the validation "
        "tourists (negative: better than ILS). Models with fewer than two points are left out.",
        *(shown or ['<p class="note">No model logged a curve of two or more epochs'
                    + (" (the global models are releases, trained before this job: "
                       f"{escape('; '.join(releases))})" if releases else "") + ".</p>"]))


def _finetune_section(figures: dict[str, str | None], points: pd.DataFrame | None) -> str:
    """Fine-tuning: every region before and after; "" when the job fine-tuned nothing."""
    if points is None:
        return ""
    gap = len(points) > 0 and points["metric"].iloc[0] == "val_gap_ils"
    beam = gap and points[["evaluated_before", "evaluated"]].notna().all(axis=1).any()
    if not figures.get("finetune"):
        body = ['<p class="note">No fine-tuning run logged a validation before its first '
                "epoch and after it.</p>"]
    else:
        what = "gap to ILS %" if gap else "mean score"
        columns = {"region": "region", "group": "group", "start": "started from",
                   "val_tourists": "greedy: tourists", "before": f"greedy: {what} before",
                   "after": f"greedy: {what} after", "after_epoch": "after epoch",
                   "eval_tourists": "beam: tourists", "evaluated_before": "beam: gap % before",
                   "evaluated": "beam: gap % after"}
        if not gap:
            columns = {k: v for k, v in columns.items() if not v.startswith("beam")}
        elif not beam:
            del columns["evaluated_before"]
        shown = points[list(columns)].rename(columns=columns)
        if "beam: tourists" in shown.columns:
            shown["beam: tourists"] = shown["beam: tourists"].astype("Int64")
        body = [_figure(figures["finetune"], "fine-tuning before and after"),
                _details("Per region", table(shown, left=("region", "group", "started from")))]
    return _section(
        "finetune", "Fine-tuning: before and after",
        "Each fine-tuned region, before (ring: the model it starts from, validated by the "
        "fine-tuning run before its first epoch) and after (dot: the fine-tuned model's last "
        "validation), both greedy decoding of the same first validation tourists, as the gap "
        "to ILS on them (negative: better than ILS); a dot inside its ring: no change. "
        + ("Diamonds: the job's beam evaluations of the start model and of the fine-tuned "
           "model, on the same evaluation tourists." if beam else
           "The job did not evaluate the start model, so its beam evaluation of the fine-tuned "
           "model (more tourists, another decoder: not comparable with the greedy values) has no "
           "'before' to compare with; it is in the table and in the gaps per region below."), *body)


def time_note(points: pd.DataFrame) -> str:
    """The time/score section's note: what its points are (active search only when made)."""
    settings = set(points["setting"]) if len(points) else set()
    shown = {"beam widths from the job's beam sweep on each region's benchmark tourist":
             any(str(x).startswith("beams=") for x in settings),
             "active search (★) from the evaluation rows": "active search" in settings,
             "ILS (×) from the job's ILS results": "ILS" in set(points.get("method", ()))}
    if not (text := ", ".join(part for part, show in shown.items() if show)):
        return ""
    return f"{text[0].upper()}{text[1:]}; means over the group's regions."


def render(data: JobData, figures: dict[str, str | None], groups: list[str],
           time_points: pd.DataFrame, finetune: pd.DataFrame | None) -> str:
    """The whole page of the figures (id -> file or ``None``) and the points' tables."""
    t = data.tags
    title = f"optw job report: {data.job_name}"
    lines = "".join(f'<div class="meta">{escape(x)}</div>' for x in job_lines(data))
    meta = " · ".join(escape(x) for x in [
        f"mode {t.get('mode', '?')}", f"profile {t.get('profile', '?')}",
        f"config {t.get('config_hash', '?')}", f"catalog v{t.get('catalog_version', '?')}",
        f"status {data.status}", f"started {_when(data.start_time)}",
        f"ended {_when(data.end_time)}", f"{len(data.children)} model(s)"])
    nav = [("curves", "Learning curves"), ("finetune", "Fine-tuning"),
           ("gaps", "Gaps per region"), ("time", "Time vs score"), ("tables", "Group tables"),
           ("paper", "Against the paper"), ("runs", "MLflow runs")]
    if finetune is None:
        nav.remove(("finetune", "Fine-tuning"))
    regions = data.tables.get("regions")
    gaps = []
    for kind in KIND_ORDER:  # the paper's tourists only for a job evaluated on them
        if kind != "paper" or f"gaps_{kind}" in figures:
            gaps += [f"<h3>{KIND_LABEL[kind]} tourists</h3>",
                     _figure(figures.get(f"gaps_{kind}"), f"gaps {KIND_LABEL[kind]}")]
    if regions is not None and regions.get("best_known", pd.Series(dtype=float)).isna().all():
        gaps.append('<p class="note">No best-known scores (no reference file when the job '
                    "ran): gaps to best-known are left out.</p>")
    timing = [_figure(figures.get("time_score"), "time vs score")]
    if len(time_points):
        timing.append(_details("Points", table(time_points.drop(columns=["order"], errors="ignore"),
                                               left=("group", "method", "setting"))))
    summary, pvalues = data.tables.get("summary"), data.tables.get("pvalues")
    tables = [summary_tables(summary, groups) if summary is not None and len(summary) else
              '<p class="note">No summary table (the job logged no evaluation).</p>']
    if regions is not None and len(regions):
        tables.append(_details("Per-region table",
                               table(regions, left=("method", "kind", "group", "region"))))
    if pvalues is not None and len(pvalues):
        tables.append(_details("Pairwise p-values", table(pvalues, left=("kind", "from", "to"))))
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<link rel="icon" href="data:,">', f"<title>{escape(title)}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<header><h1>{escape(title)}</h1><div class=\"meta\">{meta}</div>{lines}</header>",
        "<nav>" + "".join(f'<a href="#{a}">{text}</a>' for a, text in nav) + "</nav><main>",
        _curves_section(figures, groups, data.releases()),
        _finetune_section(figures, finetune),
        _section("gaps", "Gaps per region",
                 "Gap = (reference − model) / reference × 100 on the mean score over a "
                 "region's tourists; generated = the catalog's validation tourists; paper = "
                 "the paper's own generated tourists.", *gaps),
        _section("time", "Score against inference time", time_note(time_points), *timing),
        _section("tables", "Group tables",
                 "Means over regions; 95% bootstrap confidence intervals over regions; p: "
                 "one-sided Wilcoxon signed-rank test (model > ILS).", *tables),
        _section("paper", "Against the paper",
                 "Ours beside the paper's columns of the same name: the paper's own tourists "
                 "against its generated-instance table, the benchmark tourist against its "
                 "benchmark table; diff = (ours − paper) / paper × 100 (positive: ours "
                 "higher); 'not exact': regions whose paper set is the CPU approximation.",
                 against_paper_section(regions)),
        _section("runs", "MLflow runs", "", _mlflow_links(data), runs_table(data)),
        "</main></body></html>"])
