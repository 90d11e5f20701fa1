"""The report's figures (matplotlib's Agg renderer, no pyplot state), ``None`` when there is
nothing to plot, and :func:`write_png`, which writes one as a PNG file."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

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


def _legend(fig: Figure, axes, loc: str, ncols: int = 1, title: str | None = None) -> None:
    """One legend for the figure: each label of ``axes`` once, in order. ``title``: the
    figure's title as the legend's (a legend on top: a suptitle would overlap it)."""
    handles: dict[str, Any] = {}
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, h)
    fig.legend(list(handles.values()), list(handles), loc=loc, ncols=min(ncols, len(handles)),
               fontsize=8, frameon=False, title=title, title_fontproperties={"size": 10})


def write_png(fig: Figure | None, path: Path) -> Path | None:
    """``fig`` as the PNG file ``path``; None (no file) for no figure."""
    if fig is None:
        return None
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


def learning_curves(runs: list[ChildRun], title: str) -> Figure | None:
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
    fig.suptitle(title, fontsize=11)
    return fig


def _panel(ax, ylabel: str) -> None:
    ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)


def finetune_points(children: list[ChildRun], regions: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per fine-tuned region: its validation at epoch 0 and last (greedy, the run's own
    tourists) and, from the job's evaluation (beam search), the fine-tuned model's gap and the
    start model's where the job evaluated that one too."""
    by_key = {c.key: c for c in children}
    rows = []
    for run in (c for c in children if c.stage == "finetune"):
        for metric in ("val_gap_ils", "val_score"):
            df = run.curves.get(metric)
            if df is None or not (df["step"] == 0).any() or not (df["step"] > 0).any():
                continue
            last = df[df["step"] > 0].iloc[-1]
            start = by_key.get(run.params.get("init_from", ""))
            ev_before, _ = _evaluated_gap(start, run.key, regions)
            ev_after, n_eval = _evaluated_gap(run, run.key, regions)
            rows.append({"region": run.key, "group": run.group, "start": run.started_from,
                         "metric": metric,
                         "before": float(df.loc[df["step"] == 0, "value"].iloc[-1]),
                         "after": float(last["value"]), "after_epoch": int(last["step"]),
                         "evaluated_before": ev_before, "evaluated": ev_after,
                         "eval_tourists": n_eval,
                         "val_tourists": run.params.get("train.val_tourists", "")})
            break
    out = pd.DataFrame(rows, columns=["region", "group", "start", "metric", "before", "after",
                                      "after_epoch", "evaluated_before", "evaluated",
                                      "eval_tourists", "val_tourists"])
    if (out["metric"] == "val_gap_ils").any():  # one measure for the whole chart
        out = out[out["metric"] == "val_gap_ils"]
    return out.reset_index(drop=True)


def _evaluated_gap(run: ChildRun | None, region: str, regions: pd.DataFrame | None,
                   ) -> tuple[float, float]:
    """The evaluated validation gap to ILS on ``region`` of ``run``'s main (beam search)
    method and its number of tourists, or NaNs (no run, no such evaluation)."""
    if run is None or regions is None or not len(regions) or not run.methods:
        return math.nan, math.nan
    main = [m for m in run.methods if not m.endswith(("_greedy", "_as"))]
    sub = regions[(regions["region"].astype(str) == region)
                  & (regions["kind"] == "validation") & regions["method"].isin(main)]
    if not len(sub):
        return math.nan, math.nan
    return float(sub["gap_ils"].iloc[0]), _num(sub.iloc[0].get("tourists"))


