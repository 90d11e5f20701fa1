"""The CUDA path, checked and measured on a GPU machine: needs only torch, numpy and pyarrow.

Runs from the source tree on a machine without Ray or MLflow (torch 2.11 or 2.13)::

    PYTHONPATH=platform python benchmarks/gpu_check.py --out OUT \\
        [--catalog region_catalog] [--pretrained ../shared/reference/pretrained]

Checks (each PASS or FAIL with its figures; everything also in ``OUT/gpu_check.json``):

1. ``published``: the authors' weights, beam 128 in published-outputs mode, on the device:
   pr01 -> 308 and t101 -> 399 with the CPU's routes;
2. ``greedy``: greedy routes on the device equal the CPU's on the 64 validation tourists of pr01
   and t101;
3. ``static``: the static-shape training rollout samples the compacted decoder's routes on the
   device from the same generator (pr01, t101);
4. ``learns``: a short training run on the device raises pr01's greedy validation score;
5. ``pack``: a pack of three per-region models trained side by side on the device samples the
   same routes as each trained alone there, with weights equal within rounding;
6. ``graph`` (CUDA only): the opt-in CUDA-graph training step (``rollout = "graph"``) replays
   what the same steps compute eagerly from the same random state, and learns.

Figures, device beside CPU: training epochs/s on t101 (B = 32, from scratch; on CUDA also with
``rollout = "graph"``), beam-128 latency of the compacted search on t101's benchmark tourist
(with the ops it dispatches), and the device's peak memory for each; on the device: per
training rollout (compact, static, and on CUDA graph; t101, B = 32, published weights) the ops
dispatched and kernels launched per epoch, the GPU busy fraction and epochs/s (``ops_t101``);
sampled routes/s at B = 512 and K = 64 x 32 with the rollout training chooses there
(``routes_t101``); the summed region-epochs/s of all 56 Solomon regions trained in packs (of 14
and of 56). Exit code 1 when a check fails, 2 when CUDA is missing. ``--device cpu`` is a dry
run (``graph`` skipped). ``tests/test_gpu.py`` runs the checks under pytest where CUDA exists;
``docs/gpu.md`` says how to run this on the lent device.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from benchutil import PUBLISHED_SCORES, WEIGHTS, sync

ROOT = Path(__file__).resolve().parents[1]


def _peak_reset(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _peak_mb(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None


def check_published(catalog, pretrained: Path, device: torch.device) -> dict[str, Any]:
    """Beam 128, published-outputs mode: the scores and routes of the CPU on ``device``."""
    from optw.decode import PAPER_BEAMS, solve
    from optw.model import load_model

    out: dict[str, Any] = {"ok": True}
    for rid, score in PUBLISHED_SCORES.items():
        region, bench = catalog.region(rid), catalog.benchmark(rid)
        cpu = solve(load_model(pretrained / WEIGHTS[rid]), region, bench, "beam",
                    beams=PAPER_BEAMS, keep_greedy=False)[0]
        model = load_model(pretrained / WEIGHTS[rid], map_location=device)
        dev = solve(model, region, bench, "beam", beams=PAPER_BEAMS, keep_greedy=False)[0]
        ok = dev.score == score and dev.route == cpu.route
        out[rid] = {"score": dev.score, "expected": score, "same_route_as_cpu": dev.route ==
                    cpu.route, "ok": ok}
        out["ok"] &= ok
    return out


def check_greedy(catalog, pretrained: Path, device: torch.device) -> dict[str, Any]:
    """Greedy routes on ``device`` equal the CPU's on each region's 64 validation tourists."""
    from optw.decode import solve
    from optw.model import load_model

    out: dict[str, Any] = {"ok": True}
    for rid in PUBLISHED_SCORES:
        region, val = catalog.region(rid), catalog.validation(rid)
        cpu = solve(load_model(pretrained / WEIGHTS[rid]), region, val, "greedy")
        dev = solve(load_model(pretrained / WEIGHTS[rid], map_location=device), region, val,
                    "greedy")
        same = sum(a.route == b.route for a, b in zip(cpu, dev, strict=True))
        out[rid] = {"tourists": len(val), "same_routes": same, "ok": same == len(val)}
        out["ok"] &= same == len(val)
    return out


def check_learns(catalog, device: torch.device, epochs: int = 300,
                 rollout: str = "auto") -> dict[str, Any]:
    """A short run from scratch on ``device`` with training's ``rollout`` raises pr01's greedy
    validation score by >10%."""
    from optw.train import TrainConfig, train

    cfg = TrainConfig(regions=["pr01"], epochs=epochs, batch_size=32, lr=1e-3, val_every=0,
                      val_tourists=32, checkpoint_every=0, seed=7, device=str(device),
                      rollout=rollout)
    before = train(cfg.replace(epochs=1, lr=1e-12), catalog).last_validation["val_score"]
    t0 = time.perf_counter()
    after = train(cfg, catalog).last_validation["val_score"]
    seconds = time.perf_counter() - t0
    return {"before": before, "after": after, "epochs": epochs, "seconds": seconds,
            "ok": after > before * 1.1}


def check_graph(catalog, pretrained: Path, device: torch.device,
                epochs: int = 300) -> dict[str, Any]:
    """Rollout ``graph`` (opt-in: the epoch's forward and backward replayed as a CUDA graph):
    a replayed epoch gives the rewards, loss and clipped gradients that the same steps give
    eagerly from the same random state (t101, B = 32, published weights, lr 0), and a run from
    scratch learns as ``learns`` asks."""
    import numpy as np

    from optw.catalog import sample_tourists
    from optw.decode.core import route_reward
    from optw.decode.reinforce import reinforce_loss
    from optw.decode.static import static_rollout
    from optw.env import make_instances
    from optw.model import load_model
    from optw.train import TrainConfig
    from optw.train.graphed import WARMUP, GraphedStep
    from optw.train.step import clip_gradients

    model = load_model(pretrained / WEIGHTS["t101"], map_location=device).train()
    cfg = TrainConfig(regions=["t101"], batch_size=32)
    region, rng = catalog.region("t101"), np.random.default_rng(5)
    ids = torch.zeros(32, dtype=torch.long, device=device)
    params = list(model.parameters())
    step = GraphedStep(model, torch.optim.Adam(params, lr=0.0), cfg, ids)

    def tourist():
        return make_instances(region, sample_tourists(region, 1, rng, cfg.score_kind), device)

    first_s = []
    for _ in range(WARMUP + 1):  # eager warm-up epochs, then the first capture
        t0 = time.perf_counter()
        step(tourist(), 0.0)
        sync(device)
        first_s.append(round(time.perf_counter() - t0, 2))
    x = tourist()
    for _ in range(3):  # a replay that grew S ran twice: take one that ran once
        before = step.recaptures
        torch.cuda.manual_seed(11)
        rl, _ = step(x, 0.0)
        if step.recaptures == before:
            break
    graph = (rl.reward.clone(), float(rl.loss), [p.grad.clone() for p in params])
    steps = step.steps[x.n_nodes]
    torch.cuda.manual_seed(11)
    model.zero_grad(set_to_none=True)
    routes, lp, ent = static_rollout(model, x, ids, sampling="free", steps=steps)
    eager = reinforce_loss(route_reward(x, ids, routes), lp, ent, 32, cfg.beta)
    eager.loss.backward()
    clip_gradients(params, cfg.max_grad_norm)
    same = bool(torch.equal(graph[0], eager.reward))
    loss_diff = abs(graph[1] - float(eager.loss))
    grad_diff = max(float((g - p.grad).abs().max() / (p.grad.abs().max() + 1e-6))
                    for g, p in zip(graph[2], params, strict=True))
    # where an epoch's time goes: the replay alone, against a whole epoch (tourists, copies,
    # replay, the done read, clipping and Adam)
    timing: dict[str, float] = {}
    for name, fn in (("replay_ms", step.captures[(x.n_nodes, steps)].graph.replay),
                     ("epoch_ms", lambda: step(tourist(), 0.0))):
        fn()
        sync(device)
        t0 = time.perf_counter()
        for _ in range(20):
            fn()
        sync(device)
        timing[name] = (time.perf_counter() - t0) / 20 * 1e3
    learns = check_learns(catalog, device, epochs, rollout="graph")
    ok = same and loss_diff < 1e-4 and grad_diff < 1e-3 and learns["ok"]
    return {"steps": steps, "recaptures": step.recaptures, "same_rewards": same,
            "loss_diff": loss_diff, "max_rel_grad_diff": grad_diff, **timing,
            "warmup_epoch_s": first_s, "learns": learns, "ok": ok}


def check_static(catalog, pretrained: Path, device: torch.device) -> dict[str, Any]:
    """On ``device``, the static-shape training rollout (CUDA's default) samples the routes the
    compacted one samples from the same generator (32 routes of 2 validation tourists, pr01
    and t101, published weights), log-probs within 1e-3."""
    from optw.decode import Rollout, rollout
    from optw.decode.static import static_rollout
    from optw.env import make_instances
    from optw.model import load_model

    out: dict[str, Any] = {"ok": True}
    for rid in PUBLISHED_SCORES:
        model = load_model(pretrained / WEIGHTS[rid], map_location=device)
        inst = make_instances(catalog.region(rid), catalog.validation(rid)[:2], device)
        ids = torch.arange(2, device=device).repeat_interleave(16)
        with torch.no_grad():
            a = rollout(model, inst, ids,
                        generator=torch.Generator(device=device).manual_seed(3))
            b = Rollout.of(inst, ids, *static_rollout(
                model, inst, ids, generator=torch.Generator(device=device).manual_seed(3)))
        same = bool(torch.equal(a.routes, b.routes))
        diff = float((a.log_prob - b.log_prob).abs().max()) if same else None
        ok = same and diff is not None and diff < 1e-3
        out[rid] = {"same_routes": same, "max_log_prob_diff": diff, "ok": ok}
        out["ok"] &= ok
    return out


def check_pack(catalog, device: torch.device, epochs: int = 4) -> dict[str, Any]:
    """A pack of three per-region models trained side by side on ``device`` samples the same
    routes as each model trained alone on it (equal mean rewards every epoch) and ends with
    weights equal within rounding; the members come back on the device."""
    from optw.train import MetricsHistory, TrainConfig, train
    from optw.train.pack import train_pack

    # packs train with the compacted rollout; alone, CUDA's default is the static one, which
    # samples the same routes but rounds differently (the 'static' check): compare like with like
    configs = [TrainConfig(regions=[r], epochs=epochs, batch_size=8, val_every=0,
                           val_tourists=4, checkpoint_every=0, seed=10 + i, device=str(device),
                           rollout="compact")
               for i, r in enumerate(["c101", "pr01", "r102"])]
    alone_hist = [MetricsHistory() for _ in configs]
    pack_hist = [MetricsHistory() for _ in configs]
    alone = [train(c, catalog, [h]) for c, h in zip(configs, alone_hist, strict=True)]
    pack = train_pack(configs, catalog, [[h] for h in pack_hist])
    out: dict[str, Any] = {"ok": True}
    for c, a, p, ha, hp in zip(configs, alone, pack, alone_hist, pack_hist, strict=True):
        same = all(abs(x["mean_reward"] - y["mean_reward"]) < 1e-3
                   for x, y in zip(ha.epochs, hp.epochs, strict=True))
        sa, sp = a.model.state_dict(), p.model.state_dict()
        diff = max(float((sa[k] - sp[k]).abs().max()) for k in sa)
        on_device = next(p.model.parameters()).device.type == device.type
        ok = same and diff < 2 * c.lr and on_device
        out[c.regions[0]] = {"same_rewards": same, "max_weight_diff": diff,
                             "on_device": on_device, "ok": ok}
        out["ok"] &= ok
    return out


def measure_packs(catalog, device: torch.device, epochs: int, pack_size: int) -> dict[str, Any]:
    """Summed region-epochs/s of all 56 Solomon regions in packs of ``pack_size`` (paper
    recipe, B = 32), and peak memory (``bench_packs.py``)."""
    from bench_packs import measure_packs as bench

    regions = catalog.list_regions("solomon")
    res = bench(catalog, regions, epochs, str(device), 2, pack_size, 32, sequential=False)
    return {"regions": len(regions), "pack_size": pack_size, "epochs": epochs, **res["batched"]}


def measure_training(catalog, device: torch.device, epochs: int,
                     rollout: str = "auto") -> dict[str, Any]:
    """Epochs/s of t101 from scratch (B = 32, one tourist per step), after a short warm-up,
    with training's ``rollout`` (a ``graph`` run's own warm-up and first capture are in its
    time)."""
    from optw.train import TrainConfig, train

    cfg = TrainConfig(regions=["t101"], epochs=epochs, batch_size=32, val_every=0,
                      val_tourists=1, checkpoint_every=0, seed=3, device=str(device),
                      rollout=rollout)
    train(cfg.replace(epochs=3), catalog)  # kernels, allocator, lazy imports
    _peak_reset(device)
    sync(device)
    t0 = time.perf_counter()
    res = train(cfg, catalog)
    sync(device)
    seconds = time.perf_counter() - t0 - res.last_validation.get("val_seconds", 0.0)
    return {"epochs_per_s": epochs / seconds, "epochs": epochs, "peak_mb": _peak_mb(device),
            "rollout": rollout}


def measure_beam(catalog, pretrained: Path, device: torch.device, repeats: int) -> dict:
    """Best wall time of beam 128 on t101's benchmark tourist with the published weights, and
    the ops it dispatches (the profiler's count on the host, as ``bench_ops.py`` counts them)."""
    from optw.decode import PAPER_BEAMS, solve
    from optw.model import load_model

    model = load_model(pretrained / WEIGHTS["t101"], map_location=device)
    region, bench = catalog.region("t101"), catalog.benchmark("t101")

    def search() -> None:
        solve(model, region, bench, "beam", beams=PAPER_BEAMS, keep_greedy=False)

    search()
    _peak_reset(device)
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        search()
        sync(device)
        best = min(best, time.perf_counter() - t0)
    peak = _peak_mb(device)
    ops = _bench_ops().count_ops(SimpleNamespace(epoch=search), 1)  # one search, one "epoch"
    return {"beam128_ms": best * 1e3, "peak_mb": peak,
            "ops_dispatched": ops["dispatched"], "kernels": ops["kernels"]}


def _bench_ops():
    import bench_ops

    return bench_ops


def _t101_state(pretrained: Path) -> tuple[dict, Any]:
    from optw.model import load_model

    model = load_model(pretrained / WEIGHTS["t101"])
    return {k: v.clone() for k, v in model.state_dict().items()}, model.cfg


def measure_ops(catalog, pretrained: Path, device: torch.device, epochs: int,
                warm: int = 2) -> dict:
    """Per training rollout (``compact``, ``static``, on CUDA also ``graph``), t101, B = 32,
    from the published weights: dispatched ops and kernels per epoch, the device's busy
    fraction over the profiled epochs (summed kernel time / wall time; CUDA only), and
    epochs/s."""
    from torch.profiler import ProfilerActivity, profile

    bench = _bench_ops()
    state, cfg = _t101_state(pretrained)
    region = catalog.region("t101")
    out: dict[str, Any] = {}
    for mode in bench.CUDA_MODES if device.type == "cuda" else bench.MODES:
        runner = bench.Runner(mode, state, cfg, region, 0, 32, 1, device)
        for _ in range(warm + (3 if mode == "graph" else 0)):  # graph: warm-up, capture
            runner.epoch()
        row: dict[str, Any] = bench.count_ops(runner, warm)
        if device.type == "cuda":
            sync(device)
            t0 = time.perf_counter()
            profiled = min(epochs, 3)  # the profiler's events cost more than the epochs
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(profiled):
                    runner.epoch()
                sync(device)
            wall = time.perf_counter() - t0
            gpu = [e for e in prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA]
            busy_us = sum(e.time_range.elapsed_us() for e in gpu)
            row["cuda_kernels"] = len(gpu) / profiled
            row["busy_fraction"] = busy_us * 1e-6 / wall
        sync(device)
        t0 = time.perf_counter()
        for _ in range(epochs):
            runner.epoch()
        sync(device)
        row["epochs_per_s"] = epochs / (time.perf_counter() - t0)
        out[mode] = row
    return out


def measure_routes(catalog, pretrained: Path, device: torch.device, epochs: int,
                   sizes: tuple[tuple[int, int], ...]) -> dict:
    """Sampled routes/s of training epochs (rollout + backward + Adam) on t101 with the
    rollout training chooses on ``device`` (``auto``; on CUDA also ``graph``), at K tourists
    x B routes for each ``(K, B)``."""
    from optw.train.rollouts import choose_rollout

    bench = _bench_ops()
    state, cfg = _t101_state(pretrained)
    region = catalog.region("t101")
    out: dict[str, Any] = {}
    choices = ("auto", "graph") if device.type == "cuda" else ("auto",)
    runs = list(dict.fromkeys(
        (k, b, choose_rollout(choice, device.type, k * b * region.n_nodes))
        for choice in choices for k, b in sizes))
    for k, b, mode in runs:
        name = f"K{k}xB{b}" + ("_graph" if mode == "graph" else "")
        try:
            runner = bench.Runner(mode, state, cfg, region, 0, b, k, device)
            for _ in range(4 if mode == "graph" else 1):
                runner.epoch()
            _peak_reset(device)
            sync(device)
            t0 = time.perf_counter()
            for _ in range(epochs):
                runner.epoch()
            sync(device)
        except Exception as exc:  # noqa: BLE001 - e.g. out of memory; the other sizes still run
            out[name] = {"mode": mode, "error": f"{type(exc).__name__}: {exc}"}
            continue
        eps = epochs / (time.perf_counter() - t0)
        out[name] = {"mode": mode, "epochs_per_s": eps, "routes_per_s": eps * k * b,
                     "peak_mb": _peak_mb(device)}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="folder for gpu_check.json")
    p.add_argument("--catalog", type=Path, default=None, help="built catalog folder")
    p.add_argument("--pretrained", type=Path,
                   default=ROOT.parent / "shared" / "reference" / "pretrained")
    p.add_argument("--device", default="cuda",
                   help="cuda or cuda:N (cpu: a dry run, without the graph check)")
    p.add_argument("--epochs", type=int, default=200, help="epochs timed on each device")
    p.add_argument("--cpu-epochs", type=int, default=10, help="epochs timed on the CPU")
    p.add_argument("--quick", action="store_true", help="fewer epochs and repeats")
    p.add_argument("--only", default="", help="comma-separated checks and figures to run "
                   "(default: all)")
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_check: error: CUDA is not available on this machine", file=sys.stderr)
        return 2
    from optw.catalog import open_catalog

    for name in WEIGHTS.values():
        if not (args.pretrained / name).is_file():
            print(f"gpu_check: error: --pretrained: {args.pretrained / name} not found",
                  file=sys.stderr)
            return 2
    catalog = open_catalog(args.catalog)
    device = torch.device(args.device)
    torch.set_num_threads(2)
    epochs = 30 if args.quick else args.epochs
    report: dict[str, Any] = {
        "torch": torch.__version__, "device": args.device,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}
    checks = {"published": lambda: check_published(catalog, args.pretrained, device),
              "greedy": lambda: check_greedy(catalog, args.pretrained, device),
              "static": lambda: check_static(catalog, args.pretrained, device),
              "learns": lambda: check_learns(catalog, device, 100 if args.quick else 300),
              "pack": lambda: check_pack(catalog, device),
              "graph": lambda: check_graph(catalog, args.pretrained, device,
                                           100 if args.quick else 300)}
    figures = {
        "train_t101": lambda: {"device": measure_training(catalog, device, epochs),
                               **({"device_graph": measure_training(catalog, device, epochs,
                                                                    "graph")}
                                  if device.type == "cuda" else {}),
                               "cpu": measure_training(catalog, torch.device("cpu"),
                                                       args.cpu_epochs)},
        "beam128_t101": lambda: {
            "device": measure_beam(catalog, args.pretrained, device, 3 if args.quick else 10),
            "cpu": measure_beam(catalog, args.pretrained, torch.device("cpu"), 2)},
        "ops_t101": lambda: measure_ops(catalog, args.pretrained, device,
                                        1 if args.quick else 20, 1 if args.quick else 2),
        "routes_t101": lambda: measure_routes(
            catalog, args.pretrained, device, 1 if args.quick else 10,
            ((1, 64), (4, 32)) if args.quick and device.type == "cpu" else ((1, 512), (64, 32))),
        "packs_solomon": lambda: {
            f"pack_{size}": measure_packs(catalog, device, 5 if args.quick else 30, size)
            for size in ((56,) if args.quick else (14, 56))},
    }
    todo = {**checks, **figures}
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in names if n not in todo]
        if unknown:
            print(f"gpu_check: error: --only: unknown {', '.join(unknown)}; expected of "
                  f"{', '.join(todo)}", file=sys.stderr)
            return 2
        todo = {n: todo[n] for n in names}
        checks = {n: f for n, f in checks.items() if n in todo}
    if device.type != "cuda" and "graph" in todo:  # CUDA graphs need CUDA
        print("SKIP   graph: needs CUDA", flush=True)
        del todo["graph"], checks["graph"]
    failed = []
    for name, fn in todo.items():
        t0 = time.perf_counter()
        try:
            result = fn()
        except Exception as exc:  # noqa: BLE001 - reported, the other checks still run
            result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        result["seconds_total"] = round(time.perf_counter() - t0, 2)
        report[name] = result
        if name in checks and not result.get("ok"):
            failed.append(name)
        status = ("PASS" if result.get("ok") else "FAIL") if name in checks else "FIGURE"
        print(f"{status:6} {name}: {json.dumps(result, default=str)}", flush=True)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
    print(f"{len(checks) - len(failed)}/{len(checks)} checks passed; {args.out / 'gpu_check.json'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
