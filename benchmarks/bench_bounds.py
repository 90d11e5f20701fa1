"""Where a CPU's time goes in training and evaluation, and the most that removing every other
operation could gain.

No device needed. Three workloads, each as ``make run`` or ``bench_ops.py`` runs it:

- ``train``: t101 training epochs (K = 1 tourist × B = 32 routes: ``reinforce_step``, the
  compacted rollout, REINFORCE backward, clipping, Adam, as ``bench_ops.py`` times them) with
  ``--threads`` threads, and the same epochs with 1 thread, alternated (does the second thread
  help?);
- ``global``: one epoch of a group's global model as ``make run``'s ``quick`` profile trains
  it (8 tourists of 8 drawn regions × 16 routes, 1 thread; default group Cordeau);
- ``evaluate``: beam 8 on a region's 64 validation tourists, greedy routes kept, 1 thread
  (``make run``'s per-region evaluation).

For each: the wall time per unit (best round), then from ``torch.profiler`` (record_shapes) the
time in the matrix products (``mm``, ``addmm``, ``bmm``, oneDNN's linear, ...) with their
FLOPs, and in PyTorch's fused attention kernels; the rest is every other operation plus
Python. ``ceiling`` = wall ÷ (products + attention): the speed-up if all the rest cost
nothing. ``peak`` is the machine's own matrix-product speed on the model's shapes (a large
``[rows, 128] × [128, 256]`` product, MKL and oneDNN, best), and ``floor`` the wall time if the
products ran at that peak and nothing else cost anything::

    PYTHONPATH=platform .venv/bin/python benchmarks/bench_bounds.py
    PYTHONPATH=platform .venv/bin/python benchmarks/bench_bounds.py --quick --out bounds.json

The published weights (``--pretrained``) give trained route lengths; without them a seeded
model runs (shorter routes: the figures then say little about trained models).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from benchutil import common_options, parse_list, published_or_seeded

#: Leaf operators that are matrix products (their FLOPs from the recorded input shapes).
PRODUCTS = {"aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "aten::baddbmm",
            "aten::baddbmm_", "mkldnn::_linear_pointwise"}
#: PyTorch's fused attention kernels on the CPU (forward and backward).
ATTENTION = ("_scaled_dot_product_flash_attention_for_cpu",)


def product_flops(name: str, shapes: list[list[int]]) -> float:
    """FLOPs (2 per multiply-add) of one product from its input shapes; 0 if they are not
    what the operator takes (a product this module does not know)."""
    try:
        if name == "mkldnn::_linear_pointwise":
            # (x, w, b, ...) or, fused with an addition, (x, other, w, b, ...)
            x = shapes[0]
            w = shapes[2] if len(shapes) > 2 and len(shapes[2]) == 2 else shapes[1]
            return 2.0 * float(np.prod(x[:-1])) * x[-1] * w[0]
        a, b = (shapes[0], shapes[1]) if name in ("aten::mm", "aten::bmm") else (
            shapes[1], shapes[2])
        if len(a) == 2:
            return 2.0 * a[0] * a[1] * b[1]
        return 2.0 * a[0] * a[1] * a[2] * b[2]
    except (IndexError, TypeError):
        return 0.0


def attention_flops(name: str, shapes: list[list[int]]) -> float:
    """FLOPs of a fused attention call: q·kᵀ and p·v forward (4·B·H·M·N·d), and the five
    products of its backward (10·B·H·M·N·d, the scores recomputed)."""
    try:
        q, k = (shapes[1], shapes[2]) if name.endswith("_backward") else (shapes[0], shapes[1])
        flops = 4.0 * q[0] * q[1] * q[2] * k[2] * q[3]
    except (IndexError, TypeError):
        return 0.0
    return flops * 2.5 if name.endswith("_backward") else flops


def split_time(fn: Callable[[], Any], units: int) -> dict[str, float]:
    """Per unit (one profiled call of ``fn`` does ``units`` units): seconds in products, their
    GFLOP, seconds in fused attention and its GFLOP."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        fn()
    out = {"products_s": 0.0, "products_gflop": 0.0, "attention_s": 0.0, "attention_gflop": 0.0}
    for e in prof.events():
        name = e.name
        if name in PRODUCTS:
            out["products_s"] += e.self_cpu_time_total / 1e6
            out["products_gflop"] += product_flops(name, e.input_shapes) / 1e9
        elif any(a in name for a in ATTENTION):
            out["attention_s"] += e.self_cpu_time_total / 1e6
            out["attention_gflop"] += attention_flops(name, e.input_shapes) / 1e9
    return {k: v / units for k, v in out.items()}


