"""Median ILS run time per tourist, per group and tourist kind (one core, in-process).

    .venv/bin/python benchmarks/bench_ils.py [--validation 8] [--groups solomon ...]

The numba kernels are compiled (or loaded from the cache) before timing; each tourist is
solved once with :func:`optw.baselines.solve_ils` and its ``seconds`` (preparation included)
recorded. The target is a median of at most 50 ms per tourist on a 100-point Solomon region.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--catalog", default=None)
    parser.add_argument("--groups", nargs="+", default=None)
    parser.add_argument("--validation", type=int, default=8,
                        help="validation tourists per region (default 8; 0 = none)")
    args = parser.parse_args(argv)

    from optw.baselines.ils import solve_ils, warm_up
    from optw.catalog import open_catalog

    t0 = time.perf_counter()
    warm_up()
    print(f"numba warm-up {time.perf_counter() - t0:.2f} s")
    cat = open_catalog(args.catalog)
    ms: dict[tuple[str, str], list[float]] = {}
    t0 = time.perf_counter()
    for rid in cat.list_regions(args.groups):
        region = cat.region(rid)
        ms.setdefault((region.group, "benchmark"), []).append(solve_ils(region).seconds * 1e3)
        val = cat.validation(rid)
        for i in range(min(args.validation, len(val))):
            ms.setdefault((region.group, "validation"), []).append(
                solve_ils(region, val, i).seconds * 1e3)
    total = time.perf_counter() - t0
    print(f"{'group':<9} {'kind':<11} {'tourists':>8} {'median ms':>10} {'p90 ms':>8} "
          f"{'max ms':>8}")
    for (group, kind), v in sorted(ms.items()):
        a = np.asarray(v)
        print(f"{group:<9} {kind:<11} {a.size:>8} {np.median(a):>10.2f} "
              f"{np.percentile(a, 90):>8.2f} {a.max():>8.2f}")
    print(f"{sum(len(v) for v in ms.values())} tourists in {total:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
