"""REINFORCE training of the pointer network, top to bottom (the paper's Algorithm 1; the
settings: docs/recipes.md). Logging, checkpointing and early stopping are callbacks
(:mod:`optw.train.callbacks`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from optw.catalog import Catalog, Region, Tourists, sample_tourists
from optw.decode import solve
from optw.env import Instances, make_instances, stack_instances
from optw.env.demos import Demonstrations
from optw.errors import ConfigError, UserError
from optw.model import ModelConfig, PointerNet, checkpoint_dict, load_model, read_checkpoint
from optw.train.callbacks import Callback, TrainContext
from optw.train.config import ADDED_DEFAULTS, TrainConfig
from optw.train.rollouts import choose_rollout
from optw.train.step import (
    check_finite,
    demo_batch,
    diverging,
    imitation_step,
    make_optimizer,
    named_demos,
    reinforce_step,
)


@dataclass
class TrainResult:
    """What a finished (or stopped) run leaves behind."""

    model: PointerNet
    epochs: int
    last_validation: dict[str, float] = field(default_factory=dict)
    best_validation: float | None = None
    seconds: float = 0.0
    checkpoint: Path | None = None


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device = {name!r}: CUDA is not available here; use cpu or auto",
                          "device")
    return torch.device(name)


def validate(model: PointerNet, regions: list[Region], validation: dict[str, Tourists],
             benchmark: dict[str, Tourists]) -> dict[str, float]:
    """Greedy scores: mean over each region's validation tourists and its benchmark tourist,
    averaged over regions (plus per-region values when there are several)."""
    t0 = time.perf_counter()
    val, bench, out = [], [], {}  # solve() decodes in eval mode and restores the model's mode
    for region in regions:  # Python floats: these go into checkpoints (weights_only=True)
        v = float(np.mean([s.score for s in solve(model, region, validation[region.id],
                                                  "greedy")]))
        b = float(solve(model, region, benchmark[region.id], "greedy")[0].score)
        val.append(v), bench.append(b)
        if len(regions) > 1:
            out[f"val_score/{region.id}"], out[f"benchmark_score/{region.id}"] = v, b
    return {"val_score": float(np.mean(val)), "benchmark_score": float(np.mean(bench)),
            "val_seconds": time.perf_counter() - t0, **out}


@dataclass
class Run:
    """One model's run in :func:`run_epochs` (:func:`train` has one, a pack one per member):
    its settings, regions, callbacks, context, RNG streams, validation tourists and ``model()``,
    the current network (called only to validate it: a pack member's is a copy)."""

    config: TrainConfig
    regions: list[Region]
    callbacks: Sequence[Callback]
    ctx: TrainContext
    np_rng: np.random.Generator
    gen: torch.Generator
    model: Callable[[], PointerNet]
    validation: dict[str, Tourists]
    benchmark: dict[str, Tourists]
    fine_tuning: bool = False  # it starts from a model file: validated before epoch 1
    index: int = 0  # its place in a pack
    result: TrainResult | None = None  # set when it has finished


class EpochClock:
    """Training time: the epochs' steps, not their callbacks and validations."""

    def __init__(self) -> None:
        self.train_s, self.rate, self.t_last = 0.0, None, time.perf_counter()
        self.t_run = self.t_last

    def tick(self) -> float:
        """An epoch's step has ended: its time counts; returns the smoothed epochs per second."""
        now = time.perf_counter()
        inst_rate = 1.0 / max(now - self.t_last, 1e-9)
        self.rate = inst_rate if self.rate is None else 0.9 * self.rate + 0.1 * inst_rate
        self.train_s += now - self.t_last
        return self.rate

    def resume(self) -> None:
        """The callbacks and validations are done: training time runs again."""
        self.t_last = time.perf_counter()


#: An epoch's learning step: the runs still training and the clock in, each run's metrics out.
EpochStep = Callable[[list[Run], EpochClock], list[dict[str, float]]]


def run_epochs(runs: list[Run], step: EpochStep, clock: EpochClock) -> list[TrainResult]:
    """The epoch loop of :func:`train` and of a pack: ``step`` learns one epoch of every run
    still training and returns their metrics (``loss``, ``grad_norm`` and ``lr`` among them);
    then each run counts the epoch, checks it is finite, hands its metrics to its callbacks,
    validates every ``val_every`` epochs and at its end (its epochs, its ``max_minutes`` of
    training, or a callback's stop) and finishes."""
    for run in runs:
        begin_run(run)
    for run in runs:
        if run.ctx.epoch >= run.ctx.total_epochs:
            finish_run(run, clock)
    clock.resume()  # the starting validations are not training time
    while active := [run for run in runs if run.result is None]:
        metrics = step(active, clock)
        rate = clock.tick()
        for run, m in zip(active, metrics, strict=True):
            ctx, c = run.ctx, run.config
            ctx.epoch += 1
            m["epochs_per_s"] = rate
            check_finite(m, ctx.epoch, m["lr"])
            out_of_time = bool(c.max_minutes) and clock.train_s >= 60 * c.max_minutes
            last = ctx.epoch == ctx.total_epochs or out_of_time
            for cb in run.callbacks:
                cb.on_epoch_end(ctx, m)
            if (c.val_every and ctx.epoch % c.val_every == 0) or last:
                validate_run(run)
            if ctx.stop or last:
                finish_run(run, clock)
        clock.resume()
    return [run.result for run in runs]  # type: ignore[misc]


def validate_run(run: Run) -> None:
    """The greedy validation of ``run.model()``, kept in its context and handed to its
    callbacks."""
    ctx = run.ctx
    val = ctx.last_validation = validate(run.model(), run.regions, run.validation,
                                         run.benchmark)
    if ctx.best_validation is None or val["val_score"] > ctx.best_validation:
        ctx.best_validation = val["val_score"]
    for cb in run.callbacks:
        cb.on_validation(ctx, val)


#: Settings a resumed run may change: they do not change what the next epochs compute.
RESUMABLE_CHANGES = ("epochs", "val_every", "checkpoint_every", "device", "threads",
                     "max_minutes")


def check_resume(state: dict[str, Any], config: TrainConfig, source: str = "checkpoint",
                 resumable: tuple[str, ...] = ()) -> dict[str, tuple[Any, Any]]:
    """Refuse to resume ``state`` with a ``config`` it was not trained with (other regions,
    model or training settings: a :class:`UserError` with the reason); returns the harmless
    changes (e.g. the epoch budget) as ``{key: (before, now)}`` for the caller to state.
    ``resumable``: settings that may change besides :data:`RESUMABLE_CHANGES` (a long run's lr
    stepping down)."""
    if "train" not in state:
        raise UserError(f"{source} is a model file, not a training checkpoint (use init=)")
    t = state["train"]
    # settings added since the checkpoint was written had their defaults then
    before = {**ADDED_DEFAULTS, **t["config"]}
    if list(t["regions"]) != list(config.regions):
        raise UserError(f"{source} was trained on regions {t.get('regions')}, not "
                         f"{config.regions}; resume with the same regions or start afresh")
    want = ModelConfig.from_dict(config.model).to_dict()
    have = dict(state.get("config", {}))
    model_diff = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
    if model_diff:
        what = ", ".join(f"{k}: {have.get(k)!r} there, {want.get(k)!r} now" for k in model_diff)
        raise UserError(f"{source} holds a model with other settings ({what})")
    now = config.to_dict()
    diff = {k: (before.get(k), now.get(k)) for k in sorted(set(before) | set(now))
            if k not in ("regions", "model") and before.get(k) != now.get(k)}
    allowed = RESUMABLE_CHANGES + tuple(resumable)
    refused = sorted(k for k in diff if k not in allowed)
    if refused:
        what = ", ".join(f"{k}: {diff[k][0]!r} there, {diff[k][1]!r} now" for k in refused)
        raise UserError(f"{source} was trained with other settings ({what}); only "
                         f"{', '.join(allowed)} may change on resume")
    if int(t["epoch"]) > config.total_epochs:
        raise UserError(f"{source} has already trained {t['epoch']} epochs, more than the "
                        f"{config.total_epochs} of this run")
    return diff


def start_run(config: TrainConfig, region_ids: list[str], device: torch.device,
              init: str | Path | None, resume: str | Path | dict | None, source: str,
              resumable: tuple[str, ...] = ()) -> tuple[PointerNet, dict[str, Any] | None,
                                                   TrainContext, np.random.Generator,
                                                   torch.Generator]:
    """Where a run (or pack member) starts: the checkpoint ``resume`` (a file, or its dict
    named ``source``) checked (``resumable``: see :func:`check_resume`), the RNG streams seeded,
    the network (the checkpoint's, the model file ``init``'s, or fresh weights drawn under
    ``torch.manual_seed(config.seed)``) and the context; a checkpoint's epoch, RNG states and
    validations are put back, not its optimiser (a checkpoint of another kind of device goes
    on with the torch stream seeded from ``config.seed`` and its epoch)."""
    state = None
    if resume is not None:
        state = resume if isinstance(resume, dict) else read_checkpoint(resume)
        check_resume(state, config, source if isinstance(resume, dict) else str(resume),
                     resumable)
    random.seed(config.seed)
    np_rng = np.random.default_rng(config.seed)
    gen = torch.Generator(device=device)
    gen.manual_seed(config.seed)
    ctx = TrainContext(region_ids=region_ids, config=config, total_epochs=config.total_epochs)
    if state is not None:
        model = PointerNet(ModelConfig.from_dict(state["config"]))
        model.load_state_dict(state["state_dict"])
        t = state["train"]
        ctx.epoch = int(t["epoch"])
        np_rng.bit_generator.state = t["rng"]["numpy"]
        if t["rng"]["torch"].numel() == gen.get_state().numel():
            gen.set_state(t["rng"]["torch"])
        else:  # written on another kind of device (CPU <-> CUDA): a stream of this one's
            gen.manual_seed(config.seed + ctx.epoch)
        random.setstate(t["rng"]["python"])
        ctx.best_validation = t.get("best_validation")
        ctx.last_validation = t.get("last_validation", {})
    elif init is not None:
        model = load_model(init)
    else:
        torch.manual_seed(config.seed)
        model = PointerNet(ModelConfig.from_dict(config.model))
    return model, state, ctx, np_rng, gen


def begin_run(run: Run) -> None:
    """The callbacks' start; a run fine-tuning a model file validates it first (the starting
    model on these regions, for comparison)."""
    for cb in run.callbacks:
        cb.on_train_start(run.ctx)
    ctx = run.ctx
    if run.fine_tuning and ctx.epoch == 0:  # a comparison, not a candidate for the best
        ctx.last_validation = validate(run.model(), run.regions, run.validation, run.benchmark)
        for cb in run.callbacks:
            cb.on_validation(ctx, ctx.last_validation)


def finish_run(run: Run, clock: EpochClock) -> None:
    """The callbacks' end and the run's result (its model put in eval mode)."""
    ctx = run.ctx
    for cb in run.callbacks:
        cb.on_train_end(ctx)
    run.result = TrainResult(model=run.model().eval(), epochs=ctx.epoch,
                             last_validation=ctx.last_validation,
                             best_validation=ctx.best_validation,
                             seconds=time.perf_counter() - clock.t_run,
                             checkpoint=ctx.last_checkpoint)


def training_snapshot(model: PointerNet, config: TrainConfig, ctx: TrainContext,
                      optimizer: dict[str, Any], np_rng: np.random.Generator,
                      gen: torch.Generator) -> dict:
    """The checkpoint dict of a run in progress (it resumes exactly; see :func:`train`)."""
    return checkpoint_dict(model, train={
        "config": config.to_dict(), "epoch": ctx.epoch, "optimizer": optimizer,
        "rng": {"numpy": np_rng.bit_generator.state, "torch": gen.get_state(),
                "python": random.getstate()},
        "best_validation": ctx.best_validation, "last_validation": ctx.last_validation,
        "regions": ctx.region_ids,
    })


def train(config: TrainConfig, catalog: Catalog,
          callbacks: list[Callback] | tuple[Callback, ...] = (), init: str | Path | None = None,
          resume: str | Path | dict | None = None,
          demos: Mapping[str, Demonstrations] | None = None,
          resumable: tuple[str, ...] = ()) -> TrainResult:
    """Train a model on ``config.regions``: ``config.imitation_epochs`` of imitation of the
    demonstrations, then ``config.epochs`` of REINFORCE.
    ``init``: start from a model file's weights (fine-tuning; validated once before epoch 1).
    ``resume``: a checkpoint written by this function (``last.pt``, or its dict); the run
    continues exactly where it stopped: weights, optimiser, schedule position, RNG states.
    ``resumable``: settings besides :data:`RESUMABLE_CHANGES` that ``config`` may change from
    the checkpoint's (``("lr",)``: a long pretraining stepping its lr down).
    ``demos``: each region's demonstrations (at least ``config.demos``); default: read from
    the catalog's store, computing the missing ones (:func:`optw.baselines.demos.get_demos`).
    """
    if not config.regions:
        raise ConfigError("regions = []: no regions to train on", "regions")
    regions = [catalog.region(r) for r in config.regions]  # KeyError names unknown ones
    device = resolve_device(config.device)
    if config.threads:
        torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)

    # -- model, optimiser, state to resume
    model, state, ctx, np_rng, gen = start_run(config, [r.id for r in regions], device, init,
                                               resume, "the checkpoint", resumable)
    model.to(device).train()
    optimizer = make_optimizer(model, config.learning_rate(0))
    if state is not None:
        optimizer.load_state_dict(state["train"]["optimizer"])
    imitation = config.imitation_epochs
    if ctx.epoch < imitation or config.demo_tourists:
        demos = _demos(config, catalog, regions, demos)

    validation = {r.id: catalog.validation(r.id)[: config.val_tourists] for r in regions}
    benchmark = {r.id: catalog.benchmark(r.id) for r in regions}

    ctx.snapshot = lambda: training_snapshot(model, config, ctx, optimizer.state_dict(), np_rng,
                                             gen)
    run = Run(config, regions, callbacks, ctx, np_rng, gen, lambda: model, validation, benchmark,
              fine_tuning=init is not None)
    B, K = config.batch_size, config.tourists_per_epoch
    ids = torch.arange(K, device=device).repeat_interleave(B)  # route r -> tourist r // B
    graphed = None
    imitation_s = 0.0  # training time before REINFORCE began (cosine_time's start)

    def step(active: list[Run], clock: EpochClock) -> list[dict[str, float]]:
        nonlocal graphed, imitation_s
        epoch = ctx.epoch
        if epoch < imitation:
            # 1.-3. (imitation) demonstrations of the regions, their log-likelihood, one step
            lr = config.imitation_lr
            inst, acts, names = demo_batch(demos, regions, config.imitation_batch, np_rng,
                                           device)
            with diverging(model, epoch + 1, lr):
                loss, grad_norm = imitation_step(model, optimizer, inst, acts, names, config)
            return [{"imitation_loss": float(loss.detach()), "loss": float(loss.detach()),
                     "grad_norm": float(grad_norm), "lr": lr}]
        if epoch == imitation:
            imitation_s = clock.train_s
        # 1. a region and K tourists for it (or, mixing regions, a region per tourist;
        # or K demonstrations, whose routes join the samples)
        acts, route_ids, names = None, ids, []
        if config.demo_tourists:
            instances, demo_acts, names = demo_batch(demos, regions, K, np_rng, device)
            route_ids = torch.arange(K, device=device).repeat_interleave(B + 1)
            acts = torch.full((K * (B + 1), demo_acts.shape[1]), -1, dtype=torch.long,
                              device=device)
            acts[:: B + 1] = demo_acts
        elif config.mix_regions and len(regions) > 1:
            picks = np.bincount(np_rng.integers(len(regions), size=K), minlength=len(regions))
            instances = stack_instances([tourist_batch(regions[i], int(k), np_rng, config, device)
                                         for i, k in enumerate(picks) if k])
        else:
            region = (regions[int(np_rng.integers(len(regions)))] if len(regions) > 1
                      else regions[0])
            instances = tourist_batch(region, K, np_rng, config, device)

        # 2.-3. B sampled routes per tourist, REINFORCE, one Adam step
        lr = config.learning_rate(epoch - imitation, clock.train_s, imitation_s)
        mode = "compact" if acts is not None else choose_rollout(  # given routes: compact
            config.rollout, device.type, ids.shape[0] * instances.n_nodes)
        if mode == "graph" and graphed is None:  # replayed as a CUDA graph (opt-in)
            from optw.train.graphed import GraphedStep  # CUDA only

            graphed = GraphedStep(model, optimizer, config, ids)
        with diverging(model, epoch + 1, lr), named_demos(names, B + 1):
            rl, grad_norm = (graphed(instances, lr) if mode == "graph" else reinforce_step(
                model, optimizer, instances, route_ids, gen, config, lr, mode, acts))
        return [{"mean_reward": float(rl.reward.mean()), "entropy": float(rl.entropy.detach()),
                 "loss": float(rl.loss.detach()), "grad_norm": float(grad_norm), "lr": lr}]

    # 4. each epoch: report, validate, hand over to callbacks (run_epochs)
    return run_epochs([run], step, EpochClock())[0]


def tourist_batch(region: Region, k: int, rng: np.random.Generator, config: TrainConfig,
                  device: torch.device) -> Instances:
    """``k`` training tourists of ``region`` drawn with ``rng``, as instances."""
    return make_instances(region, sample_tourists(region, k, rng, config.score_kind), device)


def _demos(config: TrainConfig, catalog: Catalog, regions: list[Region],
           given: Mapping[str, Demonstrations] | None) -> dict[str, Demonstrations]:
    """``config.demos`` demonstrations of each region: the first of ``given``, else from the
    catalog's store (computing what it lacks)."""
    if given is None:
        from optw.baselines.demos import get_demos

        given = get_demos(catalog, [r.id for r in regions], config.demos, config.seed,
                          config.score_kind)
    out = {}
    for region in regions:
        have = given.get(region.id)
        if have is None or len(have) < config.demos:
            raise UserError(f"demos = {config.demos}: {region.id} has "
                            f"{0 if have is None else len(have)} demonstrations")
        out[region.id] = have.take(np.arange(config.demos))
        out[region.id].check(region)  # given ones too: every route admissible
    return out
