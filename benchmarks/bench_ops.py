"""Operations dispatched per training epoch, and CPU epochs/s, for each training rollout.

No device needed. One training epoch = what :func:`optw.train.train` does per epoch
(:func:`optw.train.loop.train_step`): K generated tourists of the region, B sampled routes
each, REINFORCE backward, gradient clipping, one Adam step. Runs every rollout mode
(``compact``: the compacted CPU decoder; ``static``: the fixed-shape GPU rollout, with its
``compat`` sampling; ``static-free``: its Gumbel sampling) in ONE process, side by side, from
the same weights (the published t101 weights when ``--pretrained`` holds them, else a seeded
model; trained weights give realistic route lengths), on the same tourists::

    PYTHONPATH=platform .venv/bin/python benchmarks/bench_ops.py            # t101, B = 32
    PYTHONPATH=platform .venv/bin/python benchmarks/bench_ops.py --quick

Reports per mode, from ``torch.profiler`` on the CPU over ``--profile-epochs`` epochs:

- ``dispatched``: operator calls entering the dispatcher from Python (aten ops without an
  aten parent; each costs Python and dispatcher time, and on a GPU launches >= 0 kernels);
- ``kernels``: aten ops without an aten child, less the metadata-only ones (views, reshapes,
  empty allocations): about the kernels a GPU would launch;

and epochs/s with ``--threads`` threads (modes interleaved round by round, best round kept,
since other work on the machine only slows runs down), with ratios to ``compact``.

``--baseline-ref REF`` (default ``dbd4f57``, the code before issue 24's CPU work; ``none``
skips it) first runs the same measurement, same weights, seed, B and threads, in a subprocess
on a ``git archive`` of REF's ``platform/``, then this checkout's, back to back, and prints
the ratios (ops: new / old, epochs/s: new / old)::

    PYTHONPATH=platform .venv/bin/python benchmarks/bench_ops.py --modes compact
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchutil import WEIGHTS

ROOT = Path(__file__).resolve().parents[1]
PRETRAINED = ROOT.parent / "shared" / "reference" / "pretrained"
MODES = ("compact", "static", "static-free")
#: aten ops that launch no kernel (views, metadata, allocation).
METADATA_OPS = {
    "aten::view", "aten::reshape", "aten::_reshape_alias", "aten::_unsafe_view",
    "aten::transpose", "aten::t", "aten::permute", "aten::expand", "aten::expand_as",
    "aten::unsqueeze", "aten::squeeze", "aten::select", "aten::slice", "aten::as_strided",
    "aten::alias", "aten::detach", "aten::detach_", "aten::unbind", "aten::split",
    "aten::chunk", "aten::narrow", "aten::empty", "aten::empty_like", "aten::empty_strided",
    "aten::resize_", "aten::lift_fresh", "aten::result_type", "aten::is_nonzero",
    "aten::_local_scalar_dense", "aten::item", "aten::numpy_T", "aten::view_as",
}


class Runner:
    """Training epochs of one rollout mode, from its own copy of the weights."""

    def __init__(self, name: str, state: dict, cfg: Any, region, seed: int, batch: int,
                 tourists: int, device: str | torch.device = "cpu"):
        from optw.model import PointerNet
        from optw.train import TrainConfig

        self.mode = name
        self.device = torch.device(device)
        self.model = PointerNet(cfg)
        self.model.load_state_dict(state)
        self.model.to(self.device).train()
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-5)
        self.config = TrainConfig(regions=[region.id], batch_size=batch,
                                  tourists_per_epoch=tourists)
        self.region = region
        self.rng = np.random.default_rng(seed)
        self.gen = torch.Generator(device=self.device).manual_seed(seed)
        self.ids = torch.arange(tourists, device=self.device).repeat_interleave(batch)

    def epoch(self) -> None:
        from optw.catalog import sample_tourists
        from optw.env import make_instances
        from optw.train.loop import train_step

        c = self.config
        inst = make_instances(self.region, sample_tourists(self.region, c.tourists_per_epoch,
                                                           self.rng, c.score_kind),
                              self.device)
        train_step(self.model, self.opt, inst, self.ids, self.gen, c, 1e-5, self.mode)


def count_ops(runner: Runner, epochs: int) -> dict[str, float]:
    """Profiler counts per epoch (see the module docstring)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(epochs):
            runner.epoch()
    events = [e for e in prof.events() if e.name.startswith("aten::")]
    parents = {id(e.cpu_parent) for e in events if e.cpu_parent is not None}
    dispatched = sum(1 for e in events
                     if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))
    kernels = sum(1 for e in events if id(e) not in parents and e.name not in METADATA_OPS)
    return {"dispatched": dispatched / epochs, "kernels": kernels / epochs,
            "aten_ops": len(events) / epochs}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--region", default="t101")
    p.add_argument("--batch", type=int, default=32, help="routes per tourist (B)")
    p.add_argument("--tourists", type=int, default=1, help="tourists per epoch (K)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--epochs", type=int, default=10, help="epochs per timed round")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds per mode")
    p.add_argument("--profile-epochs", type=int, default=3)
    p.add_argument("--modes", default=",".join(MODES), help=f"of {', '.join(MODES)}")
    p.add_argument("--catalog", type=Path, default=None, help="built catalog folder")
    p.add_argument("--pretrained", type=Path, default=PRETRAINED,
                   help="folder with the published weights (else a seeded model)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="fewer epochs and rounds")
    p.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    p.add_argument("--baseline-ref", default="dbd4f57",
                   help="git ref whose platform/ is measured first, for ratios ('none': skip)")
    p.add_argument("--json-stdout", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        print(f"bench_ops: error: --modes: unknown {bad or modes}; expected of {list(MODES)}",
              file=sys.stderr)
        return 2
    if args.quick:
        args.epochs, args.rounds, args.profile_epochs = 2, 1, 1
    if args.json_stdout:  # the baseline's subprocess
        print(json.dumps(measure(args, modes, log=sys.stderr)))
        return 0
    base_rows = None
    if args.baseline_ref.lower() != "none":
        try:
            base_rows = run_baseline(args, argv if argv is not None else sys.argv[1:])
        except (RuntimeError, subprocess.CalledProcessError) as e:
            print(f"bench_ops: error: --baseline-ref {args.baseline_ref}: {e}", file=sys.stderr)
            return 2
    out = measure(args, modes)
    if base_rows is not None:
        print(f"vs {args.baseline_ref} (same run, back to back):")
        print(f"{'mode':12} {'ops old':>9} {'ops new':>9} {'ops x':>7} "
              f"{'ep/s old':>9} {'ep/s new':>9} {'speed x':>8}")
        for m in modes:
            o, n = base_rows["modes"][m], out["modes"][m]
            print(f"{m:12} {o['dispatched']:9.0f} {n['dispatched']:9.0f} "
                  f"{n['dispatched'] / o['dispatched']:7.3f} {o['epochs_per_s']:9.2f} "
                  f"{n['epochs_per_s']:9.2f} {n['epochs_per_s'] / o['epochs_per_s']:7.2f}x",
                  flush=True)
        out["baseline"] = {"ref": args.baseline_ref, **base_rows}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=2))
    return 0


