"""Speed of inference and of the training step, against the paper authors' implementation.

Prints, with the published weights: greedy decoding (ms, 1 thread) and beam search 128 (s, 1 and
2 threads) of the pr01 and t101 benchmark tourists, with their scores (pr01 308 and t101 399 in
published-outputs mode); and training epochs/s (rollout of 32 sampled routes of one generated
tourist + REINFORCE backward + Adam step) for pr01, c101, t101 from scratch and t101 from the
published weights, each in a fresh process so that its peak RSS is its own. Ratios are against
the authors' code measured on the same 2-core machine (``AUTHORS``).

    .venv/bin/python benchmarks/bench_inference.py            # everything (~3 minutes)
    .venv/bin/python benchmarks/bench_inference.py --quick    # fewer repeats
    .venv/bin/python benchmarks/bench_inference.py --only beam
    PYTHONPATH=platform python benchmarks/bench_inference.py --device cuda \
        --pretrained .device/pretrained --wait-quiet 0       # the same figures on a GPU

Timings are the best of a few repeats (other work on the machine only slows runs down).
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

from benchutil import WEIGHTS as PUBLISHED_WEIGHTS
from benchutil import sync

ROOT = Path(__file__).resolve().parents[1]
#: where the published weights are, and the device (``--pretrained``, ``--device``; passed on
#: to the training worker processes as the same options)
PRETRAINED = ROOT.parent / "shared" / "reference" / "pretrained"
DEVICE = "cpu"
WEIGHTS = {rid: PRETRAINED / name for rid, name in PUBLISHED_WEIGHTS.items()}


def _sync() -> None:
    sync(DEVICE)

#: The authors' implementation on this machine (torch CPU).
AUTHORS = {
    ("greedy_ms", "pr01", 1): 26.0, ("greedy_ms", "t101", 1): 50.0,
    ("beam_s", "pr01", 1): 2.1, ("beam_s", "pr01", 2): 1.2,
    ("beam_s", "t101", 1): 9.9, ("beam_s", "t101", 2): 7.4,
    ("train_eps", "pr01", 1): 1.74, ("train_eps", "pr01", 2): 3.06,
    ("train_eps", "c101", 1): 0.95, ("train_eps", "c101", 2): 1.87,
    ("train_eps", "t101", 1): 0.60, ("train_eps", "t101", 2): 1.11,
    ("train_s_per_epoch_published", "t101", 1): 3.35,
    ("train_s_per_epoch_published", "t101", 2): 1.85,
    ("peak_gb", "t101", 0): 3.7,
}


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1e3
    return float("nan")


def _peak_mb() -> float:
    """Peak RSS since :func:`_reset_peak` (VmHWM), else of the whole process."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM"):
                return int(line.split()[1]) / 1e3
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3


