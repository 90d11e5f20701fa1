"""Our mean per region, for ILS and each method, beside the paper's column of the same (or a
mapped) name (``optw evaluate --against-paper``, the report); diff = (ours − paper) / paper."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from optw.errors import UserError
from optw.evaluate.tables import (
    GROUP_LABEL,
    GROUP_ORDER,
    KIND_LABEL,
    read_reference,
    sort_rows,
    to_markdown,
)
from optw.paths import reference_dir as default_reference_dir

#: Tourist kind -> the paper's table of it (in ``$OPTW_REFERENCE`` / ``../shared/reference``).
PAPER_FILES = {"paper": "paper_generated_scores.csv", "benchmark": "paper_benchmark_scores.csv"}
PAPER_COLUMNS = ("ils", "global_ft", "model", "model_as")
KINDS = tuple(PAPER_FILES)
#: Long form of our numbers: one row per (kind, region, name).
OURS = ("kind", "group", "region", "name", "tourists", "score", "exact")


def load_paper_scores(reference_dir: Path | str | None = None) -> dict[str, pd.DataFrame]:
    """The paper's two tables, indexed by region (``instance``): kind -> DataFrame."""
    folder = Path(reference_dir) if reference_dir else default_reference_dir()
    return {kind: read_reference(folder / name, ("ils",)) for kind, name in PAPER_FILES.items()}


def parse_column_map(items: list[str] | None) -> dict[str, str]:
    """``["beam=model", ...]`` -> ``{"beam": "model"}`` (our name -> the paper's column)."""
    out: dict[str, str] = {}
    for item in items or []:
        name, sep, column = item.partition("=")
        if not sep or not name or column not in PAPER_COLUMNS:
            raise UserError(f"--paper-column {item!r}: expected NAME=COLUMN with COLUMN one "
                             f"of {', '.join(PAPER_COLUMNS)}")
        out[name] = column
    return out


def check_column_names(columns: Mapping[str, str], methods: list[str], source: str | None) -> None:
    """A :class:`UserError` unless every mapped NAME is one of ``methods`` (of ``source``)."""
    for name, column in columns.items():
        if name not in methods:
            item = f"--paper-column {name}={column}: unknown method {name!r}"
            raise UserError(f"{item}: no --results given, so there are no methods to map (give "
                            "--results FILE with that method)" if source is None else
                            f"{item}; the methods of {source}: {', '.join(methods) or 'none'}")


def ours_from_results(results: pd.DataFrame | None, ils: pd.DataFrame,
                      exact: Mapping[str, bool], groups: Mapping[str, str]) -> pd.DataFrame:
    """Our means per (kind, region, name) from validated results and stored ILS rows."""
    parts = []
    if results is not None and len(results):
        parts.append(results.rename(columns={"method": "name"}))
    if len(ils):
        parts.append(ils.assign(name="ils", group=ils["region"].map(groups)))
    if not parts:
        return pd.DataFrame(columns=list(OURS))
    df = pd.concat(parts, ignore_index=True)
    df = df[df["kind"].isin(KINDS)]
    out = df.groupby(["kind", "group", "region", "name"], sort=False).agg(
        tourists=("tourist", "size"), score=("score", "mean")).reset_index()
    out["exact"] = [k != "paper" or bool(exact.get(r, True))
                    for k, r in zip(out["kind"], out["region"], strict=True)]
    return out[list(OURS)]


def ours_from_regions(regions: pd.DataFrame) -> pd.DataFrame:
    """Our means from a region table: each method as is, ILS once per (kind, region)."""
    df = regions[regions["kind"].isin(KINDS)]
    df = df.assign(exact=df["exact"] if "exact" in df.columns else True)
    methods = df.rename(columns={"method": "name", "model": "score"})
    ils = (df.sort_values("tourists", ascending=False, kind="stable")
           .drop_duplicates(["kind", "region"]).assign(name="ils")
           .rename(columns={"ils": "score"}))
    out = pd.concat([ils, methods], ignore_index=True)
    out["exact"] = out["exact"].astype(bool)
    return out[list(OURS)]


