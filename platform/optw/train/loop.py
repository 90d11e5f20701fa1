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
from optw.env import make_instances, stack_instances
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


def end_epoch(model: Callable[[], PointerNet], regions: list[Region],
              validation: dict[str, Tourists], benchmark: dict[str, Tourists],
              ctx: TrainContext, callbacks: Sequence[Callback], metrics: dict[str, float],
              last: bool) -> None:
    """The end of an epoch (``ctx.epoch`` already counts it), for :func:`train` and each pack
    member: the callbacks get ``metrics``; every ``val_every`` epochs and after the ``last``
    one, the greedy validation of ``model()`` (called only then: a pack member's is a copy)
    goes into ``ctx`` and to the callbacks."""
    for cb in callbacks:
        cb.on_epoch_end(ctx, metrics)
    c = ctx.config
    if not ((c.val_every and ctx.epoch % c.val_every == 0) or last):
        return
    val = ctx.last_validation = validate(model(), regions, validation, benchmark)
    if ctx.best_validation is None or val["val_score"] > ctx.best_validation:
        ctx.best_validation = val["val_score"]
    for cb in callbacks:
        cb.on_validation(ctx, val)


#: Settings a resumed run may change: they do not change what the next epochs compute.
RESUMABLE_CHANGES = ("epochs", "val_every", "checkpoint_every", "device", "threads",
                     "max_minutes")


def check_resume(state: dict[str, Any], config: TrainConfig, source: str = "checkpoint",
                 ) -> dict[str, tuple[Any, Any]]:
    """Refuse to resume ``state`` with a ``config`` it was not trained with (other regions,
    model or training settings: a :class:`UserError` with the reason); returns the harmless
    changes (e.g. the epoch budget) as ``{key: (before, now)}`` for the caller to state."""
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
    refused = sorted(k for k in diff if k not in RESUMABLE_CHANGES)
    if refused:
        what = ", ".join(f"{k}: {diff[k][0]!r} there, {diff[k][1]!r} now" for k in refused)
        raise UserError(f"{source} was trained with other settings ({what}); only "
                         f"{', '.join(RESUMABLE_CHANGES)} may change on resume")
    if int(t["epoch"]) > config.total_epochs:
        raise UserError(f"{source} has already trained {t['epoch']} epochs, more than the "
                        f"{config.total_epochs} of this run")
    return diff


def start_run(config: TrainConfig, region_ids: list[str], device: torch.device,
              init: str | Path | None, resume: str | Path | dict | None, source: str,
              ) -> tuple[PointerNet, dict[str, Any] | None, TrainContext,
                         np.random.Generator, torch.Generator]:
    """Where a run (or pack member) starts: the checkpoint ``resume`` (a file, or its dict
    named ``source``) checked, the RNG streams seeded, the network (the checkpoint's, the model
    file ``init``'s, or fresh weights drawn under ``torch.manual_seed(config.seed)``) and the
    context; a checkpoint's epoch, RNG states and validations are put back, not its optimiser."""
    state = None
    if resume is not None:
        state = resume if isinstance(resume, dict) else read_checkpoint(resume)
        check_resume(state, config, source if isinstance(resume, dict) else str(resume))
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
        gen.set_state(t["rng"]["torch"])
        random.setstate(t["rng"]["python"])
        ctx.best_validation = t.get("best_validation")
        ctx.last_validation = t.get("last_validation", {})
    elif init is not None:
        model = load_model(init)
    else:
        torch.manual_seed(config.seed)
        model = PointerNet(ModelConfig.from_dict(config.model))
    return model, state, ctx, np_rng, gen


def begin_run(ctx: TrainContext, callbacks: Sequence[Callback], model: Callable[[], PointerNet],
              regions: list[Region], validation: dict[str, Tourists],
              benchmark: dict[str, Tourists], fine_tuning: bool) -> None:
    """The callbacks' start; a run ``fine_tuning`` a model file validates ``model()`` first
    (the starting model on these regions, for comparison; as in :func:`end_epoch`)."""
    for cb in callbacks:
        cb.on_train_start(ctx)
    if fine_tuning and ctx.epoch == 0:
        ctx.last_validation = validate(model(), regions, validation, benchmark)
        for cb in callbacks:
            cb.on_validation(ctx, ctx.last_validation)


