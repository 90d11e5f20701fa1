"""Training steps replayed as CUDA graphs (opt-in: ``[train] rollout = "graph"``, CUDA only;
docs/model.md, speed-up 13). An epoch's static rollout (``"free"`` sampling, S steps), loss and
backward are captured once and replayed on static input buffers; clipping and Adam run eagerly.
The first :data:`WARMUP` epochs of each node count run eagerly on a side stream and set S from
their longest route; a replay that leaves a route unfinished makes S grow and redoes the epoch.
The Gumbel noise comes from the device's default CUDA generator (another random stream).
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
    at least one more, rounded up to :data:`STEP_GRAIN`, at most n."""
    return min(n, STEP_GRAIN * math.ceil((longest + 1) / STEP_GRAIN))


class GraphedStep:
    """:func:`~optw.train.step.reinforce_step` for rollout ``"graph"``: called with each epoch's
    instances and learning rate, returns the loss and the gradient norm."""

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
        """An eager epoch on the side stream (warm-up); sets S from its longest route."""
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
                                      entropy, self.config.batch_size, self.config.beta,
                                      self.config.advantage)

    def _inputs(self, instances: Instances) -> Instances:
        """The static buffers for this node count, holding ``instances``' tensors."""
        tensors = {f.name: getattr(instances, f.name) for f in dataclasses.fields(instances)
                   if isinstance(getattr(instances, f.name), torch.Tensor)}
        buf = self.inputs.get(instances.n_nodes)
        if buf is None:
            buf = dataclasses.replace(instances, **{k: v.clone() for k, v in tensors.items()})
            self.inputs[instances.n_nodes] = buf
        else:
            for k, v in tensors.items():
                getattr(buf, k).copy_(v)
        return buf

    def _capture(self, inputs: Instances, steps: int) -> _Capture:
        """Capture S = ``steps`` steps of rollout, loss and backward on ``inputs``."""
        for p in self.params:  # the graph's backward assigns fresh gradients
            p.grad = None
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            routes, rl = self._loss(inputs, steps)
            rl.loss.backward()
            done = all_done(routes, inputs.end)
        cap = self.captures[(inputs.n_nodes, steps)] = _Capture(graph, steps, rl, done,
                                                                 [p.grad for p in self.params])
        return cap