def against_paper(ours: pd.DataFrame, paper: Mapping[str, pd.DataFrame],
                  columns: Mapping[str, str] | None = None) -> dict[str, pd.DataFrame]:
    """Tables ``paper_regions`` and ``paper_groups`` of what both we and the paper have."""
    columns = dict(columns or {})
    rows = []
    for rec in ours.itertuples(index=False):
        column = columns.get(rec.name, rec.name if rec.name in PAPER_COLUMNS else None)
        table = paper.get(rec.kind)
        if column is None or table is None:
            continue
        value = (table.at[rec.region, column] if rec.region in table.index
                 and column in table.columns else np.nan)
        if pd.isna(value):
            continue
        rows.append({"kind": rec.kind, "group": rec.group, "region": rec.region,
                     "name": rec.name, "paper_column": column, "tourists": int(rec.tourists),
                     "exact": bool(rec.exact), "ours": float(rec.score), "paper": float(value)})
    regions = pd.DataFrame(rows, columns=["kind", "group", "region", "name", "paper_column",
                                          "tourists", "exact", "ours", "paper"])
    regions["diff_pct"] = (regions["ours"] - regions["paper"]) / regions["paper"] * 100.0
    regions = _sorted(regions)
    groups = []
    for (kind, group, name, column), g in regions.groupby(
            ["kind", "group", "name", "paper_column"], sort=False):
        ours_mean, paper_mean = g["ours"].mean(), g["paper"].mean()
        groups.append({
            "kind": kind, "group": group, "name": name, "paper_column": column, "regions": len(g),
            "inexact_regions": int((~g["exact"]).sum()), "ours": ours_mean, "paper": paper_mean,
            "diff_pct": (ours_mean - paper_mean) / paper_mean * 100.0,
            "region_diff_mean": g["diff_pct"].mean(), "region_diff_min": g["diff_pct"].min(),
            "region_diff_max": g["diff_pct"].max()})
    group_cols = ["kind", "group", "name", "paper_column", "regions", "inexact_regions", "ours",
                  "paper", "diff_pct", "region_diff_mean", "region_diff_min", "region_diff_max"]
    return {"paper_groups": _sorted(pd.DataFrame(groups, columns=group_cols)),
            "paper_regions": regions}


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    """Kinds as :data:`KINDS`, groups in the paper's order, names ILS first, then regions."""
    names = ["ils", *sorted(set(df["name"]) - {"ils"})]
    return sort_rows(df, {"kind": KINDS, "group": GROUP_ORDER, "name": names})


def _pct(v: float) -> str:
    return "-" if pd.isna(v) else f"{v:+.2f}%"


def group_view(groups: pd.DataFrame) -> pd.DataFrame:
    """The group table as people read it (labels, % columns, the approximate-set count)."""
    return pd.DataFrame({
        "tourists": [KIND_LABEL.get(k, k) for k in groups["kind"]],
        "group": [GROUP_LABEL.get(g, g) for g in groups["group"]],
        "ours": groups["name"].to_numpy(), "paper column": groups["paper_column"].to_numpy(),
        "regions": groups["regions"].to_numpy(),
        "not exact": [str(n) if n else "" for n in groups["inexact_regions"]],
        "ours mean": groups["ours"].to_numpy(), "paper mean": groups["paper"].to_numpy(),
        "diff": [_pct(v) for v in groups["diff_pct"]],
        "region diffs mean [min, max]": [
            "-" if pd.isna(m) else f"{m:+.2f}% [{lo:+.2f}%, {hi:+.2f}%]"
            for m, lo, hi in zip(groups["region_diff_mean"], groups["region_diff_min"],
                                 groups["region_diff_max"], strict=True)]})


def region_view(regions: pd.DataFrame, kind: str) -> pd.DataFrame:
    """Per-region table of one kind, wide over the compared names: ours, the paper's, diff."""
    sub = regions[regions["kind"] == kind]
    first = sub.drop_duplicates("region")
    out = pd.DataFrame({"group": [GROUP_LABEL.get(g, g) for g in first["group"]],
                        "region": first["region"].to_numpy(),
                        "exact": ["" if e else "no" for e in first["exact"]]})
    for name in dict.fromkeys(sub["name"]):
        s = sub[sub["name"] == name].set_index("region")
        out[name] = out["region"].map(s["ours"])
        out[f"paper {s['paper_column'].iloc[0]}"] = out["region"].map(s["paper"])
        out[f"{name} diff"] = out["region"].map(s["diff_pct"]).map(_pct)
    if kind != "paper":
        out = out.drop(columns=["exact"])
    return out


def render_against_paper(tables: Mapping[str, pd.DataFrame]) -> str:
    """The Markdown document ``against_paper.md``."""
    groups, regions = tables["paper_groups"], tables["paper_regions"]
    parts = ["# Against the paper\n\n",
             "Ours beside the paper's columns: the paper's own tourists against "
             "`paper_generated_scores.csv`, the benchmark tourist against "
             "`paper_benchmark_scores.csv`. diff = (ours - paper) / paper x 100 (positive: ours "
             "higher); group rows are means over the regions compared. 'not exact': regions whose "
             "paper set is the CPU approximation (Gavalas' correlated scores without a GPU).\n\n"]
    if groups.empty:
        return "".join(parts) + "No region and name of ours has a number in the paper's tables.\n"
    parts += ["## Per group\n\n", to_markdown(group_view(groups))]
    for kind in KINDS:
        if (regions["kind"] == kind).any():
            parts += [f"\n## Per region, {KIND_LABEL.get(kind, kind)} tourists\n\n",
                      to_markdown(region_view(regions, kind))]
    return "".join(parts)
