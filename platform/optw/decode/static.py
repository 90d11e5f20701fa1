"""The static-shape training rollout (for GPUs): every route keeps all n node rows at every step.

Unlike the compacted decoder (:mod:`optw.decode.core`), every step has fixed shapes (R routes ×
n nodes, dense masked attention over one ``[R, H, n, n]`` table), what a route never changes is
computed once, and finished or forced routes stay in the batch taking the end node with
log-probability and entropy 0. Same policy and numbers (up to float rounding) as the compacted
decoder: inadmissible rows are computed but never attended to, and the pointer masks them.

Sampling: ``"compat"`` (default) draws as the compacted decoder does (over each live, unforced
route's admissible nodes, in route order), so both sample the same routes from one generator, at
one host synchronisation per step; ``"free"`` is Gumbel-max over ``[R, n]`` (the same
distribution, another random stream) and, with a fixed number of ``steps``, never synchronises
with the host (what :mod:`optw.train.graphed` captures as a CUDA graph).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from optw.env.instances import Instances
from optw.env.state import Features, adjacency, still_admissible, visit_end
from optw.model.network import MASKED_SCORE, PointerNet

SAMPLINGS = ("compat", "free")


class _Tables(NamedTuple):
    """What a static rollout's steps read and never change: per route, its tourist's tables."""

    rr: torch.Tensor  # route numbers [R]
    col: torch.Tensor  # node numbers [n]
    is_end: torch.Tensor  # col == end
    row_route: torch.Tensor  # route of each node row [R·n]
    static_rows: torch.Tensor  # static embeddings [R·n, d/2]
    dist: torch.Tensor  # [R, n, n] int32
    opening: torch.Tensor  # [R, n] each: opening, visit duration, latest start
    dur: torch.Tensor
    latest: torch.Tensor
    feat: Features  # the dynamic features' tables (optw.env)
    const: torch.Tensor  # and their per-route constant part [R, n, 8] and span [R]
    span: torch.Tensor


def _tables(model: PointerNet, inst: Instances, ids: torch.Tensor) -> _Tables:
    dev = inst.device
    r, n = ids.shape[0], inst.n_nodes
    rr = torch.arange(r, device=dev)
    col = torch.arange(n, device=dev)
    opening, _, dur, latest = inst.node_u.index_select(0, ids).unbind(-1)  # [R, n] each
    feat = Features(inst)
    return _Tables(
        rr=rr, col=col, is_end=col == n - 1, row_route=rr.repeat_interleave(n),
        static_rows=model.embed_static(inst.static).index_select(0, ids).reshape(r * n, -1),
        dist=inst.dist_u.index_select(0, ids), opening=opening, dur=dur, latest=latest,
        feat=feat, const=feat.const.index_select(0, ids), span=feat.span.index_select(0, ids))


def _observe(model: PointerNet, tb: _Tables, cur: torch.Tensor, t: torch.Tensor,
             mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Network inputs of every node [R·n, d] and the graph's attention bias [R, 1, n, n]
    (the environment's features and graph, :mod:`optw.env.state`)."""
    r, n = mask.shape
    travel = tb.dist[tb.rr, cur]  # [R, n]
    dyn = tb.feat.tables(tb.const, tb.span, t, travel).view(r * n, -1)
    if model.cfg.graph == "lookahead":
        leave = visit_end(t.unsqueeze(1) + travel, tb.opening, tb.dur)
        adj = adjacency(mask, leave, tb.dist, tb.latest)
    else:
        adj = adjacency(mask)
    bias = torch.where(adj, 0.0, MASKED_SCORE).unsqueeze(1)
    return model.embed(tb.static_rows, dyn), bias


