"""The paper's result tables from results and the stored ILS baseline: per region, per group and
tourist kind (means, CIs, Wilcoxon p-values over regions) and pairwise p-values."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from optw.errors import OptwError, UserError
from optw.evaluate.stats import N_RESAMPLES, SEED, bootstrap_ci, gap, wilcoxon_greater
from optw.outdir import replace_dir
from optw.paths import reference_dir

GROUP_ORDER = ("solomon", "cordeau", "gavalas")
GROUP_LABEL = {"solomon": "Solomon", "cordeau": "Cordeau", "gavalas": "Gavalas"}
#: Catalog tourist kind -> the paper's label (its "generated" are our validation tourists).
KIND_LABEL = {"validation": "generated", "paper": "paper", "benchmark": "benchmark"}
KIND_ORDER = ("validation", "paper", "benchmark")
REFERENCE_FILE = "paper_benchmark_scores.csv"
#: The kind of an evaluation's output folder (:mod:`optw.outdir`, marker ``.optw-evaluation``).
OUT_KIND = "evaluation"


class MissingReferenceError(OptwError, FileNotFoundError):
    """A missing reference file of the paper's scores."""


def default_reference_path() -> Path:
    """``paper_benchmark_scores.csv`` in :func:`optw.paths.reference_dir`."""
    return reference_dir() / REFERENCE_FILE


def read_reference(path: Path, columns: tuple[str, ...]) -> pd.DataFrame:
    """A reference CSV of the paper (with ``columns``) indexed by ``instance``."""
    if not path.exists():
        raise MissingReferenceError(f"reference file {path} does not exist (set "
                                    "OPTW_REFERENCE to its folder or pass the path)")
    try:
        df = pd.read_csv(path)
    except (OSError, ValueError) as exc:  # a folder, no permission, not a CSV
        raise UserError(f"cannot read reference file {path}: "
                        f"{' '.join(str(exc).split())[:200]}") from None
    if missing := [c for c in ("instance", *columns) if c not in df.columns]:
        raise UserError(f"reference file {path} lacks column(s) {missing}")
    return df.set_index("instance")


def load_best_known(path: Path | str | None = None) -> pd.Series:
    """Best-known benchmark scores per region from a reference CSV."""
    path = Path(path) if path else default_reference_path()
    return read_reference(path, ("best_known",))["best_known"].astype("float64")


def pair_with_baseline(results: pd.DataFrame, baseline: pd.DataFrame,
                       name: str = "ils") -> pd.DataFrame:
    """Attach the baseline's score and time to each result row; error on missing pairs."""
    base = baseline[["region", "tourist", "score", "seconds"]].rename(
        columns={"score": "base_score", "seconds": "base_seconds"})
    merged = results.merge(base, on=["region", "tourist"], how="left", validate="m:1")
    if len(missing := merged[merged["base_score"].isna()]):
        pairs = missing[["region", "tourist"]].drop_duplicates()
        example = ", ".join(f"({r}, {t})" for r, t in pairs.head(5).itertuples(index=False))
        regions = " ".join(sorted(pairs["region"].unique()))
        raise UserError(
            f"no stored {name} result for {len(pairs)} (region, tourist) pair(s), e.g. "
            f"{example}; compute them with `optw baseline {name} --regions {regions}`")
    return merged


def region_table(paired: pd.DataFrame, best_known: pd.Series | None = None) -> pd.DataFrame:
    """One row per (method, kind, group, region): tourists, mean scores, gaps, time, exact."""
    if "exact" not in paired.columns:
        paired = paired.assign(exact=True)
    agg = paired.groupby(["method", "kind", "group", "region"], sort=False).agg(
        tourists=("tourist", "size"), ils=("base_score", "mean"), model=("score", "mean"),
        seconds=("seconds", "mean"), ils_seconds=("base_seconds", "mean"),
        exact=("exact", "all")).reset_index()
    agg["gap_ils"] = gap(agg["ils"], agg["model"])
    agg["best_known"] = np.nan
    if best_known is not None:  # benchmark groups only: custom regions have no best-known
        bench = (agg["kind"] == "benchmark") & agg["group"].isin(GROUP_ORDER)
        if missing := sorted(set(agg.loc[bench, "region"]) - set(best_known.index)):
            raise UserError(f"no best-known score for region(s) {missing} in the reference")
        agg.loc[bench, "best_known"] = agg.loc[bench, "region"].map(best_known).astype(float)
    agg["gap_bk"] = gap(agg["best_known"], agg["model"])
    agg["ils_gap_bk"] = gap(agg["best_known"], agg["ils"])
    return sort_rows(agg)[["method", "kind", "group", "region", "tourists", "best_known",
                          "ils", "model", "gap_ils", "gap_bk", "ils_gap_bk", "seconds",
                          "ils_seconds", "exact"]]


