"""The static-shape training rollout for GPUs (docs/model.md, speed-up 12): every route keeps
all n node rows at every step, and finished or forced routes stay in the batch, taking the end
node with log-probability and entropy 0. Same policy as :mod:`optw.decode.core` up to float
rounding.

Sampling: ``"compat"`` (default) draws as the compacted decoder does (the same routes from one
generator; one host synchronisation per step); ``"free"`` is Gumbel-max over ``[R, n]`` (another
random stream) and, with a fixed number of ``steps``, never synchronises
(:mod:`optw.train.graphed`).
"""

from __future__ import annotations

import torch

from optw.env.instances import Instances
from optw.env.state import Features, adjacency, still_admissible, visit_end
from optw.model.network import PointerNet, graph_bias

SAMPLINGS = ("compat", "free")


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
    # what the steps read and never change: per route, its tourist's tables
    rr, col = torch.arange(r, device=dev), torch.arange(n, device=dev)
    is_end, row_route = col == n - 1, rr.repeat_interleave(n)
    opening, _, dur, latest = inst.node_u.index_select(0, ids).unbind(-1)  # [R, n] each
    feat = Features(inst)
    static_rows = model.embed_static(inst.static).index_select(0, ids).reshape(r * n, -1)
    dist = inst.dist_u.index_select(0, ids)  # [R, n, n]
    const, span = feat.const.index_select(0, ids), feat.span.index_select(0, ids)

    def observe(cur: torch.Tensor, t: torch.Tensor,
                mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Network inputs of every node [R·n, d] and the graph's attention bias [R, 1, n, n]."""
        travel = dist[rr, cur]  # [R, n]
        dyn = feat.tables(const, span, t, travel).view(r * n, -1)
        if model.cfg.graph == "lookahead":
            adj = adjacency(mask, visit_end(t.unsqueeze(1) + travel, opening, dur), dist, latest)
        else:
            adj = adjacency(mask)
        return model.embed(static_rows, dyn), graph_bias(adj)

    # steps 1-2 of the decoding sequence: the start admissible, then visited
    cur = torch.zeros(r, dtype=torch.long, device=dev)
    t = inst.t_start_u.index_select(0, ids)
    mask = still_admissible(torch.ones_like(latest, dtype=torch.bool), t, dist[:, 0], latest)
    x, bias = observe(cur, t, mask)
    prev = model.encode_dense(x, x, bias)
    lstm_in = prev.view(r, n, -1)[:, 0]
    h, c = model.initial_state(r)
    mask = mask & (col != 0)
    done = torch.zeros(r, dtype=torch.bool, device=dev)
    routes = torch.full((r, n + 1), -1, dtype=torch.long, device=dev)
    routes[:, 0] = 0
    steps_lp: list[torch.Tensor] = []
    steps_ent: list[torch.Tensor] = []
    for step in range(1, n + 1 if steps is None else min(steps, n) + 1):
        x, bias = observe(cur, t, mask)
        enc = model.encode_dense(x, prev, bias)
        h, c = model.lstm(lstm_in, (h, c))
        allowed = mask | (done.unsqueeze(1) & is_end)  # finished routes: the end, p = 1
        logits = model.pointer(enc, h, row_route).view(r, n).masked_fill(~allowed, float("-inf"))
        logp = torch.log_softmax(logits, dim=1)
        with torch.no_grad():
            if greedy:
                choice = logits.argmax(1)
            elif sampling == "free":  # Gumbel-max: argmax p / q, q ~ Exp(1)
                noise = torch.empty(r, n, device=dev).exponential_(1, generator=generator)
                choice = (logp.exp() / noise).argmax(1)
            else:
                choice = _compat_choice(logp, mask, done, n - 1, generator)
        live = ~done  # routes done before stay where they are, column -1
        steps_lp.append(logp.gather(1, choice.unsqueeze(1)).squeeze(1))
        steps_ent.append(-(logp.exp() * logp.masked_fill(~allowed, 0.0)).sum(1))
        routes[:, step] = torch.where(live, choice, -1)
        # a gather (not enc[rr, choice]): its backward is a plain scatter-add
        d = enc.shape[1]
        lstm_in = enc.view(r, n, d).gather(1, choice.view(r, 1, 1).expand(r, 1, d)).squeeze(1)
        arrival = t + dist[rr, cur, choice]
        t = torch.where(live, visit_end(arrival, opening[rr, choice], dur[rr, choice]), t)
        cur = torch.where(live, choice, cur)
        done = done | (choice == n - 1)
        mask = still_admissible(mask & (col != choice.unsqueeze(1)) & ~done.unsqueeze(1), t,
                                dist[rr, cur], latest)
        prev = enc
        if steps is None and bool(done.all()):
            break
    if steps is None:
        routes = routes[:, : int((routes >= 0).sum(1).max())]
    return routes, torch.stack(steps_lp).sum(0), torch.stack(steps_ent).sum(0)


def all_done(routes: torch.Tensor, end: int) -> torch.Tensor:
    """Whether every (untrimmed) route reached the end, a 0-d bool tensor (no host sync)."""
    return (routes == end).any(1).all()


def _compat_choice(logp: torch.Tensor, mask: torch.Tensor, done: torch.Tensor, end: int,
                   generator: torch.Generator | None) -> torch.Tensor:
    """The compacted decoder's draw over the admissible nodes of each live route with more than
    the end admissible (a table as wide as the widest); the others take the end node."""
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