def _reset_peak() -> None:
    """Restart the peak-RSS count (Linux: writing 5 to /proc/self/clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def busy_cores(seconds: float = 0.5) -> float:
    """How many cores the whole machine kept busy over ``seconds`` (from /proc/stat)."""
    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + v[4]
    t0, i0 = sample()
    time.sleep(seconds)
    t1, i1 = sample()
    return (os.cpu_count() or 1) * (1 - (i1 - i0) / max(t1 - t0, 1))


def wait_quiet(max_wait: float) -> None:
    """Wait (up to ``max_wait`` s) until other work on the machine uses < 0.3 core."""
    deadline = time.time() + max_wait
    while time.time() < deadline and busy_cores() > 0.3:
        time.sleep(1.0)


def bench_inference(threads: list[int], repeats: int, only: str,
                    quiet: float = 0.0) -> list[dict]:
    import torch

    from optw.catalog import open_catalog
    from optw.decode import beam_search, rollout
    from optw.env import make_instances
    from optw.model import load_model

    cat = open_catalog()
    rows = []
    for region_id in ("pr01", "t101"):
        model = load_model(WEIGHTS[region_id], map_location=DEVICE)
        region = cat.region(region_id)
        inst = make_instances(region, cat.benchmark(region_id), DEVICE)
        if only in ("all", "greedy"):
            wait_quiet(quiet)
            torch.set_num_threads(1)
            with torch.inference_mode():
                for _ in range(3):
                    out = rollout(model, inst, greedy=True)
                times = []
                for _ in range(repeats * 5):
                    _sync()
                    t = time.perf_counter()
                    out = rollout(model, inst, greedy=True)
                    _sync()
                    times.append(time.perf_counter() - t)
            rows.append({"what": "greedy_ms", "region": region_id, "threads": 1,
                         "value": min(times) * 1e3, "score": float(out.reward[0])})
        if only in ("all", "beam"):
            for th in threads:
                wait_quiet(quiet)
                torch.set_num_threads(th)
                res = beam_search(model, inst, 128)  # warm-up (kernel compilation)
                times = []
                for _ in range(repeats):
                    _sync()
                    t = time.perf_counter()
                    res = beam_search(model, inst, 128)
                    _sync()
                    times.append(time.perf_counter() - t)
                rows.append({"what": "beam_s", "region": region_id, "threads": th,
                             "value": min(times), "score": res.scores[0]})
    return rows


def train_worker(region_id: str, init: str, threads: int, epochs: int, seed: int) -> dict:
    """Training epochs in this process: rollout 32 + backward + Adam (the paper's setting)."""
    import numpy as np
    import torch

    from optw.catalog import open_catalog, sample_tourists
    from optw.decode import rollout
    from optw.env import make_instances
    from optw.model import ModelConfig, PointerNet, load_model

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    region = open_catalog().region(region_id)
    model = load_model(WEIGHTS[init]) if init != "scratch" else PointerNet(ModelConfig())
    model.to(DEVICE).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    rng = np.random.default_rng(seed)
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    ids = torch.zeros(32, dtype=torch.long, device=DEVICE)
    base = _rss_mb()
    _reset_peak()  # the peak of the training epochs, not of loading the catalog

    def epoch() -> float:
        inst = make_instances(region, sample_tourists(region, 1, rng), DEVICE)
        out = rollout(model, inst, ids, generator=gen)
        loss = (-((out.reward - out.reward.mean()) * out.log_prob).mean()
                - 0.01 * out.entropy.mean())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return float(out.lengths.float().mean())

    for _ in range(3):
        epoch()
    lengths = []
    if DEVICE.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    _sync()
    t = time.perf_counter()
    for _ in range(epochs):
        lengths.append(epoch())
    _sync()
    dt = (time.perf_counter() - t) / epochs
    gpu = ({"gpu_peak_mb": torch.cuda.max_memory_allocated() / 2**20}
           if DEVICE.startswith("cuda") else {})
    return {"region": region_id, "init": init, "threads": threads, "epochs_per_s": 1 / dt,
            "s_per_epoch": dt, "mean_route_len": float(np.mean(lengths)),
            "baseline_rss_mb": base, "peak_rss_mb": _peak_mb(), "device": DEVICE, **gpu}


def bench_training(threads: list[int], quick: bool, quiet: float = 0.0) -> list[dict]:
    rows = []
    runs = [(r, "scratch") for r in ("pr01", "c101", "t101")] + [("t101", "t101")]
    for region_id, init in runs:
        for th in threads:
            epochs = (6 if init != "scratch" else 15) // (2 if quick else 1)
            cmd = [sys.executable, __file__, "--worker", region_id, init, str(th), str(epochs),
                   "--device", DEVICE, "--pretrained", str(PRETRAINED)]
            wait_quiet(quiet)
            out = subprocess.run(cmd, capture_output=True, text=True,
                                 env={**os.environ, "PYTHONPATH": str(ROOT / "platform")})
            if out.returncode:
                raise RuntimeError(f"training worker {cmd[3:7]} failed:\n{out.stderr}")
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return rows


def report(inf: list[dict], train: list[dict]) -> None:
    """The table: our figure, the authors', and the speed-up (or memory ratio)."""
    print(f"ours on {DEVICE}; the authors' on this machine's CPU")
    print(f"{'measure':<44}{'ours':>10}{'authors':>10}{'speed-up':>10}")

    def line(label: str, ours: float, theirs: float | None, lower_is_better: bool) -> None:
        t = ratio = ""
        if theirs is not None:
            t = f"{theirs:g}"
            ratio = f"{(theirs / ours if lower_is_better else ours / theirs):.2f}x"
        print(f"{label:<44}{ours:>10.3f}{t:>10}{ratio:>10}")

    for r in inf:
        unit = "ms" if r["what"] == "greedy_ms" else "s"
        kind = "greedy" if unit == "ms" else "beam 128"
        label = f"{kind} {r['region']} {r['threads']}T ({unit}, score {r['score']:g})"
        line(label, r["value"], AUTHORS.get((r["what"], r["region"], r["threads"])), True)
    for r in train:
        if r["init"] == "scratch":
            line(f"train {r['region']} scratch {r['threads']}T (epochs/s)", r["epochs_per_s"],
                 AUTHORS.get(("train_eps", r["region"], r["threads"])), False)
        else:
            line(f"train {r['region']} published {r['threads']}T (s/epoch)", r["s_per_epoch"],
                 AUTHORS.get(("train_s_per_epoch_published", r["region"], r["threads"])), True)
    for r in train:
        init = "scratch" if r["init"] == "scratch" else "published"
        label = f"peak RSS {r['region']} {init} {r['threads']}T (GB)"
        theirs = AUTHORS[("peak_gb", "t101", 0)] if r["region"] == "t101" else None
        line(label, r["peak_rss_mb"] / 1e3, theirs, True)
        if "gpu_peak_mb" in r:
            print(f"{'':<6}(GPU peak {r['gpu_peak_mb'] / 1e3:.2f} GB)")
        print(f"{'':<6}(process baseline {r['baseline_rss_mb'] / 1e3:.2f} GB, "
              f"mean route length {r['mean_route_len']:.1f})")


def main() -> int:
    global DEVICE, PRETRAINED
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer repeats")
    p.add_argument("--only", choices=("all", "greedy", "beam", "train"), default="all")
    p.add_argument("--threads", default="1,2", help="thread counts, e.g. 1,2")
    p.add_argument("--json", action="store_true", help="also print the raw rows as JSON")
    p.add_argument("--wait-quiet", type=float, default=60.0, metavar="S",
                   help="before each measurement wait up to S seconds for other work on the "
                        "machine to stop (default 60)")
    p.add_argument("--device", default=DEVICE, help="cpu (default), cuda or cuda:N: every "
                   "figure on that device (the authors' figures stay the CPU's)")
    p.add_argument("--pretrained", type=Path, default=PRETRAINED,
                   help="folder of the published weights")
    p.add_argument("--worker", nargs=4, metavar=("REGION", "INIT", "THREADS", "EPOCHS"),
                   help=argparse.SUPPRESS)
    args = p.parse_args()
    DEVICE, PRETRAINED = args.device, args.pretrained
    for key, path in WEIGHTS.items():
        WEIGHTS[key] = PRETRAINED / path.name
    if args.worker:
        region_id, init, th, epochs = args.worker
        print(json.dumps(train_worker(region_id, init, int(th), int(epochs), seed=0)))
        return 0
    threads = [int(t) for t in args.threads.split(",")]
    repeats = 2 if args.quick else 3
    quiet = args.wait_quiet
    inf = bench_inference(threads, repeats, args.only, quiet) if args.only != "train" else []
    train = bench_training(threads, args.quick, quiet) if args.only in ("all", "train") else []
    report(inf, train)
    if args.json:
        print(json.dumps({"inference": inf, "training": train}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
