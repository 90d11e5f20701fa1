"""glibc's mmap threshold (:mod:`optw.allocator`) on the job's per-region evaluation.

Runs ``make run``'s evaluation of one model on a region (``quick``'s settings: greedy and beam
8 on the benchmark tourist and the 64 validation tourists, beam sweep 1 and 8, one thread) in
a fresh process per round, with the allocator left at glibc's default (``OPTW_MALLOC=0``) and
as the decoder sets it, rounds alternating (same load for both), and prints each process's wall,
user and kernel seconds and peak memory, with the ratios of the best rounds::

    PYTHONPATH=platform .venv/bin/python benchmarks/bench_allocator.py            # pr10, 3 rounds
    PYTHONPATH=platform .venv/bin/python benchmarks/bench_allocator.py --region t101 --rounds 2

The model is the published pr01 weights (``--weights``); routes and scores are the same in both
variants (checked).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from benchutil import PRETRAINED, WEIGHTS

VARIANTS = {"glibc default": "0", "optw.allocator": "1"}


def child(region: str, weights: str) -> None:
    """One evaluation; prints its scores and this process's times as JSON."""
    from optw.evaluate.protocol import EvaluateSettings, evaluate_model
    from optw.paths import catalog_dir

    settings = EvaluateSettings(beams=8, beam_sweep=[1, 8], validation_tourists=64)
    t0 = time.perf_counter()
    rows, _ = evaluate_model(weights, [region], "m", settings, str(catalog_dir()))
    wall = time.perf_counter() - t0
    use = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"wall": wall, "user": use.ru_utime, "sys": use.ru_stime,
                      "peak_mb": use.ru_maxrss / 1024, "scores": [r["score"] for r in rows]}))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--region", default="pr10")
    p.add_argument("--weights", type=Path, default=PRETRAINED / WEIGHTS["pr01"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.region, str(args.weights))
        return 0
    if not args.weights.is_file():
        print(f"bench_allocator: error: --weights {args.weights}: no such file", file=sys.stderr)
        return 2
    print(f"bench_allocator: evaluation of {args.weights.name} on {args.region} (greedy + beam 8, "
          f"64 validation tourists, 1 thread), {args.rounds} rounds, a fresh process each")
    runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    cmd = [sys.executable, __file__, "--child", "--region", args.region,
           "--weights", str(args.weights)]
    for k in range(args.rounds):
        for name, flag in VARIANTS.items():
            env = {**os.environ, "OPTW_MALLOC": flag}
            env.pop("MALLOC_MMAP_THRESHOLD_", None)
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            res = json.loads(out.stdout.strip().splitlines()[-1])
            runs[name].append(res)
            print(f"  round {k + 1} {name:15} wall {res['wall']:6.2f} s  user {res['user']:6.2f} s"
                  f"  sys {res['sys']:5.2f} s  peak {res['peak_mb']:6.0f} MB", flush=True)
    base, new = (min(runs[v], key=lambda r: r["wall"]) for v in VARIANTS)
    same = all(r["scores"] == runs["glibc default"][0]["scores"] for rs in runs.values()
               for r in rs)
    print(f"best rounds: wall x{base['wall'] / new['wall']:.2f} faster, kernel time "
          f"{base['sys']:.2f} -> {new['sys']:.2f} s, peak {base['peak_mb']:.0f} -> "
          f"{new['peak_mb']:.0f} MB; scores identical: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
