"""``optw baseline ils|clear``: compute and store the ILS baseline; clear the stores."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def _names(values: list[str] | None) -> list[str] | None:
    """Accept ``--regions a b``, ``--regions a,b`` and repeated flags."""
    return [v for item in values for v in item.split(",") if v] if values else None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("baseline", help="compute and store baseline results (ILS)")
    bsub = p.add_subparsers(dest="baseline_command", required=True, metavar="BASELINE")
    ils = bsub.add_parser(
        "ils", help="Iterated Local Search (Vansteenwegen et al., 2009)",
        description="Solve the catalog's tourists with ILS and store the results in "
        "<catalog>/baselines/ils.parquet (the paper's sets in ils_paper.parquet); pairs "
        "already stored are not recomputed.")
    ils.add_argument("--regions", nargs="+", action="extend", default=None, metavar="ID",
                     help="region ids (default: all)")
    ils.add_argument("--groups", nargs="+", action="extend", default=None, metavar="GROUP",
                     help="solomon, cordeau and/or gavalas (default: all)")
    ils.add_argument("--tourists", choices=("benchmark", "validation", "paper", "all"),
                     default="all", help="which tourists (paper: the paper's own sets, in a "
                     "catalog built with --paper-sets; all: every kind the catalog holds)")
    ils.add_argument("--json", action="store_true",
                     help="print one JSON object per tourist (stored ones too)")
    ils.add_argument("--catalog", type=Path, default=None,
                     help="catalog folder (default: $OPTW_CATALOG or region_catalog/)")
    ils.add_argument("--workers", type=int, default=None,
                     help="parallel Ray workers (default: CPU count; 1 runs in-process)")
    ils.add_argument("--force", action="store_true", help="recompute stored pairs too")
    ils.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    ils.set_defaults(func=_ils)

    clear = bsub.add_parser(
        "clear", help="clear stored ILS results and/or demonstrations",
        description="Remove the stores of <catalog>/baselines/ (ils: ils.parquet and "
        "ils_paper.parquet; demos: demos.parquet), or with --regions only those regions' rows; "
        "what they held is computed again when next needed. An unreadable store can only be "
        "cleared whole. Nothing else in the folder is touched.")
    clear.add_argument("--store", choices=("ils", "demos", "all"), default="all",
                       help="which store (default: all)")
    clear.add_argument("--regions", nargs="+", action="extend", default=None, metavar="ID",
                       help="only these regions' rows (default: the whole store)")
    clear.add_argument("--catalog", type=Path, default=None,
                       help="catalog folder (default: $OPTW_CATALOG or region_catalog/)")
    clear.set_defaults(func=_clear)


def _record(row: dict, cached: bool) -> dict:
    return {"region": row["region"], "tourist": int(row["tourist"]), "kind": row["kind"],
            "score": float(row["score"]), "route": [int(v) for v in row["route"]],
            "seconds": float(row["seconds"]), "iterations": int(row["iterations"]),
            "cached": cached}


def _ils(args) -> int:
    from optw.baselines.store import run_ils_baseline
    from optw.errors import UserError

    limit = max(64, 4 * (os.cpu_count() or 1))  # local Ray workers: four per CPU, at least 64
    if args.workers is not None and not 1 <= args.workers <= limit:
        raise UserError(f"--workers {args.workers}: expected 1..{limit} (a local Ray worker "
                        f"process each; this machine has {os.cpu_count() or 1} CPUs)")
    emit = None
    if args.json:
        def emit(row: dict) -> None:
            print(json.dumps(_record(row, cached=False)), flush=True)
    run = run_ils_baseline(
        args.catalog, regions=_names(args.regions), groups=_names(args.groups),
        tourists=args.tourists, workers=args.workers, progress=not args.quiet,
        force=args.force, on_result=emit)
    df = run.results
    if args.json:
        for row in df.to_dict("records"):
            if (row["region"], row["tourist"]) not in run.new_keys:
                print(json.dumps(_record(row, cached=True)))
    if args.json or args.quiet:
        return 0
    from optw.catalog.store import open_catalog

    cat = open_catalog(args.catalog)
    df = df.assign(group=df["region"].map(cat.regions_table["group"]), ms=df["seconds"] * 1000)
    print(df.groupby(["group", "kind"]).agg(
        regions=("region", "nunique"), tourists=("tourist", "size"),
        mean_score=("score", "mean"), median_ms=("ms", "median")).round(2).to_string())
    paper = sorted(set(df.loc[df["kind"] == "paper", "region"]))
    if approx := [r for r in paper if not cat.paper_exact(r)]:
        print(f"\nnot exact: the paper sets of {len(approx)} region(s) are the CPU "
              f"approximation ({' '.join(approx[:6])}{' …' if len(approx) > 6 else ''})")
    print(f"\n{run.computed} computed, {run.cached} already stored; {run.seconds:.1f} s; "
          f"store {', '.join(map(str, run.paths))}")
    return 0


def _clear(args) -> int:
    from optw.baselines.store import STORES, clear_stores
    from optw.catalog.store import open_catalog

    cat = open_catalog(args.catalog)  # a catalog folder, not any folder
    stores = tuple(STORES) if args.store == "all" else (args.store,)
    done = clear_stores(cat.path, stores, _names(args.regions))
    for path, rows in done:
        print(f"removed {path}" if rows is None else f"removed {rows} row(s) of "
              f"{', '.join(_names(args.regions) or [])} from {path}")
    if not done:
        print(f"nothing to clear in {cat.path / 'baselines'}")
    return 0
