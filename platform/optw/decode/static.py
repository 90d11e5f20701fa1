"""The static-shape training rollout: every route keeps all n node rows at every step.

The compacted decoder (:mod:`optw.decode.core`) is the fastest on a CPU: it computes only the
admissible nodes of the distinct prefixes, at the price of data-dependent shapes, host
synchronisation and many small operations per step. On a GPU that price dominates (the step
is bound by launching kernels), so this rollout does the opposite:

- fixed shapes: R routes × n nodes in every step, dense masked attention over one
  ``[R, H, n, n]`` table whose graph bias is built in one batched expression;
- what does not change within a route is computed once (static embeddings, the tourists'
  distance and node tables gathered per route);
- finished routes stay in the batch: they take the end node with log-probability 0 and
  entropy 0 (no gradient), as do forced routes (only the end admissible);
- no ``nonzero``/``tolist``/Python branch on tensor values inside a step, except the ones
  the sampling mode asks for (below).

Same policy, same numbers (within float rounding) as the compacted decoder: inadmissible rows
are computed but never attended to (``Ad[i, j]`` needs j admissible) and the pointer masks them,
exactly as the compacted decoder's ``compact=False`` check mode does.

Sampling modes:

- ``"compat"`` (default): each step draws the random numbers exactly as the compacted decoder
  does (``torch.multinomial`` over each live, unforced route's admissible nodes, in route
  order), so given the same generator both rollouts sample the same routes (up to float
  rounding of near-ties). This needs the number of such routes and their widest admissible
  set each step: one host synchronisation per step, and one to stop when every route is done.
- ``"free"``: Gumbel-max over the full ``[R, n]`` table (``argmax p / Exp(1)``); with a
  fixed number of ``steps`` it needs no host synchronisation at all: what the ``graph``
  training rollout replays as a CUDA graph (:mod:`optw.train.graphed`). The same
  distribution, another random stream.
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
    """The step's log-probability and entropy [R] of ``choice``, the routes' new column
    (-1 for routes done before), and the next step's LSTM input, time, node, done and mask."""
    r, n = mask.shape
    d = enc.shape[1]
    lp = logp.gather(1, choice.unsqueeze(1)).squeeze(1)
    ent = -(logp.exp() * logp.masked_fill(~allowed, 0.0)).sum(1)
    column = torch.where(~done, choice, -1)
    # a gather (not enc[rr, choice]): its backward is a plain scatter-add
    lstm_in = enc.view(r, n, d).gather(1, choice.view(r, 1, 1).expand(r, 1, d)).squeeze(1)
    t, cur, done, mask = _move(tb, choice, cur, t, mask, done)
    return lp, ent, column, lstm_in, t, cur, done, mask


def _move(tb: _Tables, choice: torch.Tensor, cur: torch.Tensor, t: torch.Tensor,
          mask: torch.Tensor, done: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The environment's step for every route taking ``choice`` [R] (routes done before stay
    where they are): the new time, node, done flags and admissible nodes."""
    rr = tb.rr
    live = ~done
    arrival = t + tb.dist[rr, cur, choice]
    t = torch.where(live, visit_end(arrival, tb.opening[rr, choice], tb.dur[rr, choice]), t)
    cur = torch.where(live, choice, cur)
    done = done | (choice == tb.col.shape[0] - 1)
    mask = still_admissible(mask & (tb.col != choice.unsqueeze(1)) & ~done.unsqueeze(1), t,
                            tb.dist[rr, cur], tb.latest)
    return t, cur, done, mask


def static_rollout(
    model: PointerNet,
    inst: Instances,
    ids: torch.Tensor,
    greedy: bool = False,
    generator: torch.Generator | None = None,
    sampling: str = "compat",
    steps: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Routes ``[R, n + 1]`` (padded with -1), summed log-probabilities and entropies [R] of one
    route per entry of ``ids``; see the module docstring.

    ``steps`` (``"free"`` sampling or greedy only): run exactly that many decoding steps (at
    most n), with no host synchronisation at all, and return the routes untrimmed
    ``[R, n + 1]``; a route still unfinished then has no end node (:func:`all_done`). For
    CUDA-graph capture (:mod:`optw.train.graphed`)."""
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
    """Steps 1-2 of the decoding sequence (the start still admissible, then visited): each
    route's node, time and admissible nodes, the first pass's encodings (the next pass's
    recursion input), the LSTM's first input and its initial state."""
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
    """Whether every route of ``routes`` (untrimmed, from a fixed number of steps) reached the
    end node: a 0-d bool tensor, read without a host synchronisation until asked."""
    return (routes == end).any(1).all()


def _compat_choice(logp: torch.Tensor, mask: torch.Tensor, done: torch.Tensor, end: int,
                   generator: torch.Generator | None) -> torch.Tensor:
    """The compacted decoder's draw: ``torch.multinomial`` over each live route with a choice
    (more than the end admissible), on a table of its admissible nodes in ascending order as
    wide as the widest, routes in order; the others take the end node."""
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