def _policy(model: PointerNet, tb: _Tables, cur: torch.Tensor, t: torch.Tensor,
            mask: torch.Tensor, done: torch.Tensor, prev: torch.Tensor, lstm_in: torch.Tensor,
            h: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """One decoding step's network pass: the encodings ``enc`` [R·n, d], the LSTM state, the
    logits and log-probabilities [R, n] and the nodes allowed (a finished route: the end)."""
    r, n = mask.shape
    x, bias = _observe(model, tb, cur, t, mask)
    enc = model.encode_dense(x, prev, bias)
    h, c = model.lstm(lstm_in, (h, c))
    allowed = mask | (done.unsqueeze(1) & tb.is_end)  # finished routes: the end, p = 1
    logits = model.pointer(enc, h, tb.row_route).view(r, n).masked_fill(~allowed,
                                                                        float("-inf"))
    return enc, h, c, logits, torch.log_softmax(logits, dim=1), allowed


def _advance(tb: _Tables, choice: torch.Tensor, enc: torch.Tensor, logp: torch.Tensor,
             allowed: torch.Tensor, cur: torch.Tensor, t: torch.Tensor, mask: torch.Tensor,
             done: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The step's log-probability and entropy [R] of ``choice``, the routes' new column (-1 for
    routes done before, which stay where they are), and the environment's step: the next LSTM
    input, time, node, done flags and admissible nodes."""
    r, n = mask.shape
    d, rr, live = enc.shape[1], tb.rr, ~done
    lp = logp.gather(1, choice.unsqueeze(1)).squeeze(1)
    ent = -(logp.exp() * logp.masked_fill(~allowed, 0.0)).sum(1)
    column = torch.where(live, choice, -1)
    # a gather (not enc[rr, choice]): its backward is a plain scatter-add
    lstm_in = enc.view(r, n, d).gather(1, choice.view(r, 1, 1).expand(r, 1, d)).squeeze(1)
    arrival = t + tb.dist[rr, cur, choice]
    t = torch.where(live, visit_end(arrival, tb.opening[rr, choice], tb.dur[rr, choice]), t)
    cur = torch.where(live, choice, cur)
    done = done | (choice == n - 1)
    mask = still_admissible(mask & (tb.col != choice.unsqueeze(1)) & ~done.unsqueeze(1), t,
                            tb.dist[rr, cur], tb.latest)
    return lp, ent, column, lstm_in, t, cur, done, mask


def static_rollout(model: PointerNet, inst: Instances, ids: torch.Tensor, greedy: bool = False,
                   generator: torch.Generator | None = None, sampling: str = "compat",
                   steps: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Routes (padded with -1), summed log-probabilities and entropies [R] of one route per
    entry of ``ids``. ``steps`` (``"free"`` sampling or greedy only): exactly that many steps
    (at most n), no host synchronisation, routes untrimmed ``[R, n + 1]`` (:func:`all_done`)."""
    if sampling not in SAMPLINGS:
        raise ValueError(f"unknown sampling {sampling!r}; expected one of {SAMPLINGS}")
    if steps is not None and sampling != "free" and not greedy:
        raise ValueError("a fixed number of steps needs sampling='free' (or greedy): the "
                         "compat draw synchronises with the host")
    dev = inst.device
    r, n = ids.shape[0], inst.n_nodes
    tb = _tables(model, inst, ids)
    cur, t, mask, prev, lstm_in, h, c = _start(model, inst, ids, tb)
    done = torch.zeros(r, dtype=torch.bool, device=dev)
    routes = torch.full((r, n + 1), -1, dtype=torch.long, device=dev)
    routes[:, 0] = 0
    steps_lp: list[torch.Tensor] = []
    steps_ent: list[torch.Tensor] = []
    for step in range(1, n + 1 if steps is None else min(steps, n) + 1):
        enc, h, c, logits, logp, allowed = _policy(model, tb, cur, t, mask, done, prev,
                                                   lstm_in, h, c)
        with torch.no_grad():
            if greedy:
                choice = logits.argmax(1)
            elif sampling == "free":  # Gumbel-max: argmax p / q, q ~ Exp(1)
                noise = torch.empty(r, n, device=dev).exponential_(1, generator=generator)
                choice = (logp.exp() / noise).argmax(1)
            else:
                choice = _compat_choice(logp, mask, done, n - 1, generator)
        lp, ent, routes[:, step], lstm_in, t, cur, done, mask = _advance(
            tb, choice, enc, logp, allowed, cur, t, mask, done)
        steps_lp.append(lp)
        steps_ent.append(ent)
        prev = enc
        if steps is None and bool(done.all()):
            break
    if steps is None:
        routes = routes[:, : int((routes >= 0).sum(1).max())]
    return routes, torch.stack(steps_lp).sum(0), torch.stack(steps_ent).sum(0)


def _start(model: PointerNet, inst: Instances, ids: torch.Tensor, tb: _Tables,
           ) -> tuple[torch.Tensor, ...]:
    """Steps 1-2 of the decoding sequence (the start admissible, then visited): each route's
    node, time, admissible nodes, the first encodings, the LSTM's first input and state."""
    r = ids.shape[0]
    cur = torch.zeros(r, dtype=torch.long, device=inst.device)
    t = inst.t_start_u.index_select(0, ids)
    mask = still_admissible(torch.ones_like(tb.latest, dtype=torch.bool), t, tb.dist[:, 0],
                            tb.latest)
    x, bias = _observe(model, tb, cur, t, mask)
    prev = model.encode_dense(x, x, bias)
    lstm_in = prev.view(r, inst.n_nodes, -1)[:, 0]
    h, c = model.initial_state(r)
    return cur, t, mask & (tb.col != 0), prev, lstm_in, h, c


def all_done(routes: torch.Tensor, end: int) -> torch.Tensor:
    """Whether every (untrimmed) route reached the end node, as a 0-d bool tensor (no host
    synchronisation until read)."""
    return (routes == end).any(1).all()


def _compat_choice(logp: torch.Tensor, mask: torch.Tensor, done: torch.Tensor, end: int,
                   generator: torch.Generator | None) -> torch.Tensor:
    """The compacted decoder's draw for each live route with more than the end admissible,
    over its admissible nodes in ascending order (a table as wide as the widest); the others
    take the end node."""
    count = mask.sum(1)
    need = ~done & (count > 1)
    choice = torch.full_like(count, end)
    sel = need.nonzero().squeeze(1)
    if sel.numel() == 0:
        return choice
    m_rows = mask.index_select(0, sel)
    width = int(count.index_select(0, sel).max())
    q = torch.empty(sel.shape[0], width, device=logp.device).exponential_(1, generator=generator)
    rank = (torch.cumsum(m_rows, 1) - 1).clamp_(0, width - 1)
    p = logp.index_select(0, sel).exp().masked_fill(~m_rows, 0.0)
    return choice.index_copy_(0, sel, (p / q.gather(1, rank)).argmax(1))
