"""×8 coordinate-symmetry augmentation at evaluation (POMO's), measured on a group's release.

Each validation tourist is decoded on the eight isometries of the plane (the symmetries of a
square about the centre of the region's bounding box: identity, mirrors, quarter turns) of its
node coordinates; travel times, windows and scores do not change, so every route stays the
same route, and the best of the eight is kept. Greedy and beam search (the beam keeps the
greedy route when it is better, as ``optw.decode.solve`` does) are compared plain and ×8, as %
above the ILS mean on the same tourists, and ×8 beam against a plain beam eight times as wide
(about the same CPU time); every kept route goes through the route validator.
Euclidean regions only (a lat/lon or matrix region is not symmetric in its coordinates)::

    .venv/bin/python benchmarks/bench_augment.py --group solomon
    .venv/bin/python benchmarks/bench_augment.py --group cordeau --regions pr01,pr05 --tourists 16
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
#: the eight isometries of the square, as (swap x and y, sign of x, sign of y)
SYMMETRIES = [(swap, sx, sy) for swap in (False, True) for sx in (1, -1) for sy in (1, -1)]


def validated(region: Any, tourists: Any, found: list[list[int]], claimed: Any) -> None:
    """Every route through the route validator, its claimed score checked too."""
    from optw.env.validate import check_route

    for k, (r, c) in enumerate(zip(found, claimed, strict=True)):
        check_route(region, r, tourists, k, claimed_score=float(c)).raise_if_invalid(
            f"{region.id} tourist {k}'s route")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--group", required=True, help="a group with a release")
    p.add_argument("--regions", help="comma-separated regions (default: the pretraining "
                                     "profile's curve regions of the group)")
    p.add_argument("--tourists", type=int, default=64, help="validation tourists per region")
    p.add_argument("--beams", type=int, default=8)
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT / "platform"))
    import torch

    from optw.catalog import open_catalog
    from optw.decode.beam import beam_search
    from optw.decode.core import greedy_routes
    from optw.distributed.pretrain import ils_means, load_pretrain_profile
    from optw.env.instances import make_instances
    from optw.model.release import load_release

    torch.set_num_threads(1)
    catalog = open_catalog()
    model, manifest = load_release(args.group)
    model.eval()
    regions = (args.regions.split(",") if args.regions
               else load_pretrain_profile()[1].curve_regions[args.group])
    ils = ils_means(catalog, regions, args.tourists)
    print(f"{args.group} release v{manifest['version']}, {args.tourists} validation tourists, "
          f"beam {args.beams}; % above ILS (plain -> x8), CPU seconds (plain, x8)")
    rows = []
    for rid in regions:
        region = catalog.region(rid)
        if region.metric != "euclidean" or region.travel is not None:
            raise SystemExit(f"{rid}: not a Euclidean region; augmentation does not apply")
        val = catalog.validation(rid)[:args.tourists]
        inst = make_instances(region, val)
        xy = inst.static[..., :2]
        centre = (xy.amin(dim=(0, 1)) + xy.amax(dim=(0, 1))) / 2
        score = inst.scores.double()
        validate = functools.partial(validated, region, val)
        best = {m: np.full((len(SYMMETRIES), len(val)), -np.inf) for m in ("greedy", "beam")}
        routes: dict[str, list[list[list[int]]]] = {"greedy": [], "beam": []}
        seconds = np.zeros(len(SYMMETRIES))
        for a, (swap, sx, sy) in enumerate(SYMMETRIES):
            u = xy - centre
            if swap:
                u = u.flip(-1)
            static = inst.static.clone()
            static[..., :2] = u * torch.tensor([sx, sy], dtype=u.dtype) + centre
            aug = dataclasses.replace(inst, static=static)
            t0 = time.process_time()
            g = greedy_routes(model, aug)
            beam = beam_search(model, aug, args.beams)
            seconds[a] = time.process_time() - t0
            g_score = np.array([float(score[k, r].sum()) for k, r in enumerate(g)])
            b, b_score = beam.routes, np.array(beam.scores)
            best["greedy"][a] = g_score
            best["beam"][a] = np.maximum(b_score, g_score)  # the beam keeps a better greedy
            routes["greedy"].append(g)
            routes["beam"].append([br if bs >= gs else gr for br, gr, bs, gs
                                   in zip(b, g, b_score, g_score, strict=True)])
        row = {"region": rid}
        for m in ("greedy", "beam"):
            pick = best[m].argmax(0)  # every kept route, through the validator
            validate([routes[m][a][k] for k, a in enumerate(pick)],
                     [best[m][a, k] for k, a in enumerate(pick)])
            row[m] = 100 * (best[m][0].mean() / ils[rid] - 1)
            row[f"{m}_x8"] = 100 * (best[m].max(0).mean() / ils[rid] - 1)
        row["s"], row["s_x8"] = seconds[0], seconds.sum()
        t0 = time.process_time()
        wide = beam_search(model, inst, 8 * args.beams)
        row["s_wide"] = time.process_time() - t0
        wide_score = np.array(wide.scores)
        validate(wide.routes, wide_score)
        wide_kept = np.maximum(wide_score, best["greedy"][0])
        row["beam_wide"] = 100 * (wide_kept.mean() / ils[rid] - 1)
        rows.append(row)
        print(f"{rid:>8}: greedy {row['greedy']:+.2f} -> {row['greedy_x8']:+.2f} %, "
              f"beam {row['beam']:+.2f} -> {row['beam_x8']:+.2f} %, "
              f"{row['s']:.1f} s -> {row['s_x8']:.1f} s; beam {8 * args.beams} "
              f"{row['beam_wide']:+.2f} %, {row['s_wide']:.1f} s")
    med = {k: float(np.median([r[k] for r in rows])) for k in rows[0] if k != "region"}
    print(f"{'median':>8}: greedy {med['greedy']:+.2f} -> {med['greedy_x8']:+.2f} %, "
          f"beam {med['beam']:+.2f} -> {med['beam_x8']:+.2f} %; beam {8 * args.beams} "
          f"{med['beam_wide']:+.2f} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