def _num(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


#: The fine-tuning chart's markers: "before" a large ring, "after" a smaller filled mark
#: inside it, so a region whose value did not change shows both (a dot in a ring).
BEFORE_SIZE, AFTER_SIZE = 90, 26


def _pair(ax, y: np.ndarray, before: pd.Series, after: pd.Series, color: str, marker: str,
          label: str) -> None:
    """Arrows before → after, the "before" ring and the "after" mark of one comparison."""
    for yi, b, a in zip(y, before, after, strict=True):
        if np.isfinite(a) and np.isfinite(b) and a != b:
            ax.annotate("", xy=(a, yi), xytext=(b, yi),
                        arrowprops=dict(arrowstyle="->", color=color, alpha=0.5, lw=1.0,
                                        shrinkA=5, shrinkB=3))
    ax.scatter(before, y, s=BEFORE_SIZE, marker=marker, facecolors="none", edgecolors=color,
               linewidths=1.3, zorder=3, label=f"{label}: before (the model it starts from)")
    ax.scatter(after, y, s=AFTER_SIZE, marker=marker, color=color, zorder=4,
               label=f"{label}: after (the fine-tuned model)")


def _counts(values: pd.Series, what: str) -> str:
    """``4 validation tourists`` from a column of counts (several: ``4, 8 ...``)."""
    n = sorted({str(int(float(v))) for v in values if str(v) not in ("", "nan")}, key=int)
    return f"{', '.join(n)} {what}" if n else what


def finetune_figure(points: pd.DataFrame, groups: list[str]) -> Figure | None:
    """The fine-tuning chart: per group a panel, per region the greedy validation before and
    after (the same decoder and tourists) and, where the job evaluated the start model too,
    the beam evaluation before and after; legend on top."""
    if points.empty:
        return None
    gap = points["metric"].iloc[0] == "val_gap_ils"
    present = [g for g in groups if (points["group"] == g).any()]
    present += sorted(set(points["group"]) - set(present))
    longest = max(int((points["group"] == g).sum()) for g in present)
    both = points[["evaluated_before", "evaluated"]].notna().all(axis=1) & gap
    fig = Figure(figsize=(4.6 * len(present) + 0.8,
                          max(3.2, (0.34 if both.any() else 0.26) * longest + 2.4)),
                 layout="constrained")
    axes = fig.subplots(1, len(present), squeeze=False)[0]
    unit = "%" if gap else ""
    greedy = f"greedy, {_counts(points['val_tourists'], 'tourists')}"
    beam = f"beam, {_counts(points.loc[both, 'eval_tourists'], 'tourists')}"
    for ax, g in zip(axes, present, strict=True):
        sub = points[points["group"] == g].sort_values("region")
        sub_both = both[sub.index].to_numpy()
        y = np.arange(len(sub), dtype=float)
        _pair(ax, y - 0.17 * sub_both, sub["before"], sub["after"], "#1f4e79", "o", greedy)
        title = [f"{g} ({len(sub)} region{'s' if len(sub) > 1 else ''})",
                 f"{greedy}: mean {sub['before'].mean():.2f}{unit} → "
                 f"{sub['after'].mean():.2f}{unit}"]
        if sub_both.any():
            ev = sub[sub_both]
            _pair(ax, y[sub_both] + 0.17, ev["evaluated_before"], ev["evaluated"], "#c45a00",
                  "D", beam)
            title.append(f"{beam}: mean {ev['evaluated_before'].mean():.2f}{unit} → "
                         f"{ev['evaluated'].mean():.2f}{unit}")
        if gap:
            ax.axvline(0, color="k", lw=0.8)
        ax.set_yticks(y, sub["region"].astype(str))
        ax.set_ylim(len(sub) - 0.5, -0.5)
        ax.tick_params(labelsize=8)
        ax.grid(axis="x", alpha=0.3)
        ax.set_title("\n".join(title), fontsize=9)
        ax.set_xlabel("gap to ILS [%] (lower is better)" if gap
                      else "mean validation score (higher is better)", fontsize=8)
    what = "gap to ILS" if gap else "mean score"
    _legend(fig, axes, "outside upper center", 2, f"Fine-tuning: {what} per region before and "
            "after (each comparison: the same decoder and tourists before and after)")
    return fig


def region_gaps_figure(regions: pd.DataFrame, kind: str, groups: list[str],
                       colors: dict[str, str]) -> Figure | None:
    """Dot plot per region of each method's gap to ILS and, where known, to best-known. A row per
    region makes it tall: the legend on top, the axis labels and ticks at the top and bottom."""
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
        ax.grid(axis="x", alpha=0.3)
        for x_axis in (ax, ax.secondary_xaxis("top")):  # on top too: read without scrolling down
            x_axis.set_xlabel(title, fontsize=9)
            x_axis.tick_params(labelsize=8)
        start = 0
        for i, g in enumerate(groups):  # every other group's rows shaded
            if (n := sum(1 for gg, _ in order if gg == g)) and i % 2:
                ax.axhspan(start - 0.5, start + n - 0.5, color="#f0f0f0", zorder=0)
            start += n
    axes[0].set_yticks(range(len(order)), [f"{r} ({g})" for g, r in order])
    axes[0].set_ylim(len(order) - 0.5, -0.5)  # first region on top, no empty margin
    _legend(fig, axes, "outside upper center", 4, f"Gap per region, "
            f"{KIND_LABEL.get(kind, kind)} tourists (negative: better than the reference)")
    return fig


def time_score_points(data: JobData) -> pd.DataFrame:
    """Per (group, method, setting) on the benchmark tourists: mean seconds, score, gap."""
    parts = []
    if (sweep := data.tables.get("beam_sweep")) is not None and len(sweep):
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


def ils_points(data: JobData, points: pd.DataFrame) -> pd.DataFrame:
    """ILS on the benchmark tourists of each group of ``points``, as a time/score point (its
    mean score and seconds over the group's regions; gap 0), after the group's other points."""
    regions = data.tables.get("regions")
    if points.empty or regions is None or not {"ils", "ils_seconds"} <= set(regions.columns):
        return points
    bench = regions[regions["kind"] == "benchmark"].drop_duplicates("region")
    parts = []
    for g in dict.fromkeys(points["group"]):
        parts.append(points[points["group"] == g])
        if len(sub := bench[bench["group"].astype(str) == g]) and sub["ils"].notna().any():
            parts.append(pd.DataFrame([{
                "group": g, "method": "ILS", "setting": "heuristic", "order": math.nan,
                "regions": sub["region"].nunique(), "score": sub["ils"].mean(),
                "seconds": sub["ils_seconds"].mean(), "gap_ils": 0.0}]))
    return pd.concat(parts, ignore_index=True)


def _log_ticks(ax) -> None:
    """Readable ticks of a log x axis: plain numbers at 1-2-5 (1…9 within half a decade, powers
    of ten over more than three decades), no labels on the minor ticks."""
    lo, hi = sorted(ax.get_xlim())
    decades = math.log10(hi / lo) if lo > 0 and hi > lo else 1.0
    subs = (tuple(range(1, 10)) if decades < 0.5 else (1.0, 2.0, 5.0) if decades <= 3 else (1.0,))
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=subs))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def time_score_figure(points: pd.DataFrame, groups: list[str], colors: dict[str, str],
                      ) -> Figure | None:
    """The paper's time/score figure: per group, mean gap to ILS (or score) against time; the
    methods' lines over beam widths, active search as ★, ILS (rows ``method == "ILS"``) as ×."""
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
            if m == "ILS":
                sm = sm[sm["seconds"] > 0]  # a log axis
                ax.scatter(sm["seconds"], sm[ycol], marker="x", s=40, color="k", label="ILS",
                           zorder=4)
                continue
            color = colors.get(m.replace(" + active search", ""), colors.get(m, "#333333"))
            if len(beams := sm[np.isfinite(sm["order"])]):
                ax.plot(beams["seconds"], beams[ycol], marker="o", ms=4, color=color, label=m)
                for _, row in beams.iterrows():
                    ax.annotate(row["setting"].split("=")[-1], (row["seconds"], row[ycol]),
                                textcoords="offset points", xytext=(3, 4), fontsize=7, color=color)
            if len(act := sm[~np.isfinite(sm["order"])]):
                ax.scatter(act["seconds"], act[ycol], marker="*", s=90, color=color, label=m,
                           zorder=4)
        ax.set_xscale("log")
        ax.set_title(g, fontsize=10)
        ax.set_xlabel("inference time per tourist [s]", fontsize=8)
        ax.grid(alpha=0.3, which="both")
        ax.tick_params(labelsize=7)
        _log_ticks(ax)
    axes[0].set_ylabel(ylabel, fontsize=8)
    _legend(fig, axes, "outside right upper")
    fig.suptitle("Score against inference time (benchmark tourists; labels: beam width)",
                 fontsize=10)
    return fig