def run_baseline(args: argparse.Namespace, argv: list[str]) -> dict:
    """The same measurement on ``git archive REF platform/``, in a subprocess."""
    ref = args.baseline_ref
    with tempfile.TemporaryDirectory(prefix="bench_ops_base_") as tmp:
        tar = Path(tmp) / "platform.tar"
        with tar.open("wb") as f:
            proc = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "platform"],
                                  stdout=f, stderr=subprocess.PIPE, text=False)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr.decode(errors="replace").strip().splitlines()[-1])
        with tarfile.open(tar) as t:
            t.extractall(tmp, filter="data")
        from optw.paths import catalog_dir

        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(Path(tmp) / "platform"), str(ROOT / "benchmarks")]),
            # the archive has no catalog of its own: this checkout's
            "OPTW_CATALOG": str(Path(args.catalog or catalog_dir()).resolve())}
        cmd = [sys.executable, str(Path(__file__).resolve()), *argv, "--json-stdout",
               "--baseline-ref", "none"]
        print(f"bench_ops: baseline {ref} (git archive, subprocess) ...", flush=True)
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, check=True, text=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(args: argparse.Namespace, modes: list[str], log=sys.stdout) -> dict:
    """Ops per epoch and epochs/s of each mode, for the ``optw`` on the path."""
    torch.set_num_threads(args.threads)
    from optw.catalog import open_catalog
    from optw.model import ModelConfig, PointerNet, load_model

    catalog = open_catalog(args.catalog)
    region = catalog.region(args.region)
    weights = args.pretrained / WEIGHTS.get(args.region, "")
    if args.region in WEIGHTS and weights.is_file():
        model, source = load_model(weights), f"published {weights.name}"
    else:
        torch.manual_seed(args.seed)
        model, source = PointerNet(ModelConfig()), f"seeded init (seed {args.seed})"
    state = {k: v.clone() for k, v in model.state_dict().items()}
    runners = {m: Runner(m, state, model.cfg, region, args.seed, args.batch, args.tourists)
               for m in modes}
    import optw
    print(f"bench_ops: {args.region}, K = {args.tourists} x B = {args.batch}, weights: "
          f"{source}, {args.threads} threads, torch {torch.__version__}, optw from "
          f"{Path(optw.__file__).parent}", flush=True, file=log)
    for r in runners.values():  # warm-up: kernels, caches, lazy imports
        r.epoch()
    ops = {}
    for m, r in runners.items():
        ops[m] = count_ops(r, args.profile_epochs)
        print(f"  {m}: {ops[m]['dispatched']:.0f} ops dispatched, {ops[m]['kernels']:.0f} "
              f"kernels, {ops[m]['aten_ops']:.0f} aten ops per epoch", flush=True, file=log)
    best = {m: float("inf") for m in modes}
    for _ in range(args.rounds):
        for m, r in runners.items():
            t0 = time.perf_counter()
            for _ in range(args.epochs):
                r.epoch()
            best[m] = min(best[m], (time.perf_counter() - t0) / args.epochs)
    base = modes[0]
    rows = {}
    print(f"{'mode':12} {'dispatched':>11} {'kernels':>9} {'epochs/s':>9} {'vs ' + base:>10}",
          file=log)
    for m in modes:
        eps = 1.0 / best[m]
        rows[m] = {**ops[m], "epochs_per_s": eps, "speedup": eps * best[base]}
        print(f"{m:12} {ops[m]['dispatched']:11.0f} {ops[m]['kernels']:9.0f} {eps:9.2f} "
              f"{eps * best[base]:9.2f}x", flush=True, file=log)
    return {"region": args.region, "batch": args.batch, "tourists": args.tourists,
            "threads": args.threads, "weights": source, "modes": rows}


if __name__ == "__main__":
    sys.exit(main())