def sort_rows(df: pd.DataFrame, orders: dict[str, Sequence] | None = None) -> pd.DataFrame:
    """Rows sorted by the columns of ``orders`` in their orders of values, then by region."""
    orders = orders or {"method": list(dict.fromkeys(df["method"])), "kind": KIND_ORDER,
                        "group": GROUP_ORDER}

    def rank(col: pd.Series) -> pd.Series:
        order = orders.get(col.name)
        return col if order is None else col.map({v: i for i, v in enumerate(order)})

    keys = [*orders, *(["region"] if "region" in df.columns else [])]
    return df.sort_values(keys, key=rank, kind="stable").reset_index(drop=True)


def summary_table(regions: pd.DataFrame, n_resamples: int = N_RESAMPLES,
                  seed: int = SEED) -> pd.DataFrame:
    """One row per (method, kind, group): means, CIs and Wilcoxon p-values over regions."""
    rows = []
    for (method, kind, group), g in regions.groupby(["method", "kind", "group"], sort=False):
        row = {"method": method, "kind": kind, "group": group, "regions": len(g),
               "tourists": int(g["tourists"].sum()),
               "best_known": g["best_known"].mean() if kind == "benchmark" else np.nan,
               "ils": g["ils"].mean(), "model": g["model"].mean()}
        for col in ("gap_ils", "gap_bk", "seconds"):
            vals = g[col].to_numpy(np.float64)
            if np.isnan(vals).any():
                row[col] = row[f"{col}_lo"] = row[f"{col}_hi"] = np.nan
                continue
            row[col] = float(vals.mean())
            row[f"{col}_lo"], row[f"{col}_hi"] = bootstrap_ci(vals, n_resamples, seed=seed)
        row["gap_ils_median"] = float(np.median(g["gap_ils"]))
        row["p_better_than_ils"] = wilcoxon_greater(g["model"], g["ils"])
        rows.append(row)
    cols = ["method", "kind", "group", "regions", "tourists", "best_known", "ils", "model",
            "gap_ils", "gap_ils_lo", "gap_ils_hi", "gap_ils_median", "gap_bk", "gap_bk_lo",
            "gap_bk_hi", "seconds", "seconds_lo", "seconds_hi", "p_better_than_ils"]
    return sort_rows(pd.DataFrame(rows, columns=cols))


def pvalue_table(regions: pd.DataFrame, baseline: str = "ils") -> pd.DataFrame:
    """Per kind and ordered pair (a, b) of methods and baseline: p of "b scores higher"."""
    rows = []
    for kind in KIND_ORDER:
        if (sub := regions[regions["kind"] == kind]).empty:
            continue
        model = sub.pivot(index="region", columns="method", values="model")
        ils = sub.pivot(index="region", columns="method", values="ils")  # paired per method
        for a, b in itertools.permutations([baseline, *dict.fromkeys(sub["method"])], 2):
            xa = ils[b] if a == baseline else model[a]
            xb = ils[a] if b == baseline else model[b]
            if not (ok := xa.notna() & xb.notna()).any():
                continue
            rows.append({
                "kind": kind, "from": a, "to": b, "regions": int(ok.sum()),
                "mean_from": float(xa[ok].mean()), "mean_to": float(xb[ok].mean()),
                "mean_improvement": float((xb[ok] - xa[ok]).mean()),
                "p_to_better": wilcoxon_greater(xb[ok], xa[ok])})
    return pd.DataFrame(rows, columns=["kind", "from", "to", "regions", "mean_from", "mean_to",
                                       "mean_improvement", "p_to_better"])


def evaluate(results: pd.DataFrame, baseline: pd.DataFrame, best_known: pd.Series | None,
             baseline_name: str = "ils", n_resamples: int = N_RESAMPLES,
             seed: int = SEED) -> dict[str, pd.DataFrame]:
    """All tables for validated ``results`` (see :mod:`optw.evaluate.results`)."""
    regions = region_table(pair_with_baseline(results, baseline, baseline_name), best_known)
    return {"summary": summary_table(regions, n_resamples, seed), "regions": regions,
            "pvalues": pvalue_table(regions, baseline_name)}


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and np.isnan(v))


def _cell(v) -> str:
    if _missing(v):
        return "-"
    if isinstance(v, (float, np.floating)):
        return f"{v:.4g}" if abs(v) < 1e-3 and v != 0 else f"{v:.2f}"
    return str(v).replace("|", "\\|")


