"""The report's figures as PNG files (matplotlib's Agg renderer, no pyplot state): each writes
one file and returns its path, or ``None`` when there is nothing to plot."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from optw.evaluate.tables import KIND_LABEL
from optw.report.data import ChildRun, JobData, group_of, region_groups

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


def _legend(fig: Figure, axes, loc: str, ncols: int = 1) -> None:
    """One legend for the figure: each label of ``axes`` once, in order."""
    handles: dict[str, Any] = {}
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, h)
    fig.legend(list(handles.values()), list(handles), loc=loc,
               ncols=min(ncols, len(handles)), fontsize=8, frameon=False)


def _save(fig: Figure, path: Path, title: str, size: int = 10) -> Path:
    fig.suptitle(title, fontsize=size)
    fig.savefig(path, dpi=DPI, format="png", bbox_inches="tight")
    return path


def has_curve(run: ChildRun, metrics: tuple[str, ...] = ("mean_reward", "val_score")) -> bool:
    """Whether ``run`` has a history of at least two epochs of one of ``metrics``."""
    return any(len(run.curves.get(m, ())) >= 2 for m in metrics)


_CURVE_STYLES = {
    "mean_reward": dict(color="#7f7f7f", lw=1.3, label="training: mean reward of the epoch's "
                        "sampled routes"),
    "val_score": dict(color="#1f77b4", marker="o", ms=4, lw=1.8,
                      label="validation: mean greedy score"),
    "benchmark_score": dict(color="#d62728", ls="--", marker="s", ms=2.5, lw=1.0,
                            label="benchmark tourist (greedy)"),
}


def learning_curves(runs: list[ChildRun], path: Path, title: str) -> Path | None:
    """A panel per model: training reward, validation scores and gap to ILS over epochs."""
    runs = sorted((r for r in runs if has_curve(r)),
                  key=lambda r: (STAGE_ORDER.get(r.stage, 9), r.key))
    if not runs:
        return None
    with_gap = any(has_curve(r, ("val_gap_ils",)) for r in runs)
    ncols = min(4, len(runs))
    nrows = math.ceil(len(runs) / ncols)
    heights = [2.8, 1.6] if with_gap else [2.8]  # per model: its score panel, its gap panel
    per = len(heights)
    width = 4.6 if len(runs) <= 3 else 3.4
    fig = Figure(figsize=(width * ncols, sum(heights) * nrows + 0.8), layout="constrained")
    axes = fig.subplots(nrows * per, ncols, squeeze=False,
                        gridspec_kw={"height_ratios": heights * nrows})
    for i, run in enumerate(runs):
        row, col = divmod(i, ncols)
        ax = axes[row * per, col]
        for metric, style in _CURVE_STYLES.items():
            if len(df := run.curves.get(metric, ())):
                ax.plot(df["step"], df["value"], **style)
        ax.set_title(f"{run.key} ({run.stage})", fontsize=10)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        _panel(ax, "score")
        if with_gap:
            gx = axes[row * per + 1, col]
            if len(g := run.curves.get("val_gap_ils", ())):
                gx.plot(g["step"], g["value"], color="#2ca02c", marker="o", ms=3.5, lw=1.6,
                        label="validation: gap to ILS [%]")
                gx.axhline(0, color="k", lw=0.7)
            _panel(gx, "gap to ILS [%]")
            gx.sharex(ax)
        axes[row * per + per - 1, col].set_xlabel("epoch", fontsize=8)
    for ax in axes[-per:, len(runs) % ncols or ncols:].flat:  # the last row's empty panels
        ax.set_visible(False)
    _legend(fig, axes.flat, "outside lower center", 4)
    return _save(fig, path, title, 11)


def _panel(ax, ylabel: str) -> None:
    ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)


def finetune_points(children: list[ChildRun], regions: pd.DataFrame | None = None,
                    ) -> pd.DataFrame:
    """Per fine-tuned region: its validation at epoch 0 and last, and the evaluated gap."""
    rows = []
    for run in (c for c in children if c.stage == "finetune"):
        for metric in ("val_gap_ils", "val_score"):
            df = run.curves.get(metric)
            if df is None or not (df["step"] == 0).any() or not (df["step"] > 0).any():
                continue
            last = df[df["step"] > 0].iloc[-1]
            rows.append({"region": run.key, "group": run.group,
                         "start": run.params.get("init_from", ""), "metric": metric,
                         "before": float(df.loc[df["step"] == 0, "value"].iloc[-1]),
                         "after": float(last["value"]), "after_epoch": int(last["step"]),
                         "evaluated": _evaluated_gap(run, regions),
                         "val_tourists": run.params.get("train.val_tourists", "")})
            break
    out = pd.DataFrame(rows, columns=["region", "group", "start", "metric", "before", "after",
                                      "after_epoch", "evaluated", "val_tourists"])
    if (out["metric"] == "val_gap_ils").any():  # one measure for the whole chart
        out = out[out["metric"] == "val_gap_ils"]
    return out.reset_index(drop=True)


def _evaluated_gap(run: ChildRun, regions: pd.DataFrame | None) -> float:
    """The evaluated validation gap to ILS of ``run``'s main (beam search) method, or NaN."""
    if regions is None or not len(regions) or not run.methods:
        return math.nan
    main = [m for m in run.methods if not m.endswith(("_greedy", "_as"))]
    sub = regions[(regions["region"].astype(str) == run.key)
                  & (regions["kind"] == "validation") & regions["method"].isin(main)]
    return float(sub["gap_ils"].iloc[0]) if len(sub) else math.nan