def peak_gflops(threads: int, rows: int = 8192, reps: int = 20) -> float:
    """The best GFLOP/s of a ``[rows, 128] × [128, 256]`` product (the model's query/value
    projection) through MKL and, where present, oneDNN, on ``threads`` threads."""
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(rows, 128, generator=g), torch.randn(256, 128, generator=g)
    fns = [lambda: torch.nn.functional.linear(x, w)]
    op = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)
    if op is not None and torch.backends.mkldnn.is_available():
        fns.append(lambda: op(x, w, None, "none", [], ""))
    best = 0.0
    for fn in fns:
        for _ in range(3):
            fn()
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            best = max(best, 2.0 * rows * 128 * 256 * reps / (time.perf_counter() - t0) / 1e9)
    return best


def best_seconds(fn: Callable[[], Any], rounds: int) -> float:
    """The best of ``rounds`` calls of ``fn``, in seconds (other work only slows a call down)."""
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def fixed_epochs(model, instances: list, routes_per_tourist: int,
                 seed: int) -> Callable[[], None]:
    """A callable that trains one epoch on each of ``instances`` (``reinforce_step``:
    compacted rollout, REINFORCE, clipping, Adam) at lr 1e-9, each epoch's sampling seeded by
    its index: every call does the same work (the same routes; the weights hardly move), so
    timed and profiled calls compare."""
    from optw.train import TrainConfig
    from optw.train.step import make_optimizer, reinforce_step

    model.train()
    opt = make_optimizer(model, 1e-9)
    config = TrainConfig(regions=["-"], batch_size=routes_per_tourist)
    gens = [torch.Generator().manual_seed(seed + i) for i in range(len(instances))]
    ids = [torch.arange(inst.n_tourists).repeat_interleave(routes_per_tourist)
           for inst in instances]

    def run() -> None:
        for i, inst in enumerate(instances):
            gens[i].manual_seed(seed + i)
            reinforce_step(model, opt, inst, ids[i], gens[i], config, 1e-9)

    return run


def train_workload(args: argparse.Namespace) -> dict[str, Any]:
    """t101 epochs (K = 1 × B = 32) at ``--threads`` and at 1 thread, rounds alternated."""
    from optw.catalog import open_catalog, sample_tourists
    from optw.env import make_instances

    region = open_catalog(args.catalog).region(args.region)
    model, source = published_or_seeded([args.region, "t101", "pr01"], args.pretrained,
                                        args.seed)
    rng = np.random.default_rng(args.seed)
    instances = [make_instances(region, sample_tourists(region, 1, rng), "cpu")
                 for _ in range(args.epochs)]
    run = fixed_epochs(model, instances, args.batch, args.seed)
    torch.set_num_threads(args.threads)
    run()  # warm-up: caches, lazy imports
    best = {args.threads: float("inf"), 1: float("inf")}
    for _ in range(args.rounds):  # the same load for both thread counts
        for threads in best:
            torch.set_num_threads(threads)
            best[threads] = min(best[threads], best_seconds(run, 1) / len(instances))
    torch.set_num_threads(args.threads)
    split = split_time(run, len(instances))
    return {"name": f"train {args.region} B={args.batch}", "unit": "epoch", "weights": source,
            "threads": args.threads, "wall_s": best[args.threads],
            "wall_1_thread_s": best[1], **split}


def global_workload(args: argparse.Namespace) -> dict[str, Any]:
    """Epochs of ``--group``'s global model as ``quick`` trains it (1 thread)."""
    from optw.catalog import open_catalog, sample_tourists
    from optw.env import make_instances, stack_instances

    torch.set_num_threads(1)
    catalog = open_catalog(args.catalog)
    regions = [catalog.region(r) for r in catalog.list_regions(group=args.group)]
    order = ["pr01", "t101"] if args.group == "cordeau" else ["t101", "pr01"]
    model, source = published_or_seeded(order, args.pretrained, args.seed)
    rng = np.random.default_rng(args.seed)
    instances = []
    for _ in range(args.global_epochs):  # 8 tourists of 8 drawn regions, as the loop draws
        picks = np.bincount(rng.integers(len(regions), size=8), minlength=len(regions))
        instances.append(stack_instances([make_instances(regions[i], sample_tourists(
            regions[i], int(k), rng), "cpu") for i, k in enumerate(picks) if k]))
    run = fixed_epochs(model, instances, 16, args.seed)
    run()
    wall = best_seconds(run, args.rounds) / len(instances)
    split = split_time(run, len(instances))
    return {"name": f"global {args.group} 8x16", "unit": "epoch", "weights": source,
            "threads": 1, "wall_s": wall, **split}