def to_markdown(df: pd.DataFrame, formats: dict | None = None) -> str:
    """A GitHub-flavoured Markdown table; ``formats``: column -> format of present values."""
    formats = formats or {}
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(c.replace("|", "\\|") for c in cols) + " |",
             "|" + "|".join("---" for _ in cols) + "|"]
    for row in df.itertuples(index=False):
        cells = [formats[c].format(v) if c in formats and not _missing(v) else _cell(v)
                 for c, v in zip(cols, row, strict=True)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _pct(v: float) -> str:
    return "-" if _missing(v) else f"{v:.2f}%"


def _cis(s: pd.DataFrame, col: str, fmt: str = "{:.2f}%") -> list[str]:
    """``[lo, hi]`` of ``col``'s confidence interval in each row of summary ``s``."""
    return ["-" if np.isnan(lo) else f"[{fmt.format(lo)}, {fmt.format(hi)}]"
            for lo, hi in zip(s[f"{col}_lo"], s[f"{col}_hi"], strict=True)]


def paper_summary(summary: pd.DataFrame, method: str) -> pd.DataFrame:
    """The paper's group table for one method (rows "Solomon [generated]", ...)."""
    s = summary[summary["method"] == method]
    return pd.DataFrame({
        "instance group": [f"{GROUP_LABEL.get(g, g)} [{KIND_LABEL[k]}]"
                           for g, k in zip(s["group"], s["kind"], strict=True)],
        "regions": s["regions"].to_numpy(),
        "best-known (bk)": [_cell(v) for v in s["best_known"]],
        "ILS": [_cell(v) for v in s["ils"]],
        "model score": [_cell(v) for v in s["model"]],
        "gap to ILS": [_pct(v) for v in s["gap_ils"]],
        "gap to ILS [95%CI]": _cis(s, "gap_ils"),
        "median gap to ILS": [_pct(v) for v in s["gap_ils_median"]],
        "gap to bk": [_pct(v) for v in s["gap_bk"]],
        "gap to bk [95%CI]": _cis(s, "gap_bk"),
        "time [s]": [f"{v:.3f}" for v in s["seconds"]],
        "time [95%CI]": _cis(s, "seconds", "{:.3f}"),
        "p (model > ILS)": [f"{v:.2g}" for v in s["p_better_than_ils"]]})


def paper_regions(regions: pd.DataFrame, kind: str) -> pd.DataFrame:
    """Per-region detail for one tourist kind, wide over methods (like the supplement)."""
    sub = regions[regions["kind"] == kind]
    third = "best_known" if kind == "benchmark" else "tourists"
    out = sub.drop_duplicates("region")[["group", "region", third, "ils"]].reset_index(drop=True)
    out["group"] = out["group"].map(lambda g: GROUP_LABEL.get(g, g))
    for m in dict.fromkeys(sub["method"]):
        sm = sub[sub["method"] == m].set_index("region")
        out[m] = out["region"].map(sm["model"])
        out[f"{m} gap to ILS"] = out["region"].map(sm["gap_ils"]).map(_pct)
        if kind == "benchmark":
            out[f"{m} gap to bk"] = out["region"].map(sm["gap_bk"]).map(_pct)
    return out.rename(columns={"best_known": "best-known (bk)", "ils": "ILS"})


def render_markdown(tables: dict[str, pd.DataFrame]) -> dict[str, str]:
    """Markdown documents: the summary, per-region tables and the p-values."""
    summary, regions = tables["summary"], tables["regions"]
    parts = ["# Evaluation summary\n",
             "Gaps: (baseline - model) / baseline x 100, negative = better than the baseline; "
             "95% CIs: bootstrap over regions; p: one-sided Wilcoxon signed-rank test over "
             "regions. Generated = the catalog's 64 validation tourists per region; paper = "
             "the paper's own 64 generated tourists per region.\n"]
    for m in dict.fromkeys(summary["method"]):
        parts += [f"\n## {m}\n\n", to_markdown(paper_summary(summary, m))]
    docs = {"summary.md": "".join(parts)}
    for kind in KIND_ORDER:
        if (regions["kind"] == kind).any():
            docs[f"regions_{KIND_LABEL[kind]}.md"] = (
                f"# Per-region results, {KIND_LABEL[kind]} tourists\n\n"
                + to_markdown(paper_regions(regions, kind)))
    docs["pvalues.md"] = ("# Pairwise one-sided Wilcoxon signed-rank tests (H1: `to` scores "
                          "higher than `from`)\n\n" + to_markdown(
                              tables["pvalues"].assign(kind=lambda d: d["kind"].map(KIND_LABEL)),
                              {"p_to_better": "{:.3g}"}))
    return docs


def write_tables(tables: dict[str, pd.DataFrame], out_dir: Path | str,
                 docs: dict[str, str] | None = None, note: str = "",
                 option: str | None = None) -> list[Path]:
    """Write the tables (CSV) and ``docs`` (Markdown) as the folder ``out_dir``; returns them."""
    with replace_dir(out_dir, OUT_KIND, note, option=option) as tmp:
        docs = render_markdown(tables) if docs is None else docs
        for name, df in tables.items():
            df.to_csv(tmp / f"{name}.csv", index=False)
        for name, text in docs.items():
            (tmp / name).write_text(text)
    return [Path(out_dir) / n for n in [*(f"{name}.csv" for name in tables), *docs]]
