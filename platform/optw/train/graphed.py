"""Training steps replayed as CUDA graphs (opt-in: ``[train] rollout = "graph"``, CUDA only).

On a GPU a training epoch of a small batch is bound by launching kernels from Python
(thousands of tiny kernels per epoch, the GPU busy a few % of the time). Here the whole
forward and backward of an epoch (:func:`~optw.decode.static.static_rollout` with ``"free"``
sampling and a fixed number of steps S, the rewards, the REINFORCE loss and its backward) is
captured once as a CUDA graph and replayed every epoch: one launch instead of thousands.
Gradient clipping and the Adam step run eagerly after it (a few fused kernels), so the
optimiser is the ordinary one.

- **Static inputs.** Each epoch's tourists are copied into buffers the graph reads; routes
  ``ids`` are fixed for the run.
- **S steps.** A route needs at most n - 1 steps, but a policy's routes are far shorter, so the
  graph runs S steps: from the longest route of the eager warm-up epochs (:func:`graph_steps`).
  After a replay one read (the epoch's metrics read the device anyway) says whether every route
  reached the end; if one did not, S grows (up to n), the graph is captured again and the
  epoch is redone, so no route is ever cut short. Steps after a route's end add nothing
  (log-prob 0).
- **Randomness.** The graph draws from the device's default CUDA generator (seeded by the run's
  seed; the only one a capture may use), with Gumbel sampling: the same distribution as the
  other rollouts, another random stream. So a run's numbers differ from the compacted and
  ``static`` rollouts' for the same seed, and a resumed run does not repeat its epochs exactly:
  opt-in, not the default.
- The first :data:`WARMUP` epochs of each node count run eagerly (the same rollout, not captured) on
  a side stream, as CUDA graph capture asks; they are real training epochs.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from optw.decode.core import route_reward
from optw.decode.reinforce import ReinforceLoss, reinforce_loss
from optw.decode.static import all_done, static_rollout
from optw.env.instances import Instances
from optw.model import PointerNet
from optw.train.config import TrainConfig
from optw.train.step import clip_gradients

#: Eager epochs (per node count) before the first capture.
WARMUP = 2
#: Steps are rounded up to a multiple of this (fewer distinct graphs).
STEP_GRAIN = 4


@dataclass
class _Capture:
    """One captured graph and the static tensors it writes."""

    graph: torch.cuda.CUDAGraph
    steps: int
    loss: ReinforceLoss
    done: torch.Tensor
    grads: list[torch.Tensor | None]


def graph_steps(longest: int, n: int) -> int:
    """The steps S a graph runs for routes whose longest took ``longest`` steps, on n nodes:
    at least one more, rounded up to :data:`STEP_GRAIN`, at most n. Every replay runs all S
    steps, so the headroom is small: a longer route costs one more replay and capture, and S
    only grows (at most n / grain captures per node count)."""
    return min(n, STEP_GRAIN * math.ceil((longest + 1) / STEP_GRAIN))


class GraphedStep:
    """:func:`~optw.train.step.reinforce_step` for rollout ``"graph"``: call it with each
    epoch's instances and learning rate; returns the loss and the gradient norm as
    ``reinforce_step``."""

    def __init__(self, model: PointerNet, optimizer: torch.optim.Optimizer,
                 config: TrainConfig, ids: torch.Tensor):
        if ids.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, not {ids.device}")
        self.model, self.optimizer, self.config, self.ids = model, optimizer, config, ids
        self.params = list(model.parameters())
        self.stream = torch.cuda.Stream(ids.device)
        self.eager: dict[int, int] = {}  # eager epochs run, per node count
        self.steps: dict[int, int] = {}  # steps S the graphs run, per node count
        self.inputs: dict[int, Instances] = {}  # static input buffers, per node count
        self.captures: dict[tuple[int, int], _Capture] = {}
        self.recaptures = 0  # captures after a cut-short route made S grow

    def __call__(self, instances: Instances, lr: float) -> tuple[ReinforceLoss, torch.Tensor]:
        n = instances.n_nodes
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self.eager.get(n, 0) < WARMUP:
            return self._eager(instances)
        inputs = self._inputs(instances)
        while True:
            steps = self.steps[n]
            cap = self.captures.get((n, steps)) or self._capture(inputs, steps)
            cap.graph.replay()
            if steps >= n or bool(cap.done):
                break
            # a route was cut short: more steps from now on, and this epoch again
            self.steps[n] = graph_steps(steps, n)
            self.captures.pop((n, steps))
            self.recaptures += 1
        for p, g in zip(self.params, cap.grads, strict=True):
            p.grad = g
        grad_norm = clip_gradients(self.params, self.config.max_grad_norm)
        self.optimizer.step()
        return cap.loss, grad_norm

    def _eager(self, instances: Instances) -> tuple[ReinforceLoss, torch.Tensor]:
        """An eager epoch of the same rollout on the side stream (warm-up before capture); sets the
        steps S of the first capture from its longest route."""
        n = instances.n_nodes
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            routes, rl = self._loss(instances)
            self.optimizer.zero_grad(set_to_none=True)
            rl.loss.backward()
            grad_norm = clip_gradients(self.params, self.config.max_grad_norm)
            self.optimizer.step()
        torch.cuda.current_stream().wait_stream(self.stream)
        self.eager[n] = self.eager.get(n, 0) + 1
        longest = routes.shape[1] - 1  # trimmed to the longest route, start included
        self.steps[n] = max(self.steps.get(n, 0), graph_steps(longest, n))
        return rl, grad_norm

    def _loss(self, instances: Instances, steps: int | None = None,
              ) -> tuple[torch.Tensor, ReinforceLoss]:
        """The static rollout's routes with ``"free"`` sampling (``steps``: that many steps,
        untrimmed; else until every route is done, trimmed) and its REINFORCE loss."""
        routes, log_prob, entropy = static_rollout(self.model, instances, self.ids,
                                                   sampling="free", steps=steps)
        return routes, reinforce_loss(route_reward(instances, self.ids, routes), log_prob,
                                      entropy, self.config.batch_size, self.config.beta)

    def _inputs(self, instances: Instances) -> Instances:
        """The static buffers for this node count, holding ``instances``' tensors."""
        n = instances.n_nodes
        buf = self.inputs.get(n)
        if buf is None:
            buf = dataclasses.replace(instances, **{
                f.name: getattr(instances, f.name).clone()
                for f in dataclasses.fields(instances)
                if isinstance(getattr(instances, f.name), torch.Tensor)})
            self.inputs[n] = buf
            return buf
        for f in dataclasses.fields(instances):
            value = getattr(instances, f.name)
            if isinstance(value, torch.Tensor):
                getattr(buf, f.name).copy_(value)
        return buf

    def _capture(self, inputs: Instances, steps: int) -> _Capture:
        """Capture S = ``steps`` steps of rollout, loss and backward on ``inputs``."""
        n = inputs.n_nodes
        for p in self.params:  # the graph's backward assigns fresh gradients
            p.grad = None
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            routes, rl = self._loss(inputs, steps)
            rl.loss.backward()
            done = all_done(routes, inputs.end)
        cap = _Capture(graph, steps, rl, done, [p.grad for p in self.params])
        self.captures[(n, steps)] = cap
        return cap