def evaluate_workload(args: argparse.Namespace) -> dict[str, Any]:
    """Beam 8 on ``--eval-region``'s 64 validation tourists, greedy kept (1 thread)."""
    from optw.catalog import open_catalog
    from optw.decode import solve

    torch.set_num_threads(1)
    catalog = open_catalog(args.catalog)
    region = catalog.region(args.eval_region)
    tourists = catalog.validation(args.eval_region)[: args.eval_tourists]
    model, source = published_or_seeded([args.eval_region, "t101", "pr01"],
                                        args.pretrained, args.seed)
    model.eval()
    greedy = solve(model, region, tourists, "greedy")

    def search() -> None:
        solve(model, region, tourists, "beam", beams=8, keep_greedy=True, greedy=greedy)

    search()
    wall = best_seconds(search, args.rounds)
    split = split_time(search, 1)
    return {"name": f"beam 8 {args.eval_region} x{len(tourists)}", "unit": "search",
            "weights": source, "threads": 1, "wall_s": wall, **split}


def summarise(row: dict[str, Any], peak: dict[int, float]) -> dict[str, Any]:
    """Shares, GFLOP/s, ceiling and floor of one workload's row (see the module docstring)."""
    # the kernels' own time hardly changes under the profiler (its cost lands between ops)
    kernels = min(row["products_s"] + row["attention_s"], row["wall_s"])
    top = peak[row["threads"]]
    return {**row,
            "products_gflop_per_s": row["products_gflop"] / max(row["products_s"], 1e-12),
            "peak_gflop_per_s": top,
            "other_share": 1.0 - kernels / row["wall_s"],
            "ceiling_x": row["wall_s"] / max(kernels, 1e-12),
            "floor_s": (row["products_gflop"] + row["attention_gflop"]) / top}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default="train,global,evaluate",
                   help="of train, global, evaluate")
    p.add_argument("--region", default="t101", help="the training workload's region")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--threads", type=int, default=2, help="the training workload's threads")
    p.add_argument("--group", default="cordeau", help="the global workload's group")
    p.add_argument("--eval-region", default="t101")
    p.add_argument("--eval-tourists", type=int, default=64)
    p.add_argument("--epochs", type=int, default=8, help="t101 epochs (each round runs them all)")
    p.add_argument("--global-epochs", type=int, default=3, help="the global model's epochs")
    p.add_argument("--rounds", type=int, default=3)
    common_options(p)
    p.add_argument("--quick", action="store_true", help="fewer epochs, rounds and tourists")
    args = p.parse_args(argv)
    work = {"train": train_workload, "global": global_workload, "evaluate": evaluate_workload}
    names = parse_list(args.workloads, list(work), "bench_bounds", "--workloads")
    if names is None:
        return 2
    if args.quick:
        args.epochs, args.rounds = 2, 1
        args.global_epochs, args.eval_tourists = 1, min(args.eval_tourists, 8)
    print(f"bench_bounds: torch {torch.__version__}, "
          f"{torch.backends.cpu.get_cpu_capability()}", flush=True)
    peak = {t: peak_gflops(t) for t in sorted({1, args.threads})}
    print("  matrix-product peak (GFLOP/s): " + ", ".join(
        f"{t} thread{'s' * (t > 1)} {g:.0f}" for t, g in peak.items()), flush=True)
    rows = []
    for name in names:
        try:
            row = summarise(work[name](args), peak)
        except (KeyError, ValueError) as e:  # an unknown region or group, named
            print(f"bench_bounds: error: {name}: {e}", file=sys.stderr)
            return 2
        rows.append(row)
        extra = (f"; 1 thread {1 / row['wall_1_thread_s']:.2f}/s "
                 f"({row['wall_1_thread_s'] / row['wall_s']:.2f}x the time)"
                 if "wall_1_thread_s" in row else "")
        print(f"  {row['name']} ({row['weights']}, {row['threads']} thread"
              f"{'s' * (row['threads'] > 1)}): {row['wall_s'] * 1e3:.0f} ms per {row['unit']}"
              f"{extra}", flush=True)
    print(f"{'workload':28} {'wall ms':>8} {'products':>9} {'GFLOP/s':>8} {'attention':>10} "
          f"{'other':>6} {'ceiling':>8} {'floor ms':>9}")
    for r in rows:
        print(f"{r['name']:28} {r['wall_s'] * 1e3:8.0f} {r['products_s'] * 1e3:7.0f}ms "
              f"{r['products_gflop_per_s']:8.0f} {r['attention_s'] * 1e3:8.0f}ms "
              f"{r['other_share']:6.0%} {r['ceiling_x']:7.2f}x {r['floor_s'] * 1e3:9.0f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"peak_gflop_per_s": peak, "workloads": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