def finetune_chart(points: pd.DataFrame, groups: list[str], path: Path) -> Path | None:
    """Every fine-tuned region's validation before and after: an arrow per region and group."""
    if points.empty:
        return None
    gap = points["metric"].iloc[0] == "val_gap_ils"
    present = [g for g in groups if (points["group"] == g).any()]
    present += sorted(set(points["group"]) - set(present))
    longest = max(int((points["group"] == g).sum()) for g in present)
    fig = Figure(figsize=(4.4 * len(present) + 0.8, max(3.0, 0.24 * longest + 2.0)),
                 layout="constrained")
    axes = fig.subplots(1, len(present), squeeze=False)[0]
    for ax, g in zip(axes, present, strict=True):
        sub = points[points["group"] == g].sort_values("region")
        y = np.arange(len(sub))
        for yi, b, a in zip(y, sub["before"], sub["after"], strict=True):
            ax.annotate("", xy=(a, yi), xytext=(b, yi),
                        arrowprops=dict(arrowstyle="->", color="#999999", lw=1.0,
                                        shrinkA=3, shrinkB=3))
        ax.scatter(sub["before"], y, s=30, facecolors="white", edgecolors="#555555",
                   linewidths=1.2, zorder=3, label="before: the model it starts from")
        ax.scatter(sub["after"], y, s=30, color="#1f77b4", zorder=4,
                   label="after: the fine-tuned model")
        ev = sub["evaluated"].to_numpy(float)
        if gap and np.isfinite(ev).any():
            ax.scatter(ev, y, marker="x", s=26, color="#ff7f0e", zorder=4,
                       label="after, evaluated (beam search, evaluation tourists)")
        if gap:
            ax.axvline(0, color="k", lw=0.8)
        ax.set_yticks(y, sub["region"].astype(str))
        ax.set_ylim(len(sub) - 0.5, -0.5)
        ax.tick_params(labelsize=8)
        ax.grid(axis="x", alpha=0.3)
        mean_b, mean_a = sub["before"].mean(), sub["after"].mean()
        unit = "%" if gap else ""
        regions = f"{len(sub)} region{'s' if len(sub) > 1 else ''}"
        ax.set_title(f"{g} ({regions})\nmean {mean_b:.2f}{unit} → {mean_a:.2f}{unit}",
                     fontsize=10)
        ax.set_xlabel("gap to ILS [%] (lower is better)" if gap
                      else "mean validation score (higher is better)", fontsize=8)
    _legend(fig, axes, "outside lower center", 3)
    n = ", ".join(sorted(set(points["val_tourists"].astype(str)) - {""}))
    which = f"first {n} validation tourists" if n else "validation tourists"
    what = "gap to ILS" if gap else "mean score"
    return _save(fig, path, f"Fine-tuning: {what} per region before and after\n(greedy "
                 f"decoding of each region's {which}, the same tourists before and after)")


