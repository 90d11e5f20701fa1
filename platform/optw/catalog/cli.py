"""``optw catalog build|list|show|add|remove``."""

from __future__ import annotations

import argparse
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

from optw.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("catalog", help="build and inspect the region catalog")
    csub = p.add_subparsers(dest="catalog_command", required=True, metavar="ACTION")

    b = csub.add_parser("build", help="parse the benchmark files into Parquet")
    b.add_argument("--source", type=Path, default=None,
                   help="benchmark folder (default: $OPTW_BENCHMARKS or ../shared/benchmarks/optw)")
    b.add_argument("--out", type=Path, default=None,
                   help="catalog folder (default: $OPTW_CATALOG or region_catalog/)")
    b.add_argument("--if-missing", action="store_true",
                   help="do nothing when a current catalog already exists there")
    b.add_argument("--paper-sets", action="store_true",
                   help="also store the paper's own 64 tourists per region (tourist set "
                   "'paper'; Gavalas' exact only from a GPU, see optw.catalog.paper_sets)")
    b.add_argument("--device", default="auto",
                   help="where Gavalas' paper sets are drawn (with --paper-sets): auto (CUDA "
                   "if available), cpu, cuda or cuda:N")
    b.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    b.set_defaults(func=_build)

    ls = csub.add_parser("list", help="print the regions")
    ls.add_argument("--catalog", type=Path, default=None)
    ls.add_argument("--group", action="append", default=None,
                    help="solomon, cordeau, gavalas or a custom group (repeatable)")
    ls.add_argument("--subset", action="store_true", help="only the paper's subset of 28")
    ls.add_argument("--json", action="store_true", help="one JSON object per line")
    ls.set_defaults(func=_list)

    sh = csub.add_parser("show", help="print one region and a summary of its tourists")
    sh.add_argument("region")
    sh.add_argument("--catalog", type=Path, default=None)
    sh.add_argument("--json", action="store_true")
    sh.set_defaults(func=_show)

    ad = csub.add_parser("add", help="add your own region (points CSV or GeoJSON)",
                         description="Add a custom region from a points file; see "
                         "docs/custom-regions.md for the columns.")
    ad.add_argument("region", help="region id: a-z first, then a-z, 0-9, '_' or '-'")
    ad.add_argument("--points", type=Path, required=True,
                    help="CSV or GeoJSON: first row = start place and day, then one row per POI")
    ad.add_argument("--travel-times", type=Path, default=None,
                    help="travel-time matrix CSV in minutes (labels: place names or node "
                    "indices); default: derived from the coordinates")
    ad.add_argument("--speed-kmh", type=float, default=None,
                    help="travel speed for lat/lon points (default 4.5, walking)")
    ad.add_argument("--group", default="custom", help="group name (default: custom)")
    ad.add_argument("--replace", action="store_true", help="replace an existing custom region")
    ad.add_argument("--catalog", type=Path, default=None)
    ad.add_argument("--json", action="store_true", help="print the summary as JSON")
    ad.set_defaults(func=_add)

    rm = csub.add_parser("remove", help="remove a custom region (its stored ILS results and "
                         "demonstrations too)")
    rm.add_argument("region")
    rm.add_argument("--catalog", type=Path, default=None)
    rm.set_defaults(func=_remove)


def _add(args) -> int:
    from optw.catalog.custom import clock
    from optw.catalog.store import add_region, open_catalog

    region = add_region(args.region, args.points, args.travel_times, args.speed_kmh,
                        args.group, args.catalog, args.replace)
    cat = open_catalog(args.catalog)
    n_val = len(cat.validation(region.id))
    if args.json:
        print(dumps({
            "region": region.id, "group": region.group, "points": region.n_points,
            "coords": region.coords, "metric": region.metric,
            "travel_matrix": region.travel is not None, "speed_kmh": region.speed_kmh,
            "start": region.start_name, "t_start": region.t_start, "t_end": region.t_end,
            "t_max": region.t_max, "s_max": region.s_max, "score_kind": region.default_score_kind,
            "validation_tourists": n_val, "catalog": str(cat.path)}))
    else:
        print(f"Added region {region.id} (group {region.group}): {region.n_points} points, "
              f"{region.coords} coordinates, travel times "
              f"{'from the matrix' if region.travel is not None else region.metric}"
              f"{f' at {region.speed_kmh:g} km/h' if region.speed_kmh else ''}, day "
              f"{clock(region.t_start)}-{clock(region.t_end)} from {region.start_name!r}, "
              f"{n_val} validation tourists; catalog {cat.path}")
    return 0


def _remove(args) -> int:
    from optw.catalog.store import default_catalog_dir, remove_region

    remove_region(args.region, args.catalog)
    print(f"removed region {args.region} from {args.catalog or default_catalog_dir()}")
    return 0


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float (numpy floats too) replaced by None."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return None if isinstance(value, float) and not math.isfinite(value) else value


def dumps(obj: Any) -> str:
    """Valid JSON always: non-finite numbers become ``null``, not ``Infinity``/``NaN``."""
    return json.dumps(_finite(obj), allow_nan=False)


