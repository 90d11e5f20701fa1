"""Active search (paper, Algorithm 2): fine-tune a copy of the model on one tourist, then beam.

Each epoch samples ``batch_size`` routes of the tourist and takes one Adam step on the REINFORCE
loss with the batch-mean baseline (:func:`~optw.decode.reinforce.reinforce_loss`), the gradient
norm clipped to ``max_grad_norm`` (``beta`` and the clipping follow the published training
arguments; ``beta=0``, ``max_grad_norm=None``: the bare algorithm). The caller's model is left
untouched.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from optw.decode.beam import beam_search
from optw.decode.core import rollout
from optw.decode.limits import PAPER_BEAMS
from optw.decode.reinforce import reinforce_loss
from optw.env.instances import Instances
from optw.model.network import PointerNet


@dataclass
class ActiveSearchResult:
    """The chosen route and its score, plus the mean sampled reward of every epoch."""

    route: list[int]
    score: float
    beam_route: list[int]
    mean_reward: list[float] = field(default_factory=list)


def active_search(model: PointerNet, inst: Instances, epochs: int = 128, batch_size: int = 32,
                  lr: float = 1e-5, beams: int = PAPER_BEAMS, beta: float = 0.01,
                  max_grad_norm: float | None = 1.0, generator: torch.Generator | None = None,
                  keep_greedy: bool = True, progress: Callable[[float], None] | None = None,
                  ) -> ActiveSearchResult:
    """Active search for the single tourist of ``inst``: the tuned model's beam route, or with
    ``keep_greedy`` the best of it, the original model's greedy and beam routes and the best
    sample. ``progress`` is called after every epoch with its best sampled reward."""
    if inst.n_tourists != 1:
        raise ValueError(f"active search works on one tourist at a time, got {inst.n_tourists}")
    if epochs < 0 or batch_size < 1:
        raise ValueError(f"need epochs >= 0 and batch_size >= 1, got {epochs}, {batch_size}")
    net = copy.deepcopy(model)
    net.train()
    for p in net.parameters():
        p.requires_grad_(True)
    opt = torch.optim.Adam(net.parameters(), lr=lr, foreach=True)
    ids = torch.zeros(batch_size, dtype=torch.long, device=inst.device)
    scores = inst.scores[0].double()
    best: tuple[float, list[int]] | None = None
    history: list[float] = []
    for _ in range(epochs):
        with torch.enable_grad():
            out = rollout(net, inst, ids, generator=generator)
            loss = reinforce_loss(out.reward, out.log_prob, out.entropy, batch_size, beta).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(net.parameters(), max_grad_norm, foreach=True)
        opt.step()
        history.append(float(out.reward.mean()))
        if keep_greedy:
            k = int(out.reward.argmax())
            route = [v for v in out.routes[k].tolist() if v >= 0]
            total = float(scores[route].sum())
            if best is None or total > best[0]:
                best = (total, route)
        if progress is not None:
            progress(float(out.reward.max()))
    net.eval()
    beam_route = beam_search(net, inst, beams).routes[0]
    candidates = [beam_route]
    if keep_greedy:
        with torch.inference_mode():
            greedy = rollout(model, inst, greedy=True).routes[0]
        candidates.append([v for v in greedy.tolist() if v >= 0])
        candidates.append(beam_search(model, inst, beams).routes[0])
        if best is not None:
            candidates.append(best[1])
    totals = [float(scores[c].sum()) for c in candidates]
    i = max(range(len(candidates)), key=lambda j: (totals[j], -j))
    return ActiveSearchResult(candidates[i], totals[i], beam_route, history)