def region_gaps(regions: pd.DataFrame, kind: str, groups: list[str], colors: dict[str, str],
                path: Path) -> Path | None:
    """Dot plot per region of each method's gap to ILS and, where known, to best-known."""
    sub = regions[regions["kind"] == kind]
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
        for i, g in enumerate(groups):  # every other group's rows shaded
            n = sum(1 for gg, _ in order if gg == g)
            if n and i % 2:
                ax.axhspan(start - 0.5, start + n - 0.5, color="#f0f0f0", zorder=0)
            start += n
    axes[0].set_yticks(range(len(order)), [f"{r} ({g})" for g, r in order])
    axes[0].set_ylim(len(order) - 0.5, -0.5)  # first region on top, no empty margin
    _legend(fig, axes[-1:], "outside lower center", 4)
    return _save(fig, path, f"Gap per region, {KIND_LABEL.get(kind, kind)} tourists\n"
                 "(negative: better than the reference)")


def time_score_points(data: JobData) -> pd.DataFrame:
    """Per (group, method, setting) on the benchmark tourists: mean seconds, score, gap."""
    parts = []
    sweep = data.tables.get("beam_sweep")
    if sweep is not None and len(sweep):
        s = sweep.assign(region=sweep["region"].astype(str),
                         setting=sweep["beams"].map(lambda b: f"beams={int(b)}"),
                         order=sweep["beams"].astype(float))
        parts.append(s[["region", "method", "setting", "order", "score", "seconds"]])
    bench = data.evaluation[data.evaluation["kind"] == "benchmark"]
    if len(act := bench[bench["method"].astype(str).str.endswith("_as")]):
        a = act.assign(method=act["method"].str[:-3] + " + active search",
                       setting="active search", order=np.inf)
        parts.append(a[["region", "method", "setting", "order", "score", "seconds"]])
    if not parts:
        return pd.DataFrame(columns=["group", "method", "setting", "order", "regions", "score",
                                     "seconds", "gap_ils"])
    pts = pd.concat(parts, ignore_index=True)
    ils: dict[str, float] = {}
    regions = data.tables.get("regions")
    if regions is not None and len(regions):
        b = regions[regions["kind"] == "benchmark"].drop_duplicates("region")
        ils = dict(zip(b["region"].astype(str), b["ils"], strict=True))
    known = region_groups(regions)
    pts["group"] = pts["region"].map(lambda r: group_of(r, known))
    pts["ils"] = pts["region"].map(ils).astype(float)
    pts["gap_ils"] = (pts["ils"] - pts["score"]) / pts["ils"] * 100.0
    out = pts.groupby(["group", "method", "setting", "order"], sort=False).agg(
        regions=("region", "nunique"), score=("score", "mean"), seconds=("seconds", "mean"),
        gap_ils=("gap_ils", "mean")).reset_index()
    return out.sort_values(["group", "method", "order"], kind="stable").reset_index(drop=True)


def time_score(points: pd.DataFrame, groups: list[str], colors: dict[str, str],
               ils_seconds: dict[str, float], path: Path) -> Path | None:
    """The paper's time/score figure: per group, mean gap to ILS (or score) against time."""
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
            color = colors.get(m.replace(" + active search", ""), colors.get(m, "#333333"))
            if len(beams := sm[np.isfinite(sm["order"])]):
                ax.plot(beams["seconds"], beams[ycol], marker="o", ms=4, color=color, label=m)
                for _, row in beams.iterrows():
                    ax.annotate(row["setting"].split("=")[-1], (row["seconds"], row[ycol]),
                                textcoords="offset points", xytext=(3, 4), fontsize=7,
                                color=color)
            if len(act := sm[~np.isfinite(sm["order"])]):
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
    _legend(fig, axes, "outside right upper")
    return _save(fig, path, "Score against inference time (benchmark tourists; labels: beam "
                 "width)")
