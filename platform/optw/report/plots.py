"""The report's figures as PNG files (matplotlib's Agg renderer, no pyplot state).

Each function writes one file and returns its path, or ``None`` when there is nothing to
plot (so the page never links to a missing image).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from optw.evaluate.tables import KIND_LABEL
from optw.report.data import ChildRun, JobData, group_of

DPI = 110
STAGE_ORDER = {"global": 0, "scratch": 1, "finetune": 2}
_PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2",
            "#17becf", "#bcbd22", "#7f7f7f")


def slug(text: str) -> str:
    """A file-name-safe version of ``text``."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "x"


def method_colors(methods: Sequence[str]) -> dict[str, str]:
    """One stable colour per method, in the order given."""
    return {m: _PALETTE[i % len(_PALETTE)] for i, m in enumerate(dict.fromkeys(methods))}


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=DPI, format="png", bbox_inches="tight")
    return path


# ----------------------------------------------------------------------------- training curves


def training_curves(children: list[ChildRun], group: str, path: Path) -> Path | None:
    """Small multiples, one panel per model of ``group``: greedy validation score (and the
    benchmark tourist's greedy score) over epochs."""
    runs = sorted((c for c in children if c.group == group and c.curves),
                  key=lambda c: (STAGE_ORDER.get(c.stage, 9), c.key))
    if not runs:
        return None
    ncols = min(4, len(runs))
    nrows = math.ceil(len(runs) / ncols)
    fig = Figure(figsize=(3.2 * ncols, 2.4 * nrows + 0.5), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    styles = {"val_score": dict(color="#1f77b4", marker="o", ms=3, lw=1.6,
                                label="validation score (greedy)"),
              "benchmark_score": dict(color="#d62728", ls="--", marker="s", ms=2.5, lw=1.1,
                                      label="benchmark tourist (greedy)")}
    for ax, run in zip(axes.flat, runs, strict=False):
        for metric, style in styles.items():
            df = run.curves.get(metric)
            if df is not None and len(df):
                ax.plot(df["step"], df["value"], **style)
        ax.set_title(run.label, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(runs):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("epoch", fontsize=8)
    handles, labels = [], []
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="outside lower center", ncols=2, fontsize=8, frameon=False)
    fig.suptitle(f"Training curves: {group}", fontsize=11)
    return _save(fig, path)


# ----------------------------------------------------------------------------- gaps per region


def region_gaps(regions: pd.DataFrame, kind: str, groups: list[str], colors: dict[str, str],
                path: Path) -> Path | None:
    """Dot plot per region (rows, grouped by group) of the gap to ILS and, where the reference
    has them, the gap to the best-known score, one marker per method."""
    sub = regions[regions["kind"] == kind]
    if sub.empty:
        return None
    order = [(g, r) for g in groups
             for r in sorted(sub.loc[sub["group"] == g, "region"].astype(str).unique())]
    if not order:
        return None
    ypos = {r: i for i, (_, r) in enumerate(order)}
    panels = [("gap_ils", "gap to ILS [%]")]
    if kind == "benchmark" and sub["gap_bk"].notna().any():
        panels.append(("gap_bk", "gap to best-known [%]"))
    height = max(2.6, 0.28 * len(order) + 1.4)
    fig = Figure(figsize=(4.6 * len(panels) + 1.2, height), layout="constrained")
    axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    methods = list(dict.fromkeys(sub["method"]))
    offsets = np.linspace(-0.18, 0.18, len(methods)) if len(methods) > 1 else [0.0]
    for ax, (col, title) in zip(axes, panels, strict=True):
        for m, off in zip(methods, offsets, strict=True):
            sm = sub[sub["method"] == m]
            y = sm["region"].astype(str).map(ypos).to_numpy(float) + off
            ax.scatter(sm[col], y, s=22, color=colors.get(m, "k"), label=m, zorder=3)
        if col == "gap_bk":
            first = sub.drop_duplicates("region")
            ax.scatter(first["ils_gap_bk"], first["region"].astype(str).map(ypos), marker="x",
                       s=24, color="#555555", label="ILS", zorder=2)
        ax.axvline(0, color="k", lw=0.8)
        ax.set_xlabel(title, fontsize=9)
        ax.grid(axis="x", alpha=0.3)
        ax.tick_params(labelsize=8)
        start = 0
        for g in groups:  # shaded bands and labels per group
            n = sum(1 for gg, _ in order if gg == g)
            if not n:
                continue
            if groups.index(g) % 2:
                ax.axhspan(start - 0.5, start + n - 0.5, color="#f0f0f0", zorder=0)
            start += n
    axes[0].set_yticks(range(len(order)), [f"{r} ({g})" for g, r in order])
    axes[0].invert_yaxis()
    handles, labels = axes[-1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(4, len(labels)),
               fontsize=8, frameon=False)
    fig.suptitle(f"Gap per region, {KIND_LABEL.get(kind, kind)} tourists\n"
                 "(negative: better than the reference)", fontsize=10)
    return _save(fig, path)


# ----------------------------------------------------------------------------- time vs score


def time_score_points(data: JobData) -> pd.DataFrame:
    """Per (group, method, setting): mean inference seconds and mean score (and the mean gap
    to ILS where the regions table has ILS scores) on the benchmark tourists.

    Beam widths come from the job's ``beam_sweep`` table; active search (methods ending in
    ``_as``) and greedy rows from the evaluation rows."""
    parts = []
    sweep = data.tables.get("beam_sweep")
    if sweep is not None and len(sweep):
        s = sweep.assign(region=sweep["region"].astype(str),
                         setting=sweep["beams"].map(lambda b: f"beams={int(b)}"),
                         order=sweep["beams"].astype(float))
        parts.append(s[["region", "method", "setting", "order", "score", "seconds"]])
    ev = data.evaluation
    if len(ev):
        bench = ev[ev["kind"] == "benchmark"]
        act = bench[bench["method"].astype(str).str.endswith("_as")]
        if len(act):
            a = act.assign(method=act["method"].str[:-3] + " + active search",
                           setting="active search", order=np.inf)
            parts.append(a[["region", "method", "setting", "order", "score", "seconds"]])
    if not parts:
        return pd.DataFrame(columns=["group", "method", "setting", "order", "regions", "score",
                                     "seconds", "gap_ils"])
    pts = pd.concat(parts, ignore_index=True)
    known: dict[str, str] = {}
    ils: dict[str, float] = {}
    regions = data.tables.get("regions")
    if regions is not None and len(regions):
        b = regions[regions["kind"] == "benchmark"].drop_duplicates("region")
        ils = dict(zip(b["region"].astype(str), b["ils"], strict=True))
        known = dict(zip(regions["region"].astype(str), regions["group"].astype(str),
                         strict=True))
    pts["group"] = pts["region"].map(lambda r: group_of(r, known))
    pts["ils"] = pts["region"].map(ils).astype(float)
    pts["gap_ils"] = (pts["ils"] - pts["score"]) / pts["ils"] * 100.0
    out = pts.groupby(["group", "method", "setting", "order"], sort=False).agg(
        regions=("region", "nunique"), score=("score", "mean"), seconds=("seconds", "mean"),
        gap_ils=("gap_ils", "mean")).reset_index()
    return out.sort_values(["group", "method", "order"], kind="stable").reset_index(drop=True)


def time_score(points: pd.DataFrame, groups: list[str], colors: dict[str, str],
               ils_seconds: dict[str, float], path: Path) -> Path | None:
    """The paper's time/score figure: per group, mean gap to ILS (or mean score without ILS)
    against mean inference time (log scale) for beam widths 1…128 and active search."""
    if points.empty:
        return None
    use_gap = points["gap_ils"].notna().all()
    ycol, ylabel = ("gap_ils", "gap to ILS [%] (lower is better)") if use_gap else \
        ("score", "mean score (higher is better)")
    present = [g for g in groups if (points["group"] == g).any()]
    fig = Figure(figsize=(4.3 * len(present) + 0.6, 3.6), layout="constrained")
    axes = fig.subplots(1, len(present), squeeze=False)[0]
    for ax, g in zip(axes, present, strict=True):
        sub = points[points["group"] == g]
        for m in dict.fromkeys(sub["method"]):
            sm = sub[sub["method"] == m]
            base = m.replace(" + active search", "")
            color = colors.get(base, colors.get(m, "#333333"))
            beams = sm[np.isfinite(sm["order"])]
            if len(beams):
                ax.plot(beams["seconds"], beams[ycol], marker="o", ms=4, color=color, label=m)
                for _, row in beams.iterrows():
                    ax.annotate(row["setting"].split("=")[-1], (row["seconds"], row[ycol]),
                                textcoords="offset points", xytext=(3, 4), fontsize=7,
                                color=color)
            act = sm[~np.isfinite(sm["order"])]
            if len(act):
                ax.scatter(act["seconds"], act[ycol], marker="*", s=90, color=color, label=m,
                           zorder=4)
        if use_gap and g in ils_seconds and ils_seconds[g] > 0:
            ax.scatter([ils_seconds[g]], [0.0], marker="x", s=40, color="k", label="ILS")
        ax.set_xscale("log")
        ax.set_title(g, fontsize=10)
        ax.set_xlabel("inference time per tourist [s]", fontsize=8)
        ax.grid(alpha=0.3, which="both")
        ax.tick_params(labelsize=7)
    axes[0].set_ylabel(ylabel, fontsize=8)
    handles, labels = [], []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="outside right upper", fontsize=8, frameon=False)
    fig.suptitle("Score against inference time (benchmark tourists; labels: beam width)",
                 fontsize=10)
    return _save(fig, path)