def _build(args) -> int:
    from optw.catalog.paper_sets import check_device
    from optw.catalog.store import (
        Catalog,
        CatalogError,
        build_catalog,
        check_catalog_dir,
        default_catalog_dir,
    )

    check_device(args.device)
    if args.device != "auto" and not args.paper_sets:
        raise UserError(f"--device {args.device}: only --paper-sets draws on a device; add "
                        "--paper-sets or leave --device out")
    if args.out is not None:
        check_catalog_dir(args.out, "--out")
    try:
        cat = Catalog(args.out) if args.if_missing else None
    except CatalogError:
        cat = None
    if cat is not None and (cat.has_paper_sets or not args.paper_sets):
        if not args.quiet:
            print(f"catalog {cat.path} is current ({len(cat)} regions); nothing to do")
        return 0
    manifest = build_catalog(args.source, args.out, progress=not args.quiet,
                             paper_sets=args.paper_sets, device=args.device)
    if not args.quiet:
        out = args.out or default_catalog_dir()
        groups = ", ".join(f"{n} {g}" for g, n in manifest["groups"].items())
        print(f"built {manifest['regions']} regions ({groups}) into {out} "
              f"in {manifest['build_seconds']:.1f} s")
        if paper := manifest.get("paper_sets"):
            approx = paper["approximate_regions"]
            print(f"paper sets: {paper['exact_regions']} of {paper['regions']} regions exact"
                  + (f"; {len(approx)} approximate (correlated scores drawn on the CPU: "
                     f"{' '.join(approx[:4])}{' …' if len(approx) > 4 else ''})" if approx else ""))
    return 0


def _row(cat, rid: str) -> dict:
    """A region's line of ``catalog list``."""
    r = cat.regions_table.loc[rid]
    return {"region": rid, "group": r["group"], "points": int(r["points"]),
            **{k: float(r[k]) for k in ("t_start", "t_end", "t_max", "s_max")},
            "score_kind": r["score_kind"], "subset": bool(r["paper_subset"]),
            "validation_tourists": int(cat.manifest["validation_size"])}


def format_table(rows: list[dict], columns: list[str]) -> str:
    """A plain aligned text table."""
    def fmt(v):
        return f"{v:g}" if isinstance(v, float) else str(v)
    cells = [[fmt(r[c]) for c in columns] for r in rows]
    widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(columns)]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True))
                     for row in [columns, ["-" * w for w in widths], *cells])


def _list(args) -> int:
    from optw.catalog.store import open_catalog

    cat = open_catalog(args.catalog)
    rows = [_row(cat, rid) for rid in cat.list_regions(args.group, args.subset)]
    if args.json:
        for r in rows:
            print(dumps(r))
        return 0
    print(format_table(rows, ["region", "group", "points", "t_start", "t_end", "t_max",
                              "s_max", "score_kind", "subset", "validation_tourists"]))
    counts = Counter(r["group"] for r in rows)
    print(f"\n{len(rows)} regions: " + ", ".join(f"{n} {g}" for g, n in counts.items()))
    return 0


def _tourist_summary(batch) -> dict:
    """Count and min/median/max times of a batch of tourists, their mean point score."""
    import numpy as np

    spread = {k: [float(f(getattr(batch, k))) for f in (np.min, np.median, np.max)]
              for k in ("t_start", "t_end")}
    return {"tourists": len(batch), **spread, "mean_score": float(batch.scores[:, 1:-1].mean())}


def _show(args) -> int:
    from optw.catalog.custom import clock
    from optw.catalog.store import open_catalog

    cat = open_catalog(args.catalog)
    region = cat.region(args.region)
    row = _row(cat, args.region)
    row.update(t_day=region.t_day, start=list(region.start_xy), decimals=region.decimals,
               source_file=region.source_file, source_sha256=region.source_hash)
    if region.is_custom:
        row.update(coords=region.coords, metric=region.metric, speed_kmh=region.speed_kmh,
                   travel_matrix=region.travel is not None, start_name=region.start_name)
    sets = {"validation": _tourist_summary(cat.validation(args.region))}
    if cat.has_paper_sets and not region.is_custom:
        sets["paper"] = {**_tourist_summary(cat.tourists(args.region, "paper")),
                         "exact": cat.paper_exact(args.region)}
    latlon = region.coords == "latlon"
    if latlon:
        lat, lon = region.to_latlon(*region.start_xy)
        row.update(start_latlon=[round(lat, 6), round(lon, 6)],
                   origin=[round(v, 6) for v in region.origin],
                   day=f"{clock(region.t_start)}-{clock(region.t_end)}")
    if args.json:
        print(dumps({**row, **sets}))
        return 0
    if latlon:  # people's units: lat/lon and clock times, not projected minutes
        for k in ("start", "t_start", "t_end", "t_max", "t_day"):
            row.pop(k)
        row["start_latlon"] = f"{row['start_latlon'][0]:.6f}, {row['start_latlon'][1]:.6f}"
        bench = f"start {row['start_latlon']} ({region.start_name}), {row['day']}"
    else:
        bench = f"start {region.start_xy}, T {region.t_start:g}-{region.t_end:g}"
    for k, v in row.items():
        print(f"{k:>20}: {v}")
    print(f"{'benchmark tourist':>20}: {bench}, total score {region.score.sum():g}")
    for name, s in sets.items():
        flag = "" if s.get("exact", True) else " (CPU approximation, not exact)"
        if latlon:
            times = (f"start min/median/max {' '.join(map(clock, s['t_start']))}; end "
                     f"{' '.join(map(clock, s['t_end']))}")
        else:
            times = f"T_start min/median/max {s['t_start']}; T_end {s['t_end']}"
        print(f"{name + ' tourists':>20}: {s['tourists']}; {times}; mean point score "
              f"{s['mean_score']:.2f}{flag}")
    return 0
