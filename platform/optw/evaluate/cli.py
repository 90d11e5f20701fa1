"""``optw evaluate``: the paper's tables from a results table and the stored baseline."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from optw.errors import UserError

#: Baselines the evaluation can compare against.
BASELINES = ("ils",)
#: Most bootstrap resamples (``--resamples``): each is a mean over regions, kept in memory.
MAX_RESAMPLES = 1_000_000


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "evaluate", help="paper-style tables (gaps, bootstrap CIs, Wilcoxon) from results",
        description="Turn a results table (CSV, Parquet or JSON lines as `optw solve --json` "
        "prints, '-' for standard input; columns region, tourist, method, score, seconds; "
        "optional route) into the paper's group and per-region tables, compared with the "
        "stored baseline results. --against-paper holds ours (stored ILS results and the "
        "results' methods) against the paper's own tables instead.")
    p.add_argument("--results", type=Path, default=None, metavar="FILE",
                   help="results table (required unless --against-paper)")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default: outputs/evaluate/<results file stem>): new, "
                   "empty or an earlier evaluation's, whose tables are replaced (other files "
                   "there stay); a file, a folder of other files or of another command's "
                   "output is refused")
    p.add_argument("--baseline", default="ils", help=f"baseline, one of {list(BASELINES)}")
    p.add_argument("--methods", nargs="+", action="extend", default=None, metavar="NAME",
                   help="only these methods of the results table")
    p.add_argument("--catalog", type=Path, default=None,
                   help="catalog folder (default: $OPTW_CATALOG or region_catalog/)")
    p.add_argument("--reference", type=Path, default=None,
                   help="best-known scores CSV (default: $OPTW_REFERENCE/"
                   "paper_benchmark_scores.csv or ../shared/reference/)")
    p.add_argument("--resamples", type=int, default=10_000,
                   help=f"bootstrap resamples, 1..{MAX_RESAMPLES:,}")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (>= 0)")
    p.add_argument("--against-paper", action="store_true",
                   help="tables of ours beside the paper's columns: the paper's own tourists "
                   "against paper_generated_scores.csv, the benchmark tourist against "
                   "paper_benchmark_scores.csv (ILS from the store; methods of --results)")
    p.add_argument("--paper-column", action="append", default=None, metavar="NAME=COLUMN",
                   help="compare our method NAME with the paper's COLUMN (ils, global_ft, "
                   "model, model_as), e.g. beam=model; same names match by themselves")
    p.add_argument("--paper-dir", type=Path, default=None, metavar="DIR",
                   help="folder of the paper's tables (default: $OPTW_REFERENCE or "
                   "../shared/reference)")
    p.add_argument("--quiet", action="store_true", help="print nothing on success")
    p.set_defaults(func=_evaluate)


def _evaluate(args) -> int:
    from optw.baselines.store import load_ils_results
    from optw.catalog.store import open_catalog
    from optw.evaluate import tables
    from optw.evaluate.results import load_results

    if args.baseline not in BASELINES:
        raise UserError(f"unknown baseline {args.baseline!r}; known: {list(BASELINES)}")
    if not 1 <= args.resamples <= MAX_RESAMPLES:
        raise UserError(f"--resamples {args.resamples}: expected 1..{MAX_RESAMPLES}")
    if args.seed < 0:
        raise UserError(f"--seed {args.seed}: expected an integer >= 0")
    if args.results is None and not args.against_paper:
        raise UserError("--results FILE is required (or --against-paper)")
    out = _out_dir(args)
    if args.against_paper:
        return _against_paper(args, out)
    cat = open_catalog(args.catalog)
    results = load_results(args.results, cat, args.baseline, args.methods)
    reference = args.reference or tables.default_reference_path()
    no_reference = args.reference is None and not reference.exists()
    if no_reference:
        print(f"warning: no reference file at {reference}; gaps to best-known are left out",
              file=sys.stderr)
    best_known = None if no_reference else tables.load_best_known(reference)
    found = tables.evaluate(results, load_ils_results(cat.path), best_known, args.baseline,
                            args.resamples, args.seed)
    paths = tables.write_tables(found, out, note=f"of {args.results}",
                                option="--out" if args.out is not None else None)
    if not args.quiet:
        print(tables.render_markdown(found)["summary.md"])
        print(f"wrote {len(paths)} files to {out}")
    return 0


def _against_paper(args, out: Path) -> int:
    """``optw evaluate --against-paper``: ours beside the paper's columns."""
    from optw.baselines.store import load_ils_results
    from optw.catalog.store import open_catalog
    from optw.evaluate import paper
    from optw.evaluate.results import load_results
    from optw.evaluate.tables import to_markdown, write_tables

    columns = paper.parse_column_map(args.paper_column)
    scores = paper.load_paper_scores(args.paper_dir)
    cat = open_catalog(args.catalog)
    results = (load_results(args.results, cat, args.baseline, args.methods)
               if args.results is not None else None)
    paper.check_column_names(
        columns, sorted(set(results["method"])) if results is not None else [],
        None if args.results is None else str(args.results))
    ils = load_ils_results(cat.path)
    if results is not None:  # ILS of the same regions and tourist kinds only
        keys = set(zip(results["region"], results["kind"], strict=True))
        ils = ils[[k in keys for k in zip(ils["region"], ils["kind"], strict=True)]]
    regions = set(ils["region"]) | set(results["region"] if results is not None else ())
    exact = {r: cat.paper_exact(r) for r in regions} if cat.has_paper_sets else {}
    ours = paper.ours_from_results(results, ils, exact, cat.regions_table["group"].to_dict())
    tables = paper.against_paper(ours, scores, columns)
    if tables["paper_groups"].empty:
        raise UserError("nothing to hold against the paper: no stored ILS result of the paper's "
                         "sets or the benchmark tourists and no result of a method with a paper "
                         "column, in a region of the paper's tables (run `optw baseline ils "
                         "--tourists paper`, or map a method with --paper-column NAME=COLUMN)")
    paths = write_tables(tables, out, {"against_paper.md": paper.render_against_paper(tables)},
                         note="against the paper", option="--out" if args.out is not None else None)
    if not args.quiet:
        print("# Against the paper, per group\n")
        print(to_markdown(paper.group_view(tables["paper_groups"])))
        print(f"per region: {out / 'against_paper.md'}; wrote {len(paths)} files to {out}")
    return 0


def _out_dir(args) -> Path:
    """``--out``, else ``outputs/evaluate/<results stem>[-against-paper]``, checked early."""
    from optw.evaluate.tables import OUT_KIND
    from optw.outdir import OutDirError, check_out_dir

    if args.out is not None:
        check_out_dir(args.out, OUT_KIND, option="--out")
        return args.out
    if not args.against_paper:
        name = args.results.stem
    elif args.results is not None and str(args.results) != "-":
        name = f"{args.results.stem}-against-paper"
    else:
        name = "against-paper"
    out = Path("outputs") / "evaluate" / name
    try:
        check_out_dir(out, OUT_KIND)
    except OutDirError as exc:
        raise OutDirError(exc.path, f"{exc.reason}; or give --out DIR") from None
    return out
