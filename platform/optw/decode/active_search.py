"""Active search (paper, Algorithm 2): fine-tune a copy of the model on one tourist (REINFORCE
with the batch-mean baseline, the published entropy bonus 0.01 and gradient clip 1, one Adam step
per epoch), then beam search. The caller's model is left untouched.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch

from optw.decode.beam import beam_search
from optw.decode.core import greedy_routes, rollout
from optw.decode.limits import (
    ACTIVE_SEARCH_BATCH,
    ACTIVE_SEARCH_EPOCHS,
    ACTIVE_SEARCH_LR,
    PAPER_BEAMS,
)
from optw.decode.reinforce import reinforce_loss
from optw.env.instances import Instances
from optw.model.network import PointerNet


def active_search(model: PointerNet, inst: Instances, epochs: int = ACTIVE_SEARCH_EPOCHS,
                  batch_size: int = ACTIVE_SEARCH_BATCH, lr: float = ACTIVE_SEARCH_LR,
                  beams: int = PAPER_BEAMS,
                  generator: torch.Generator | None = None, keep_greedy: bool = True,
                  progress: Callable[[float], None] | None = None) -> list[int]:
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
    samples: list[list[int]] = []  # each epoch's best
    for _ in range(epochs):
        with torch.enable_grad():
            out = rollout(net, inst, ids, generator=generator)
            loss = reinforce_loss(out.reward, out.log_prob, out.entropy, batch_size, 0.01).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0, foreach=True)
        opt.step()
        if keep_greedy:
            samples.append([v for v in out.routes[int(out.reward.argmax())].tolist() if v >= 0])
        if progress is not None:
            progress(float(out.reward.max()))
    net.eval()
    candidates = [beam_search(net, inst, beams).routes[0]]
    if keep_greedy:
        candidates += [greedy_routes(model, inst)[0], beam_search(model, inst, beams).routes[0],
                       *samples]
    totals = [float(scores[c].sum()) for c in candidates]
    return candidates[max(range(len(candidates)), key=lambda j: (totals[j], -j))]