def finish_run(ctx: TrainContext, callbacks: Sequence[Callback], model: PointerNet,
               t_run: float) -> TrainResult:
    """The callbacks' end and the run's result (``model`` put in eval mode)."""
    for cb in callbacks:
        cb.on_train_end(ctx)
    return TrainResult(model=model.eval(), epochs=ctx.epoch, last_validation=ctx.last_validation,
                       best_validation=ctx.best_validation,
                       seconds=time.perf_counter() - t_run, checkpoint=ctx.last_checkpoint)


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
          demos: Mapping[str, Demonstrations] | None = None) -> TrainResult:
    """Train a model on ``config.regions``: ``config.imitation_epochs`` of imitation of the
    demonstrations, then ``config.epochs`` of REINFORCE.
    ``init``: start from a model file's weights (fine-tuning; validated once before epoch 1).
    ``resume``: a checkpoint written by this function (``last.pt``, or its dict); the run
    continues exactly where it stopped: weights, optimiser, schedule position, RNG states.
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
                                               resume, "the checkpoint")
    model.to(device).train()
    optimizer = make_optimizer(model, config.learning_rate(0))
    if state is not None:
        optimizer.load_state_dict(state["train"]["optimizer"])
    imitation, total, start_epoch = config.imitation_epochs, config.total_epochs, ctx.epoch
    if start_epoch < imitation or config.demo_tourists:
        demos = _demos(config, catalog, regions, demos)

    validation = {r.id: catalog.validation(r.id)[: config.val_tourists] for r in regions}
    benchmark = {r.id: catalog.benchmark(r.id) for r in regions}

    ctx.snapshot = lambda: training_snapshot(model, config, ctx, optimizer.state_dict(), np_rng,
                                             gen)
    begin_run(ctx, callbacks, lambda: model, regions, validation, benchmark, init is not None)

    B, K = config.batch_size, config.tourists_per_epoch
    ids = torch.arange(K, device=device).repeat_interleave(B)  # route r -> tourist r // B
    graphed = None
    t_run, rate, t_last = time.perf_counter(), None, time.perf_counter()
    train_s, limit_s, imitation_s = 0.0, (config.max_minutes or 0.0) * 60, 0.0
    for epoch in range(start_epoch, total):
        if epoch < imitation:
            # 1.-3. (imitation) demonstrations of the regions, their log-likelihood, one step
            lr = config.imitation_lr
            inst, acts, names = demo_batch(demos, regions, config.imitation_batch, np_rng,
                                           device)
            with diverging(model, epoch + 1, lr):
                loss, grad_norm = imitation_step(model, optimizer, inst, acts, names, config)
            metrics = {"imitation_loss": float(loss.detach())}
        else:
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
                picks = np.bincount(np_rng.integers(len(regions), size=K),
                                    minlength=len(regions))
                instances = stack_instances([
                    make_instances(regions[i], sample_tourists(regions[i], int(k), np_rng,
                                                               config.score_kind), device)
                    for i, k in enumerate(picks) if k])
            else:
                region = (regions[int(np_rng.integers(len(regions)))] if len(regions) > 1
                          else regions[0])
                tourists = sample_tourists(region, K, np_rng, config.score_kind)
                instances = make_instances(region, tourists, device)

            # 2.-3. B sampled routes per tourist, REINFORCE, one Adam step
            lr = config.learning_rate(epoch - imitation, train_s, imitation_s)
            mode = "compact" if acts is not None else choose_rollout(  # given routes: compact
                config.rollout, device.type, ids.shape[0] * instances.n_nodes)
            if mode == "graph" and graphed is None:  # replayed as a CUDA graph (opt-in)
                from optw.train.graphed import GraphedStep  # CUDA only

                graphed = GraphedStep(model, optimizer, config, ids)
            with diverging(model, epoch + 1, lr), named_demos(names, B + 1):
                rl, grad_norm = (graphed(instances, lr) if mode == "graph" else reinforce_step(
                    model, optimizer, instances, route_ids, gen, config, lr, mode, acts))
            loss = rl.loss
            metrics = {"mean_reward": float(rl.reward.mean()),
                       "entropy": float(rl.entropy.detach())}

        # 4. report, validate, hand over to callbacks
        ctx.epoch = epoch + 1
        now = time.perf_counter()
        inst_rate = 1.0 / max(now - t_last, 1e-9)
        rate = inst_rate if rate is None else 0.9 * rate + 0.1 * inst_rate
        train_s += now - t_last
        if ctx.epoch == imitation:
            imitation_s = train_s
        metrics.update({"loss": float(loss.detach()), "grad_norm": float(grad_norm), "lr": lr,
                        "epochs_per_s": rate})
        check_finite(metrics, ctx.epoch, lr)
        out_of_time = bool(limit_s) and train_s >= limit_s
        last = ctx.epoch == total or out_of_time
        end_epoch(lambda: model, regions, validation, benchmark, ctx, callbacks, metrics, last)
        t_last = time.perf_counter()  # callbacks and validation are not training time
        if ctx.stop or out_of_time:
            break

    return finish_run(ctx, callbacks, model, t_run)


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
