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
"""

from __future__ import annotations

import argparse
import json
import sys
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
    args = p.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        print(f"bench_ops: error: --modes: unknown {bad or modes}; expected of {list(MODES)}",
              file=sys.stderr)
        return 2
    if args.quick:
        args.epochs, args.rounds, args.profile_epochs = 2, 1, 1
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
    print(f"bench_ops: {args.region}, K = {args.tourists} x B = {args.batch}, weights: "
          f"{source}, {args.threads} threads, torch {torch.__version__}", flush=True)
    for r in runners.values():  # warm-up: kernels, caches, lazy imports
        r.epoch()
    ops = {}
    for m, r in runners.items():
        ops[m] = count_ops(r, args.profile_epochs)
        print(f"  {m}: {ops[m]['dispatched']:.0f} ops dispatched, {ops[m]['kernels']:.0f} "
              f"kernels, {ops[m]['aten_ops']:.0f} aten ops per epoch", flush=True)
    best = {m: float("inf") for m in modes}
    for _ in range(args.rounds):
        for m, r in runners.items():
            t0 = time.perf_counter()
            for _ in range(args.epochs):
                r.epoch()
            best[m] = min(best[m], (time.perf_counter() - t0) / args.epochs)
    base = modes[0]
    rows = {}
    print(f"{'mode':12} {'dispatched':>11} {'kernels':>9} {'epochs/s':>9} {'vs ' + base:>10}")
    for m in modes:
        eps = 1.0 / best[m]
        rows[m] = {**ops[m], "epochs_per_s": eps, "speedup": eps * best[base]}
        print(f"{m:12} {ops[m]['dispatched']:11.0f} {ops[m]['kernels']:9.0f} {eps:9.2f} "
              f"{eps * best[base]:9.2f}x", flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"region": args.region, "batch": args.batch,
                                        "tourists": args.tourists, "threads": args.threads,
                                        "weights": source, "modes": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
