"""Beam search, batched over tourists (``shared/spec/published-checkpoints.md``, item 6).

Ranking as docs/model.md's table says (one ``topk`` per step over a padded ``[K, beams·m]``
table in the authors' (beam, node) order); among equal scores the answer is the
earliest-finished, best-ranked route. Beams whose only admissible node is the end skip the
network (their one pair has log-probability exactly 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from optw.decode.core import Decoder, Frontier, Pass
from optw.decode.limits import PAPER_BEAMS
from optw.env.instances import Instances
from optw.model.network import PointerNet


@dataclass
class BeamResult:
    """Per tourist: the best finished route, its score and log-prob, and how many finished."""

    routes: list[list[int]]
    scores: list[float]
    log_probs: list[float]
    finished: list[int]


@torch.inference_mode()
def beam_search(model: PointerNet, inst: Instances, width: int = PAPER_BEAMS) -> BeamResult:
    """Beam search of ``width`` beams for every tourist of ``inst`` (no gradients). User widths
    are checked at the edge (:func:`~optw.decode.limits.check_beams`)."""
    if width < 1:
        raise ValueError(f"beam width {width}: expected at least 1")
    dev = inst.device
    k_tourists = inst.n_tourists
    dec = Decoder(model, inst)
    fr: Frontier = dec.start(torch.arange(k_tourists, device=dev))
    group = torch.arange(k_tourists, device=dev)  # tourist of each beam; beams grouped in order
    route = torch.zeros(k_tourists, 1, dtype=torch.long, device=dev)  # each beam's nodes
    sum_lp = torch.zeros(k_tourists, device=dev)
    fins: list[tuple[torch.Tensor, ...]] = []  # finished routes: tourist, route, log-prob
    while group.numel():
        forced = fr.forced()
        free = (~forced).nonzero().squeeze(1)
        r = fr.count.shape[0]
        p: Pass | None = None
        if free.numel():
            sub = fr if free.numel() == r else fr.index(free)
            p = dec.evaluate(sub)
            m = p.logits.shape[1]
            logp = torch.log_softmax(p.logits, dim=1)
            if free.numel() < r:
                logp = torch.full((r, m), float("-inf"), device=dev).index_copy(0, free, logp)
        else:
            m = int(fr.count.max())
            logp = torch.full((r, m), float("-inf"), device=dev)
        if free.numel() < r:  # a forced beam's one pair (the end, its last row) has log-prob 0
            rows = forced.nonzero().squeeze(1)
            logp[rows, fr.count.index_select(0, rows) - 1] = 0.0
        cand = sum_lp.unsqueeze(1) + logp  # [R, m]

        # rank (beam, row) pairs per tourist in one padded topk; order = (beam, node)
        counts = torch.bincount(group, minlength=k_tourists)
        offsets = torch.cumsum(counts, 0) - counts
        b_max = int(counts.max())
        rank = torch.arange(r, device=dev) - offsets[group]
        table = torch.full((k_tourists, b_max, m), float("-inf"), device=dev)
        table[group, rank] = cand
        k = min(width, b_max * m)
        vals, idx = table.view(k_tourists, -1).topk(k, dim=1)
        sel_t, sel_j = torch.isfinite(vals).nonzero(as_tuple=True)
        flat = idx[sel_t, sel_j]
        parent = offsets[sel_t] + torch.div(flat, m, rounding_mode="floor")
        slot = flat % m
        new_lp = vals[sel_t, sel_j]
        node = fr.node.index_select(0, fr.offsets().index_select(0, parent) + slot)
        paths = torch.cat([route.index_select(0, parent), node.unsqueeze(1)], dim=1)

        done = node == dec.end
        if bool(done.any()):
            fins.append((sel_t[done], paths[done], new_lp[done]))
        go = (~done).nonzero().squeeze(1)
        if not go.numel():
            break
        assert p is not None  # a forced beam's only pair is the end
        sub_row = torch.cumsum((~forced).long(), 0) - 1  # row of each free beam in the pass
        fr = dec.advance(sub, p, sub_row.index_select(0, parent.index_select(0, go)),
                         slot.index_select(0, go))
        route = paths.index_select(0, go)
        group = sel_t.index_select(0, go)
        sum_lp = new_lp.index_select(0, go)
    return best_routes(inst, fins)


def best_routes(inst: Instances, fins: list[tuple[torch.Tensor, ...]]) -> BeamResult:
    """The highest-score route per tourist (first found among equal scores) among the groups
    ``(tourist[C], routes[C, L] padded with -1, log_prob[C])`` of ``fins``."""
    k_tourists = inst.n_tourists
    scores = inst.scores.double()
    best: list[tuple[float, list[int], float] | None] = [None] * k_tourists
    finished = [0] * k_tourists
    for g, routes, lp in fins:
        totals = (scores.index_select(0, g).gather(1, routes.clamp(min=0)) * (routes >= 0)).sum(1)
        for t, route, total, logp in zip(g.tolist(), routes.tolist(), totals.tolist(),
                                         lp.tolist(), strict=True):
            finished[t] += 1
            if best[t] is None or total > best[t][0]:
                best[t] = (total, [v for v in route if v >= 0], logp)
    if any(b is None for b in best):  # cannot happen: every beam search finishes routes
        raise RuntimeError("beam search finished no route for some tourist")
    return BeamResult([b[1] for b in best], [b[0] for b in best],  # type: ignore[index]
                      [b[2] for b in best], finished)  # type: ignore[index]
