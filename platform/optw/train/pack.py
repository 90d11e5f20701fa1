"""A pack: several per-region models trained side by side in one batched step.

Each member has its own weights, Adam state, schedule, RNG streams, callbacks and checkpoints,
as :func:`optw.train.train` would give its config alone; they share the work: every epoch, all
members' tourists go through ONE rollout of a :class:`~optw.model.StackedPointerNet`, and one
backward and optimiser step update each member's slice from its own loss only. So the pack
trains the models each region would alone with the same seeds, within float rounding. A
member's snapshot is an ordinary training checkpoint; a finished member leaves the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from optw.catalog import Catalog
from optw.decode import Rollout, rollout
from optw.decode.reinforce import ReinforceLoss, reinforce_loss
from optw.env import Instances, stack_instances
from optw.model import PointerNet
from optw.model.stacked import StackedPointerNet
from optw.train.callbacks import Callback
from optw.train.config import TrainConfig
from optw.train.loop import (
    EpochClock,
    Run,
    TrainResult,
    resolve_device,
    run_epochs,
    start_run,
    tourist_batch,
    training_snapshot,
)
from optw.train.rollouts import PACK_ROLLOUTS

#: Adam's defaults, as :func:`optw.train.train` uses them.
BETAS, EPS = (0.9, 0.999), 1e-8


class StackedAdam:
    """PyTorch's Adam over stacked parameters ``[P, ...]``, with a step count and learning rate
    per member; only the active members are stepped."""

    def __init__(self, params: Sequence[torch.nn.Parameter], n_members: int):
        self.params = list(params)
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]
        self.steps = [0] * n_members

    def step(self, lrs: Sequence[float], active: Sequence[int]) -> None:
        dev = self.params[0].device
        idx = torch.tensor(list(active), device=dev)
        for p in active:
            self.steps[p] += 1
        b1, b2 = BETAS
        step_size = torch.tensor([-lrs[p] / (1 - b1 ** self.steps[p]) for p in active],
                                 device=dev)
        bc2_sqrt = torch.tensor([(1 - b2 ** self.steps[p]) ** 0.5 for p in active], device=dev)
        with torch.no_grad():
            for param, m, v in zip(self.params, self.exp_avg, self.exp_avg_sq, strict=True):
                shape = (-1,) + (1,) * (param.dim() - 1)
                g = param.grad.index_select(0, idx)
                m_a = m.index_select(0, idx).lerp_(g, 1 - b1)
                v_a = v.index_select(0, idx).mul_(b2).addcmul_(g, g, value=1 - b2)
                denom = (v_a.sqrt() / bc2_sqrt.view(shape)).add_(EPS)
                param.index_add_(0, idx, m_a / denom * step_size.view(shape))
                m.index_copy_(0, idx, m_a)
                v.index_copy_(0, idx, v_a)

    def member_state(self, p: int, model: PointerNet, lr: float) -> dict[str, Any]:
        """Member ``p``'s state in ``torch.optim.Adam``'s format (for ``model``, its network)."""
        groups = torch.optim.Adam(model.parameters(), lr=lr).state_dict()["param_groups"]
        state = {} if self.steps[p] == 0 else {
            i: {"step": torch.tensor(float(self.steps[p])), "exp_avg": m[p].detach().clone(),
                "exp_avg_sq": v[p].detach().clone()}
            for i, (m, v) in enumerate(zip(self.exp_avg, self.exp_avg_sq, strict=True))}
        return {"state": state, "param_groups": groups}

    def load_member(self, p: int, state: dict[str, Any]) -> None:
        """Set member ``p`` from a ``torch.optim.Adam`` state dict of its network."""
        entries = state.get("state", {})
        if not entries:
            self.steps[p] = 0
            return
        for i, (m, v) in enumerate(zip(self.exp_avg, self.exp_avg_sq, strict=True)):
            m[p] = entries[i]["exp_avg"].to(m.device)
            v[p] = entries[i]["exp_avg_sq"].to(v.device)
        self.steps[p] = int(float(entries[0]["step"]))


def clip_members(params: Sequence[torch.nn.Parameter], max_norms: Sequence[float],
                 ) -> torch.Tensor:
    """Each member's gradient norm over all its slices, clipped to its ``max_norm`` as
    ``torch.nn.utils.clip_grad_norm_`` does for one model; returns the norms before clipping."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(len(max_norms))
    norms = torch.stack([g.flatten(1).norm(dim=1) for g in grads]).norm(dim=0)
    limit = torch.tensor(list(max_norms), device=norms.device, dtype=norms.dtype)
    coef = (limit / (norms + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef.view((-1,) + (1,) * (g.dim() - 1)))
    return norms


def pack_step(stacked: StackedPointerNet, optimizer: StackedAdam, instances: Instances,
              ids: torch.Tensor, member: torch.Tensor, generators: Sequence[torch.Generator],
              configs: Sequence[TrainConfig], active: Sequence[int], lrs: Sequence[float],
              ) -> tuple[Rollout, list[ReinforceLoss], torch.Tensor]:
    """One epoch's REINFORCE step of the ``active`` members, each as
    :func:`~optw.train.step.reinforce_step` would take it alone: ``instances`` holds their
    tourists in ``active``'s order (``member``: each tourist's member; ``ids``: each route's
    tourist, ``tourists_per_epoch * batch_size`` routes per member); ``generators``, ``configs``
    and ``lrs`` are every member's. One rollout samples every route; the sum of the members'
    losses puts each member's gradient in its own slice. Returns the rollout, the active members'
    losses and every member's gradient norm before clipping."""
    out = rollout(stacked, instances, ids, greedy=False, generator=list(generators),
                  member=member)
    rls, stepped, start = [], [], 0
    for p in active:
        c = configs[p]
        sl = slice(start, start + c.tourists_per_epoch * c.batch_size)
        start = sl.stop
        # a member whose every route was forced (start -> end) gets no gradient: alone, Adam
        # would leave its parameters, moments and step count untouched
        if bool((out.lengths[sl] > 2).any()):
            stepped.append(p)
        rls.append(reinforce_loss(out.reward[sl], out.log_prob[sl], out.entropy[sl],
                                  c.batch_size, c.beta, c.advantage))
    for w in stacked.weights:
        w.grad = None
    total = torch.stack([rl.loss for rl in rls]).sum()
    if total.requires_grad:
        total.backward()
    norms = clip_members(stacked.weights, [c.max_grad_norm for c in configs])
    if stepped:
        optimizer.step(lrs, stepped)
    return out, rls, norms


def train_pack(configs: Sequence[TrainConfig], catalog: Catalog,
               callbacks: Sequence[Sequence[Callback]] | None = None,
               inits: Sequence[str | Path | None] | None = None,
               resumes: Sequence[str | Path | dict | None] | None = None) -> list[TrainResult]:
    """Train one model per config (each of one region) side by side. ``callbacks[i]``,
    ``inits[i]`` and ``resumes[i]`` are member i's, as for :func:`optw.train.train`; all members
    share the model settings and the device."""
    n = len(configs)
    if n == 0:
        raise ValueError("a pack needs at least one config")
    callbacks = [list(c) for c in (callbacks or [()] * n)]
    inits = list(inits or [None] * n)
    resumes = list(resumes or [None] * n)
    if not len(callbacks) == len(inits) == len(resumes) == n:
        raise ValueError("callbacks, inits and resumes need one entry per config")
    for i, c in enumerate(configs):
        if len(c.regions) != 1:
            raise ValueError(f"pack member {i}: a pack trains per-region models, but its config "
                             f"has regions {c.regions}")
        if c.rollout not in PACK_ROLLOUTS:
            raise ValueError(f"pack member {i}: rollout = {c.rollout!r}, but a pack trains "
                             "with the compacted rollout (train it alone, or use auto)")
        if c.demos:
            raise ValueError(f"pack member {i}: demos = {c.demos}, but a pack trains without "
                             "demonstrations (train it alone)")
    devices = {c.device for c in configs}
    if len(devices) > 1:
        raise ValueError(f"pack members ask for different devices {sorted(devices)}")
    device = resolve_device(configs[0].device)
    if configs[0].threads:
        torch.set_num_threads(configs[0].threads)

    members: list[Run] = []
    models: list[PointerNet] = []
    states: list[dict[str, Any] | None] = []
    for i, config in enumerate(configs):
        region = catalog.region(config.regions[0])
        model, state, ctx, np_rng, gen = start_run(config, [region.id], device, inits[i],
                                                   resumes[i], f"pack member {i}'s checkpoint")
        models.append(model)
        states.append(state)
        members.append(Run(
            config, [region], callbacks[i], ctx, np_rng, gen,
            lambda i=i: stacked.member(i),  # a copy of member i's network
            {region.id: catalog.validation(region.id)[: config.val_tourists]},
            {region.id: catalog.benchmark(region.id)}, fine_tuning=inits[i] is not None,
            index=i))

    stacked = StackedPointerNet(models).to(device).train()
    optimizer = StackedAdam(stacked.weights, n)
    for i, state in enumerate(states):
        if state is not None:
            optimizer.load_member(i, state["train"]["optimizer"])
    clock = EpochClock()

    def snapshot_of(mb: Run):
        def snapshot() -> dict:
            model = stacked.member(mb.index)
            lr = mb.config.learning_rate(max(mb.ctx.epoch - 1, 0), clock.train_s)
            return training_snapshot(model, mb.config, mb.ctx,
                                     optimizer.member_state(mb.index, model, lr),
                                     mb.np_rng, mb.gen)
        return snapshot

    for mb in members:
        mb.ctx.snapshot = snapshot_of(mb)

    def step(active: list[Run], clock: EpochClock) -> list[dict[str, float]]:
        # each member's K tourists (its own generator), one padded batch in member order
        parts, ids, member = [], [], []  # member: each tourist's member
        for mb in active:
            c, k = mb.config, mb.config.tourists_per_epoch
            parts.append(tourist_batch(mb.regions[0], k, mb.np_rng, c, device))
            ids.append(torch.arange(len(member), len(member) + k, device=device)
                       .repeat_interleave(c.batch_size))
            member += [mb.index] * k
        lrs = [mb.config.learning_rate(mb.ctx.epoch, clock.train_s) for mb in members]
        _, rls, norms = pack_step(stacked, optimizer, stack_instances(parts), torch.cat(ids),
                               torch.tensor(member, device=device), [mb.gen for mb in members],
                               configs, [mb.index for mb in active], lrs)
        return [{"mean_reward": float(rl.reward.mean()), "loss": float(rl.loss.detach()),
                 "entropy": float(rl.entropy.detach()), "grad_norm": float(norms[mb.index]),
                 "lr": lrs[mb.index]} for mb, rl in zip(active, rls, strict=True)]

    # each member reports, validates and hands over to its callbacks (run_epochs)
    return run_epochs(members, step, clock)
