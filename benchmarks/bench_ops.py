"""Operations dispatched per training epoch, and CPU epochs/s, for each training rollout.

No device needed. One training epoch = what :func:`optw.train.train` does per epoch
(:func:`optw.train.step.reinforce_step`): K generated tourists of the region, B sampled routes
each, REINFORCE backward, gradient clipping, one Adam step. Runs each training rollout of
``--modes`` (``compact``: the compacted CPU decoder; ``static``: the fixed-shape rollout CUDA
trains with; :mod:`optw.train.rollouts`) in ONE process, side by side, from the same weights
(the published t101 weights when ``--pretrained`` holds them, else a seeded model; trained
weights give realistic route lengths), on the same tourists::

    PYTHONPATH=platform .venv/bin/python benchmarks/bench_ops.py            # t101, B = 32
    PYTHONPATH=platform .venv/bin/python benchmarks/bench_ops.py --quick

Reports per mode, from ``torch.profiler`` on the CPU over ``--profile-epochs`` epochs:

- ``dispatched``: operator calls entering the dispatcher from Python (aten ops without an
  aten parent; each costs Python and dispatcher time, and on a GPU launches >= 0 kernels);
- ``kernels``: aten ops without an aten child, less the metadata-only ones (views, reshapes,
  empty allocations): about the kernels a GPU would launch;

and epochs/s with ``--threads`` threads (modes interleaved round by round, best round kept,
since other work on the machine only slows runs down), with ratios to ``compact``. Against a
baseline, the speed-up is also given per round: round k of both runs the same epochs (same
seed, tourists and route lengths), so the median of the per-round ratios is the steadier
figure on a shared machine.

``--baseline-ref REF`` (default ``2f4bf16``; ``none`` skips it; a ref older than the
learning-step function runs :func:`legacy_step`, that ref's loop inline) runs the same
measurement, same weights, seed, B and threads, in a subprocess on a ``git archive`` of REF's
``platform/``, next to this checkout's, and prints the ratios (ops: new / old, epochs/s:
new / old). The baseline runs as a worker process whose timed rounds alternate with this
checkout's (so both see the same load on a shared machine)::

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

from benchutil import common_options, parse_list, published_or_seeded

ROOT = Path(__file__).resolve().parents[1]
#: Training rollouts ``--modes`` takes (:mod:`optw.train.rollouts`).
MODES = ("compact", "static")
#: Rollouts a CUDA device also runs (``graph``: :mod:`optw.train.graphed`, CUDA graphs).
CUDA_MODES = (*MODES, "graph")
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
        self.opt = _optimizer(self.model)
        self.config = TrainConfig(regions=[region.id], batch_size=batch,
                                  tourists_per_epoch=tourists)
        self.region = region
        self.rng = np.random.default_rng(seed)
        self.gen = torch.Generator(device=self.device).manual_seed(seed)
        self.ids = torch.arange(tourists, device=self.device).repeat_interleave(batch)
        self.graphed = None
        if name == "graph":
            from optw.train.graphed import GraphedStep

            self.graphed = GraphedStep(self.model, self.opt, self.config, self.ids)

    def epoch(self) -> None:
        from optw.catalog import sample_tourists
        from optw.env import make_instances

        c = self.config
        inst = make_instances(self.region, sample_tourists(self.region, c.tourists_per_epoch,
                                                           self.rng, c.score_kind),
                              self.device)
        if self.graphed is not None:
            self.graphed(inst, 1e-5)
            return
        try:
            from optw.train.step import reinforce_step
        except ImportError:  # a baseline ref: its own step function, else its loop inline
            try:
                from optw.train.loop import train_step as reinforce_step
            except ImportError:
                legacy_step(self.model, self.opt, inst, self.ids, self.gen, c, 1e-5)
                return
        reinforce_step(self.model, self.opt, inst, self.ids, self.gen, c, 1e-5, self.mode)


def _optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    """The run's optimiser, as :func:`optw.train.train` makes it (a baseline ref's own)."""
    try:
        from optw.train.step import make_optimizer
    except ImportError:
        try:
            from optw.decode.reinforce import make_optimizer
        except ImportError:  # a ref older than make_optimizer
            return torch.optim.Adam(model.parameters(), lr=1e-5)
    return make_optimizer(model, 1e-5)


def legacy_step(model, opt, inst, ids, gen, c, lr: float) -> None:
    """One epoch's learning step of a ref older than the learning-step function (such as
    2f4bf16): compacted rollout, REINFORCE with the per-tourist mean baseline and the entropy
    bonus, clipping, one Adam step."""
    from optw.decode import rollout

    out = rollout(model, inst, ids, greedy=False, generator=gen)
    reward = out.reward.view(c.tourists_per_epoch, c.batch_size)
    advantage = (reward - reward.mean(dim=1, keepdim=True)).view(-1)
    loss = -(advantage.detach() * out.log_prob).mean() - c.beta * out.entropy.mean()
    for group in opt.param_groups:
        group["lr"] = lr
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), c.max_grad_norm)
    opt.step()


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
    common_options(p)
    p.add_argument("--quick", action="store_true", help="fewer epochs and rounds")
    p.add_argument("--baseline-ref", default="2f4bf16",
                   help="git ref whose platform/ is measured first, for ratios ('none': skip)")
    p.add_argument("--json-stdout", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    modes = parse_list(args.modes, MODES, "bench_ops", "--modes")
    if modes is None:
        return 2
    if args.quick:
        args.epochs, args.rounds, args.profile_epochs = 2, 1, 1
    if args.json_stdout:  # the baseline's worker: ops first, then one line per timed round
        bench = Bench(args, modes, log=sys.stderr)
        print(json.dumps(bench.ops), flush=True)
        for line in sys.stdin:
            if line.strip() != "round":
                break
            print(json.dumps(bench.round()), flush=True)
        return 0
    base = None
    if args.baseline_ref.lower() != "none":
        try:
            base = Baseline(args, argv if argv is not None else sys.argv[1:])
        except (RuntimeError, OSError, ValueError) as e:
            print(f"bench_ops: error: --baseline-ref {args.baseline_ref}: {e}", file=sys.stderr)
            return 2
    try:
        bench = Bench(args, modes)
        times: dict[str, list[float]] = {m: [] for m in modes}
        base_times: dict[str, list[float]] = {m: [] for m in modes}
        for _ in range(args.rounds):  # rounds interleaved with the baseline's: same load
            if base is not None:
                for m, sec in base.round().items():
                    base_times[m].append(sec)
            for m, sec in bench.round().items():
                times[m].append(sec)
    finally:
        if base is not None:
            base.close()
    out = bench.summary({m: min(t) for m, t in times.items()})
    if base is not None:
        base_rows = bench.summary({m: min(t) for m, t in base_times.items()}, base.ops, log=None)
        # round k of both ran the same epochs (same seed, same tourists): paired ratios
        paired = {m: [o / n for o, n in zip(base_times[m], times[m], strict=True)]
                  for m in modes}
        print(f"vs {args.baseline_ref} (same run, rounds interleaved; speed: best rounds, and "
              "the median and range of the per-round ratios, round k of both on the same "
              "epochs):")
        print(f"{'mode':12} {'ops old':>9} {'ops new':>9} {'ops x':>7} "
              f"{'ep/s old':>9} {'ep/s new':>9} {'best x':>7} {'median x':>9} {'range':>12}")
        for m in modes:
            o, n = base_rows["modes"][m], out["modes"][m]
            r = sorted(paired[m])
            n["speedup_vs_baseline"] = {"best_rounds": n["epochs_per_s"] / o["epochs_per_s"],
                                        "median_round": float(np.median(r)),
                                        "rounds": paired[m]}
            print(f"{m:12} {o['dispatched']:9.0f} {n['dispatched']:9.0f} "
                  f"{n['dispatched'] / o['dispatched']:7.3f} {o['epochs_per_s']:9.2f} "
                  f"{n['epochs_per_s']:9.2f} {n['epochs_per_s'] / o['epochs_per_s']:6.2f}x "
                  f"{np.median(r):8.2f}x {r[0]:5.2f}-{r[-1]:.2f}x", flush=True)
        out["baseline"] = {"ref": args.baseline_ref, **base_rows}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=2))
    return 0


class Baseline:
    """The same measurement on ``git archive REF platform/``, in a worker subprocess: its op
    counts on start, then one timed round per :meth:`round`."""

    def __init__(self, args: argparse.Namespace, argv: list[str]):
        self.tmp = tempfile.TemporaryDirectory(prefix="bench_ops_base_")
        tmp = self.tmp.name
        tar = Path(tmp) / "platform.tar"
        with tar.open("wb") as f:
            proc = subprocess.run(["git", "-C", str(ROOT), "archive", args.baseline_ref,
                                   "platform"], stdout=f, stderr=subprocess.PIPE)
        if proc.returncode != 0:
            self.tmp.cleanup()
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
        print(f"bench_ops: baseline {args.baseline_ref} (git archive, worker subprocess)",
              flush=True)
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.ops = self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            self.close()
            raise RuntimeError(f"the baseline's worker stopped (exit {self.proc.wait()})")
        return json.loads(line)

    def round(self) -> dict[str, float]:
        self.proc.stdin.write("round\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()  # type: ignore[union-attr]
            self.proc.wait()
        self.tmp.cleanup()


class Bench:
    """Runners of every mode for the ``optw`` on the path: op counts, then timed rounds."""

    def __init__(self, args: argparse.Namespace, modes: list[str], log=sys.stdout):
        torch.set_num_threads(args.threads)
        from optw.catalog import open_catalog

        self.args, self.modes, self.log = args, modes, log
        catalog = open_catalog(args.catalog)
        region = catalog.region(args.region)
        model, self.source = published_or_seeded([args.region], args.pretrained, args.seed)
        state = {k: v.clone() for k, v in model.state_dict().items()}
        self.runners = {m: Runner(m, state, model.cfg, region, args.seed, args.batch,
                                  args.tourists) for m in modes}
        import optw
        print(f"bench_ops: {args.region}, K = {args.tourists} x B = {args.batch}, weights: "
              f"{self.source}, {args.threads} threads, torch {torch.__version__}, optw from "
              f"{Path(optw.__file__).parent}", flush=True, file=log)
        for r in self.runners.values():  # warm-up: kernels, caches, lazy imports
            r.epoch()
        self.ops = {}
        for m, r in self.runners.items():
            self.ops[m] = count_ops(r, args.profile_epochs)
            print(f"  {m}: {self.ops[m]['dispatched']:.0f} ops dispatched, "
                  f"{self.ops[m]['kernels']:.0f} kernels, {self.ops[m]['aten_ops']:.0f} aten "
                  "ops per epoch", flush=True, file=log)

    def round(self) -> dict[str, float]:
        """Seconds per epoch of each mode over ``--epochs`` epochs."""
        out = {}
        for m, r in self.runners.items():
            t0 = time.perf_counter()
            for _ in range(self.args.epochs):
                r.epoch()
            out[m] = (time.perf_counter() - t0) / self.args.epochs
        return out

    def summary(self, best: dict[str, float], ops: dict | None = None, log=False) -> dict:
        """The figures (best seconds per epoch -> epochs/s), printed unless ``log`` is None."""
        ops = self.ops if ops is None else ops
        log = self.log if log is False else log
        base = self.modes[0]
        rows = {}
        if log is not None:
            print(f"{'mode':12} {'dispatched':>11} {'kernels':>9} {'epochs/s':>9} "
                  f"{'vs ' + base:>10}", file=log)
        for m in self.modes:
            eps = 1.0 / best[m]
            rows[m] = {**ops[m], "epochs_per_s": eps, "speedup": eps * best[base]}
            if log is not None:
                print(f"{m:12} {ops[m]['dispatched']:11.0f} {ops[m]['kernels']:9.0f} "
                      f"{eps:9.2f} {eps * best[base]:9.2f}x", flush=True, file=log)
        a = self.args
        return {"region": a.region, "batch": a.batch, "tourists": a.tourists,
                "threads": a.threads, "weights": self.source, "modes": rows}


if __name__ == "__main__":
    sys.exit(main())
