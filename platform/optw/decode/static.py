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
- ``"free"`` (rollout mode ``"static-free"``): Gumbel-max over the full ``[R, n]`` table
  (``argmax p / Exp(1)``), no host synchronisation except a done check every
  :data:`SYNC_EVERY` steps. The same distribution, another random stream (so other routes
  than the compacted decoder for the same seed): opt-in.
"""

from __future__ import annotations

import os

import torch

from optw.env.instances import Instances
from optw.env.state import visit_end
from optw.model.network import MASKED_SCORE, PointerNet

SAMPLINGS = ("compat", "free")
#: Rollout modes of :func:`optw.decode.rollout` (``static-free``: static, ``"free"`` sampling).
ROLLOUTS = ("compact", "static", "static-free")
#: Rollouts training can take: :data:`ROLLOUTS` and ``"graph"``, the ``static-free`` rollout
#: with a fixed number of steps, replayed with its backward as a CUDA graph
#: (:mod:`optw.train.graphed`; CUDA only, opt-in).
TRAIN_ROLLOUTS = (*ROLLOUTS, "graph")
#: In ``"free"`` sampling, steps between two checks whether every route is done.
SYNC_EVERY = 8


#: Most node rows (routes × nodes) the static rollout takes in training: it keeps every row's
#: activations of every step for the backward (~15 kB per row and step), so larger batches
#: (e.g. K = 64 × B = 32 on t101, 209k rows) go compacted.
STATIC_MAX_ROWS = 1 << 16
#: Most node rows the opt-in ``"graph"`` rollout takes: it runs a fixed number of steps, which
#: pays while launching kernels is the bottleneck (small batches: on an H200, t101 at B = 32
#: trained 4.8x faster than ``static``) but not on compute-bound ones (B = 512: about 0.66x),
#: which go ``static``.
GRAPH_MAX_ROWS = 1 << 14


def training_rollout(device: torch.device | str, rows: int = 0, choice: str = "auto") -> str:
    """The rollout training uses on ``device`` for ``rows`` node rows (routes × nodes):
    ``choice`` (a run's ``[train] rollout``) unless it is ``"auto"``, then the environment
    variable ``OPTW_ROLLOUT`` if set, else ``"static"`` on CUDA (launch-bound) up to
    :data:`STATIC_MAX_ROWS` and ``"compact"`` otherwise (compute-bound CPU, or too large).
    ``"graph"`` needs CUDA, and goes ``"static"`` above :data:`GRAPH_MAX_ROWS`, ``"compact"``
    above :data:`STATIC_MAX_ROWS`."""
    where = "rollout"
    forced = choice
    if choice == "auto":
        where, forced = "OPTW_ROLLOUT", os.environ.get("OPTW_ROLLOUT", "").strip()
    cuda = torch.device(device).type == "cuda"
    if forced:
        if forced not in TRAIN_ROLLOUTS:
            raise ValueError(f"{where}={forced!r}; expected one of {TRAIN_ROLLOUTS}")
        if forced == "graph" and not cuda:
            raise ValueError(f"{where}=graph replays CUDA graphs: it needs a CUDA device, "
                             f"not {torch.device(device)}")
        if forced != "graph" or rows <= GRAPH_MAX_ROWS:
            return forced
    return "static" if cuda and rows <= STATIC_MAX_ROWS else "compact"


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
    route per entry of ``ids``; see the module docstring. (:func:`optw.decode.rollout` wraps
    it with ``mode="static"``.)

    ``steps``: run exactly that many decoding steps (at most n), with no host synchronisation
    at all (``"free"`` sampling or greedy only), and return the routes untrimmed ``[R, n + 1]``;
    a route still unfinished then has no end node (:func:`all_done`). For CUDA-graph capture
    (:mod:`optw.train.graphed`)."""
    if sampling not in SAMPLINGS:
        raise ValueError(f"unknown sampling {sampling!r}; expected one of {SAMPLINGS}")
    if steps is not None and sampling != "free" and not greedy:
        raise ValueError("a fixed number of steps needs sampling='free' (or greedy): the "
                         "compat draw synchronises with the host")
    dev = inst.device
    r, n = ids.shape[0], inst.n_nodes
    end = n - 1
    d = model.cfg.d_model
    rr = torch.arange(r, device=dev)
    col = torch.arange(n, device=dev)
    is_end = col == end
    # per route, fixed for the whole rollout
    static_rows = model.embed_static(inst.static).index_select(0, ids).reshape(r * n, -1)
    dist = inst.dist_u.index_select(0, ids)  # [R, n, n] int32
    opening, closing, dur, latest = inst.node_u.index_select(0, ids).unbind(-1)  # [R, n] each
    ts = inst.t_start_u.index_select(0, ids).unsqueeze(1)  # [R, 1]
    te = inst.t_end_u.index_select(0, ids).unsqueeze(1)
    span = (te - ts).to(torch.float32).unsqueeze(2)  # [R, 1, 1]
    # dynamic features (o - t, c - t, T_end - t, t - T_start, a - T_start, o - a, c - a,
    # T_end - a) = fixed + t·coef_t + a·coef_a, in exact integer time units
    te_n, ts_n = te.expand(r, n), ts.expand(r, n)
    fixed = torch.stack([opening, closing, te_n, -ts_n, -ts_n, opening, closing, te_n], dim=-1)
    coef_t, coef_a = _coefficients(dev, fixed.dtype)
    row_route = rr.repeat_interleave(n)
    eye = torch.eye(n, dtype=torch.bool, device=dev)
    lookahead = model.cfg.graph == "lookahead"

    def observe(cur: torch.Tensor, t: torch.Tensor, mask: torch.Tensor,
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Network inputs of every node [R·n, d] and the graph's attention bias [R, 1, n, n]
        (:func:`~optw.env.state.node_features` and :func:`~optw.env.state.graph_mask`)."""
        arrival = t.unsqueeze(1) + dist[rr, cur]  # [R, n]
        # the 8 features as exact integers: fixed part + t·coef_t + arrival·coef_a
        feats = fixed + t.view(r, 1, 1) * coef_t + arrival.unsqueeze(2) * coef_a
        dyn = (feats.to(torch.float32) / span).view(r * n, -1)
        adj = mask.unsqueeze(1)
        if lookahead:
            leave = visit_end(arrival, opening, dur)
            adj = adj & ((leave.unsqueeze(2) + dist) <= latest.unsqueeze(1))
        adj = adj | eye
        bias = torch.where(adj, 0.0, MASKED_SCORE).unsqueeze(1)
        return model.embed(static_rows, dyn), bias

    # steps 1-2 of the decoding sequence: the start still admissible, then visited
    cur = torch.zeros(r, dtype=torch.long, device=dev)
    t = ts.squeeze(1)
    mask = (t.unsqueeze(1) + dist[:, 0]) <= latest
    x, bias = observe(cur, t, mask)
    prev = model.encode_dense(x, x, bias)
    lstm_in = prev.view(r, n, d)[:, 0]
    mask = mask & (col != 0)
    h, c = model.initial_state(r)
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
        logits = model.pointer(enc, h, row_route).view(r, n).masked_fill(~allowed,
                                                                         float("-inf"))
        logp = torch.log_softmax(logits, dim=1)
        with torch.no_grad():
            if greedy:
                choice = logits.argmax(1)
            elif sampling == "free":
                q = torch.empty(r, n, device=dev).exponential_(1, generator=generator)
                choice = (logp.exp() / q).argmax(1)
            else:
                choice = _compat_choice(logp, mask, done, end, generator)
        steps_lp.append(logp.gather(1, choice.unsqueeze(1)).squeeze(1))
        steps_ent.append(-(logp.exp() * logp.masked_fill(~allowed, 0.0)).sum(1))
        live = ~done
        routes[:, step] = torch.where(live, choice, -1)
        # a gather (not enc[rr, choice]): its backward is a plain scatter-add
        lstm_in = enc.view(r, n, d).gather(1, choice.view(r, 1, 1).expand(r, 1, d)).squeeze(1)
        prev = enc
        arrival = t + dist[rr, cur, choice]
        t = torch.where(live, visit_end(arrival, opening[rr, choice], dur[rr, choice]), t)
        cur = torch.where(live, choice, cur)
        done = done | (choice == end)
        mask = (mask & (col != choice.unsqueeze(1)) & ~done.unsqueeze(1)
                & ((t.unsqueeze(1) + dist[rr, cur]) <= latest))
        if steps is None and (sampling != "free" or greedy or step % SYNC_EVERY == 0) and bool(
                done.all()):
            break
    if steps is not None:
        return routes, torch.stack(steps_lp).sum(0), torch.stack(steps_ent).sum(0)
    lengths = (routes >= 0).sum(1)
    routes = routes[:, : int(lengths.max())]
    return routes, torch.stack(steps_lp).sum(0), torch.stack(steps_ent).sum(0)


def all_done(routes: torch.Tensor, end: int) -> torch.Tensor:
    """Whether every route of ``routes`` (untrimmed, from a fixed number of steps) reached the
    end node: a 0-d bool tensor, read without a host synchronisation until asked."""
    return (routes == end).any(1).all()


_COEFFICIENTS: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}


def _coefficients(dev: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The dynamic features' coefficients of t and of the arrival, made once per device (a
    host-to-device copy is not allowed while a CUDA graph is being captured)."""
    key = (dev, dtype)
    if key not in _COEFFICIENTS:
        _COEFFICIENTS[key] = (
            torch.tensor([-1, -1, -1, 1, 0, 0, 0, 0], dtype=dtype, device=dev),
            torch.tensor([0, 0, 0, 0, 1, -1, -1, -1], dtype=dtype, device=dev))
    return _COEFFICIENTS[key]


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
