"""One learning step of a single model: the optimiser, gradient clipping, the REINFORCE step
of an epoch (sampling with the run's rollout, :mod:`optw.train.rollouts`) and the imitation
step (teacher forcing on demonstrations), and the check that a run has not diverged."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager

import numpy as np
import torch

from optw.catalog.region import Region
from optw.decode.core import ForcedActionError, Rollout, rollout
from optw.decode.reinforce import ReinforceLoss, reinforce_loss
from optw.env.demos import Demonstrations
from optw.env.demos import actions as demo_actions
from optw.env.instances import Instances, make_instances, stack_instances
from optw.errors import UserError
from optw.model.fastops import deferred_grads
from optw.model.network import PointerNet
from optw.train.config import TrainConfig


def make_optimizer(model: torch.nn.Module, lr: float) -> torch.optim.Adam:
    """Adam. ``foreach``: a few dispatched operations per step instead of ~14 per parameter;
    on the CPU the same values as the per-parameter loop, bit for bit."""
    return torch.optim.Adam(model.parameters(), lr=lr, foreach=True)


def clip_gradients(params: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
    """The gradients of ``params`` clipped to total norm ``max_norm`` (``foreach``: the same
    values in fewer operations); returns the norm before clipping."""
    return torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)


def descend(model: PointerNet, optimizer: torch.optim.Optimizer, loss: torch.Tensor,
            lr: float, max_grad_norm: float) -> torch.Tensor:
    """One optimiser step at ``lr`` down ``loss``'s gradient, clipped to ``max_grad_norm``;
    returns the gradient norm before clipping."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    with deferred_grads():  # each weight's uses summed in place (fastops.WeightGrads)
        loss.backward()
    grad_norm = clip_gradients(model.parameters(), max_grad_norm)
    optimizer.step()
    return grad_norm


def reinforce_step(model: PointerNet, optimizer: torch.optim.Optimizer, instances: Instances,
                   ids: torch.Tensor, generator: torch.Generator, config: TrainConfig,
                   lr: float, mode: str = "compact", actions: torch.Tensor | None = None,
                   ) -> tuple[ReinforceLoss, torch.Tensor]:
    """One epoch's REINFORCE step at ``lr``: one route per entry of ``ids`` sampled with rollout
    ``mode`` (``compact`` or ``static``), or given by the rows of ``actions`` that are not -1
    (compacted rollout). Returns the loss and the gradient norm."""
    if mode == "static" and actions is None:
        from optw.decode.static import static_rollout  # for CUDA: not on the CPU's path

        out = Rollout.of(instances, ids, *static_rollout(model, instances, ids,
                                                         generator=generator))
    else:
        out = rollout(model, instances, ids, generator=generator, actions=actions)
    per_tourist = int(ids.shape[0] // instances.n_tourists)
    rl = reinforce_loss(out.reward, out.log_prob, out.entropy, per_tourist, config.beta,
                        config.advantage)
    return rl, descend(model, optimizer, rl.loss, lr, config.max_grad_norm)


class TrainingDiverged(UserError):
    """A run whose loss, gradient or weights stopped being finite."""


def check_finite(metrics: dict[str, float], epoch: int, lr: float) -> None:
    """:class:`TrainingDiverged` naming the epoch and the lr unless the epoch's loss and
    gradient norm are finite."""
    bad = [k for k in ("loss", "grad_norm") if not math.isfinite(metrics[k])]
    if bad:
        raise TrainingDiverged(f"training diverged at epoch {epoch} with lr = {lr:g}: the "
                               f"{' and '.join(bad)} is not finite; lower the lr")


@contextmanager
def diverging(model: torch.nn.Module, epoch: int, lr: float) -> Iterator[None]:
    """An epoch's step: an error inside it from weights that are no longer finite (e.g. a
    sampling distribution of NaNs) is a :class:`TrainingDiverged` naming the epoch and lr."""
    try:
        yield
    except RuntimeError:
        if all(bool(torch.isfinite(p).all()) for p in model.parameters()):
            raise
        raise TrainingDiverged(f"training diverged at epoch {epoch} with lr = {lr:g}: the "
                               "weights are no longer finite; lower the lr") from None


def demo_batch(demos: Mapping[str, Demonstrations], regions: list[Region], k: int,
               rng: np.random.Generator, device: torch.device,
               ) -> tuple[Instances, torch.Tensor, list[tuple[str, int]]]:
    """``k`` demonstrations drawn with ``rng`` (a region uniformly, then one of its
    demonstrations), as one batch of instances (padded to the largest region), their actions
    and (region, tourist id) of each route."""
    picks = np.bincount(rng.integers(len(regions), size=k), minlength=len(regions))
    parts, routes, sizes, names = [], [], [], []
    for region, count in zip(regions, picks.tolist(), strict=True):
        if not count:
            continue
        d = demos[region.id].take(rng.integers(len(demos[region.id]), size=count))
        parts.append(make_instances(region, d.tourists, device))
        routes += d.routes
        sizes += [region.n_nodes] * count
        names += [(region.id, int(t)) for t in d.tourists.tourist_id]
    inst = stack_instances(parts)
    return inst, demo_actions(routes, sizes, inst.n_nodes, device), names


@contextmanager
def named_demos(names: list[tuple[str, int]], routes_per_demo: int = 1) -> Iterator[None]:
    """A rollout following demonstrations ``names[i]`` (region, tourist), each the first of
    ``routes_per_demo`` routes: a demonstration the environment does not admit is a
    :class:`UserError` naming its region and tourist."""
    try:
        yield
    except ForcedActionError as exc:
        region, tourist = names[exc.route // routes_per_demo]
        raise UserError(f"demonstration of {region} tourist {tourist}: node {exc.node} at "
                        f"step {exc.step} is not admissible (a stale or corrupt "
                        "demonstration store?)") from None


def imitation_step(model: PointerNet, optimizer: torch.optim.Optimizer, instances: Instances,
                   acts: torch.Tensor, names: list[tuple[str, int]], config: TrainConfig,
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of imitation: the demonstrations' length-normalised negative log-likelihood
    under the policy (teacher forcing through the sampling decoder), one clipped optimiser
    step at ``imitation_lr`` (:func:`named_demos`). Returns the loss and the gradient norm."""
    with named_demos(names):  # one route per demonstration, as ``instances`` holds them
        out = rollout(model, instances, actions=acts)
    loss = -(out.log_prob / (out.lengths - 1).clamp(min=1)).mean()
    return loss, descend(model, optimizer, loss, config.imitation_lr, config.max_grad_norm)
