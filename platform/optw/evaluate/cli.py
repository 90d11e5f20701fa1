"""``optw evaluate``: the paper's tables from a results table and the stored baseline."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

#: Baselines the evaluation can compare against.
BASELINES = ("ils",)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "evaluate", help="paper-style tables (gaps, bootstrap CIs, Wilcoxon) from results",
        description="Turn a results table (CSV or Parquet; columns region, tourist, method, "
        "score, seconds; optional route) into the paper's group and per-region tables, "
        "compared with the stored baseline results.",
    )
    p.add_argument("--results", type=Path, required=True, metavar="FILE")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default: outputs/evaluate/<results file stem>)")
    p.add_argument("--baseline", default="ils", help=f"baseline, one of {list(BASELINES)}")
    p.add_argument("--methods", nargs="+", action="extend", default=None, metavar="NAME",
                   help="only these methods of the results table")
    p.add_argument("--catalog", type=Path, default=None,
                   help="catalog folder (default: $OPTW_CATALOG or region_catalog/)")
    p.add_argument("--reference", type=Path, default=None,
                   help="best-known scores CSV (default: $OPTW_REFERENCE/"
                   "paper_benchmark_scores.csv or ../shared/reference/)")
    p.add_argument("--resamples", type=int, default=10_000, help="bootstrap resamples")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    p.add_argument("--quiet", action="store_true", help="print nothing on success")
    p.set_defaults(func=_evaluate)


def _evaluate(args) -> int:
    from optw.baselines.store import load_ils_results
    from optw.catalog.store import open_catalog
    from optw.evaluate.results import load_results
    from optw.evaluate.tables import (
        default_reference_path,
        evaluate,
        load_best_known,
        render_markdown,
        write_tables,
    )

    if args.baseline not in BASELINES:
        raise ValueError(f"unknown baseline {args.baseline!r}; known: {list(BASELINES)}")
    if args.resamples < 1:
        raise ValueError(f"--resamples must be >= 1, got {args.resamples}")
    cat = open_catalog(args.catalog)
    results = load_results(args.results, cat, args.baseline, args.methods)
    reference = args.reference or default_reference_path()
    if args.reference is None and not reference.exists():
        print(f"warning: no reference file at {reference}; gaps to best-known are left out",
              file=sys.stderr)
        best_known = None
    else:
        best_known = load_best_known(reference)
    baseline = load_ils_results(cat.path)
    tables = evaluate(results, baseline, best_known, args.baseline, args.resamples, args.seed)
    out = args.out or Path("outputs") / "evaluate" / args.results.stem
    paths = write_tables(tables, out)
    if not args.quiet:
        print(render_markdown(tables)["summary.md"])
        print(f"wrote {len(paths)} files to {out}")
    return 0
