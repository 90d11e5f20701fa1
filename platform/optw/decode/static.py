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

Rollout mode ``"compiled"`` (opt-in) runs each ``"free"`` step as one ``torch.compile``-d
function (:func:`compiled_step`): the same draws and routes, values within float rounding,
far fewer operations per step; for GPUs (``docs/model.md``, technique 14).
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable
from typing import NamedTuple

import torch

from optw.env.instances import Instances
from optw.env.state import visit_end
from optw.model.network import MASKED_SCORE, PointerNet

SAMPLINGS = ("compat", "free")
#: Rollout modes of :func:`optw.decode.rollout` (``static-free``: static, ``"free"`` sampling;
#: ``compiled``: ``static-free`` with each step through ``torch.compile``, opt-in, not exact).
ROLLOUTS = ("compact", "static", "static-free", "compiled")
#: Rollouts training can take: :data:`ROLLOUTS`, ``"graph"``, the ``static-free`` rollout
#: with a fixed number of steps, replayed with its backward as a CUDA graph
#: (:mod:`optw.train.graphed`; CUDA only, opt-in).
#: and ``"graph-compiled"``, the ``compiled`` one replayed the same way.
TRAIN_ROLLOUTS = (*ROLLOUTS, "graph", "graph-compiled")
#: The rollouts replayed as CUDA graphs.
GRAPH_ROLLOUTS = ("graph", "graph-compiled")
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
    above :data:`STATIC_MAX_ROWS`; ``"graph-compiled"`` likewise, with ``"compiled"`` for
    ``"static"``."""
    where = "rollout"
    forced = choice
    if choice == "auto":
        where, forced = "OPTW_ROLLOUT", os.environ.get("OPTW_ROLLOUT", "").strip()
    cuda = torch.device(device).type == "cuda"
    if forced:
        if forced not in TRAIN_ROLLOUTS:
            raise ValueError(f"{where}={forced!r}; expected one of {TRAIN_ROLLOUTS}")
        if forced in GRAPH_ROLLOUTS and not cuda:
            raise ValueError(f"{where}={forced} replays CUDA graphs: it needs a CUDA device, "
                             f"not {torch.device(device)}")
        if forced not in GRAPH_ROLLOUTS or rows <= GRAPH_MAX_ROWS:
            return forced
        if forced == "graph-compiled" and rows <= STATIC_MAX_ROWS:
            return "compiled"
    return "static" if cuda and rows <= STATIC_MAX_ROWS else "compact"


class _Tables(NamedTuple):
    """What a static rollout's steps read and never change: per route, its tourist's tables."""

    rr: torch.Tensor  # route numbers [R]
    col: torch.Tensor  # node numbers [n]
    is_end: torch.Tensor  # col == end
    eye: torch.Tensor  # [n, n] bool
    row_route: torch.Tensor  # route of each node row [R·n]
    static_rows: torch.Tensor  # static embeddings [R·n, d/2]
    dist: torch.Tensor  # [R, n, n] int32
    opening: torch.Tensor  # [R, n] each: opening, visit duration, latest start
    dur: torch.Tensor
    latest: torch.Tensor
    span: torch.Tensor  # T_end - T_start [R, 1, 1] float
    fixed: torch.Tensor  # the dynamic features' constant part [R, n, 8]
    coef_t: torch.Tensor  # and their coefficients of t and of the arrival [8]
    coef_a: torch.Tensor


def _tables(model: PointerNet, inst: Instances, ids: torch.Tensor) -> _Tables:
    dev = inst.device
    r, n = ids.shape[0], inst.n_nodes
    rr = torch.arange(r, device=dev)
    col = torch.arange(n, device=dev)
    opening, closing, dur, latest = inst.node_u.index_select(0, ids).unbind(-1)  # [R, n] each
    ts = inst.t_start_u.index_select(0, ids).unsqueeze(1)  # [R, 1]
    te = inst.t_end_u.index_select(0, ids).unsqueeze(1)
    # dynamic features (o - t, c - t, T_end - t, t - T_start, a - T_start, o - a, c - a,
    # T_end - a) = fixed + t·coef_t + a·coef_a, in exact integer time units
    te_n, ts_n = te.expand(r, n), ts.expand(r, n)
    fixed = torch.stack([opening, closing, te_n, -ts_n, -ts_n, opening, closing, te_n], dim=-1)
    coef_t, coef_a = _coefficients(dev, fixed.dtype)
    return _Tables(
        rr=rr, col=col, is_end=col == n - 1, eye=torch.eye(n, dtype=torch.bool, device=dev),
        row_route=rr.repeat_interleave(n),
        static_rows=model.embed_static(inst.static).index_select(0, ids).reshape(r * n, -1),
        dist=inst.dist_u.index_select(0, ids), opening=opening, dur=dur, latest=latest,
        span=(te - ts).to(torch.float32).unsqueeze(2), fixed=fixed, coef_t=coef_t,
        coef_a=coef_a)


def _observe(model: PointerNet, tb: _Tables, cur: torch.Tensor, t: torch.Tensor,
             mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Network inputs of every node [R·n, d] and the graph's attention bias [R, 1, n, n]
    (:func:`~optw.env.state.node_features` and :func:`~optw.env.state.graph_mask`)."""
    r, n = mask.shape
    arrival = t.unsqueeze(1) + tb.dist[tb.rr, cur]  # [R, n]
    # the 8 features as exact integers: fixed part + t·coef_t + arrival·coef_a
    feats = tb.fixed + t.view(r, 1, 1) * tb.coef_t + arrival.unsqueeze(2) * tb.coef_a
    dyn = (feats.to(torch.float32) / tb.span).view(r * n, -1)
    adj = mask.unsqueeze(1)
    if model.cfg.graph == "lookahead":
        leave = visit_end(arrival, tb.opening, tb.dur)
        adj = adj & ((leave.unsqueeze(2) + tb.dist) <= tb.latest.unsqueeze(1))
    adj = adj | tb.eye
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
    rr, n = tb.rr, mask.shape[1]
    live = ~done
    arrival = t + tb.dist[rr, cur, choice]
    t = torch.where(live, visit_end(arrival, tb.opening[rr, choice], tb.dur[rr, choice]), t)
    cur = torch.where(live, choice, cur)
    done = done | (choice == n - 1)
    mask = (mask & (tb.col != choice.unsqueeze(1)) & ~done.unsqueeze(1)
            & ((t.unsqueeze(1) + tb.dist[rr, cur]) <= tb.latest))
    return t, cur, done, mask


def _gumbel_choice(logp: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """``"free"`` sampling: ``argmax p / q`` for ``noise`` q ~ Exp(1) (Gumbel-max)."""
    return (logp.detach().exp() / noise).argmax(1)


def _free_step(model: PointerNet, tb: _Tables, cur: torch.Tensor, t: torch.Tensor,
               mask: torch.Tensor, done: torch.Tensor, prev: torch.Tensor,
               lstm_in: torch.Tensor, h: torch.Tensor, c: torch.Tensor, noise: torch.Tensor,
               ) -> tuple[torch.Tensor, ...]:
    """A whole ``"free"`` sampling step (:func:`_policy`, the draw, :func:`_advance`): what
    ``compiled`` rollouts hand to ``torch.compile``. Returns ``enc, h, c`` and
    :func:`_advance`'s values."""
    enc, h, c, _, logp, allowed = _policy(model, tb, cur, t, mask, done, prev, lstm_in, h, c)
    choice = _gumbel_choice(logp, noise)
    return enc, h, c, *_advance(tb, choice, enc, logp, allowed, cur, t, mask, done)


class _Stepper(torch.nn.Module):
    """:func:`_free_step` of ``model`` as a module's forward, for ``functional_call``."""

    def __init__(self, model: PointerNet):
        super().__init__()
        self.model = model

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:  # noqa: D102
        return _free_step(self.model, *args)


def _flat_step(stepper: _Stepper, names: tuple[str, ...], shapes: tuple[torch.Size, ...],
               flat: torch.Tensor, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """:func:`_free_step` with every parameter a view of ``flat`` (the parameters
    concatenated): each step's backward then yields one gradient, ``flat``'s, instead of one per
    parameter (autograd's per-step accumulations, ~35 small additions per step, become one)."""
    views = flat.split([s.numel() for s in shapes])
    params = {f"model.{n}": v.view(s) for n, v, s in zip(names, views, shapes, strict=True)}
    return torch.func.functional_call(stepper, params, args)


@functools.cache
def compiled_step() -> Callable[..., tuple[torch.Tensor, ...]]:
    """:func:`_flat_step` through ``torch.compile`` (made once per process; each new shape,
    i.e. routes × nodes, compiles once more, on first use)."""
    import torch._dynamo

    with warnings.catch_warnings():  # torch 2.13's compiler imports its own deprecated
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.script_method
        import torch._inductor.compile_fx  # noqa: F401
    # one graph per (routes, nodes) shape and per model configuration
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    return torch.compile(_flat_step, dynamic=False, fullgraph=True)


def static_rollout(
    model: PointerNet,
    inst: Instances,
    ids: torch.Tensor,
    greedy: bool = False,
    generator: torch.Generator | None = None,
    sampling: str = "compat",
    steps: int | None = None,
    compiled: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Routes ``[R, n + 1]`` (padded with -1), summed log-probabilities and entropies [R] of one
    route per entry of ``ids``; see the module docstring. (:func:`optw.decode.rollout` wraps
    it with ``mode="static"``.)

    ``steps``: run exactly that many decoding steps (at most n), with no host synchronisation
    at all (``"free"`` sampling or greedy only), and return the routes untrimmed ``[R, n + 1]``;
    a route still unfinished then has no end node (:func:`all_done`). For CUDA-graph capture
    (:mod:`optw.train.graphed`).

    ``compiled`` (``"free"`` sampling only): each decoding step runs as one
    ``torch.compile``-d function (:func:`compiled_step`): fused kernels, the same draws,
    values equal to the eager step's within float rounding only (opt-in)."""
    if sampling not in SAMPLINGS:
        raise ValueError(f"unknown sampling {sampling!r}; expected one of {SAMPLINGS}")
    if steps is not None and sampling != "free" and not greedy:
        raise ValueError("a fixed number of steps needs sampling='free' (or greedy): the "
                         "compat draw synchronises with the host")
    if compiled and (sampling != "free" or greedy):
        raise ValueError("compiled=True compiles the 'free' sampling step: it needs "
                         "sampling='free' and greedy=False")
    dev = inst.device
    r, n = ids.shape[0], inst.n_nodes
    tb = _tables(model, inst, ids)
    step_fn = functools.partial(_free_step, model)
    if compiled:
        named = list(model.named_parameters())
        flat = torch.cat([p.reshape(-1) for _, p in named])
        step_fn = functools.partial(compiled_step(), _Stepper(model),
                                    tuple(name for name, _ in named),
                                    tuple(p.shape for _, p in named), flat)

    cur, t, mask, prev, lstm_in, h, c = _start(model, inst, ids, tb)
    if compiled:  # the strides of every later step's inputs: one compilation, not two
        lstm_in, h, c = lstm_in.contiguous(), h.contiguous(), c.contiguous()
    done = torch.zeros(r, dtype=torch.bool, device=dev)
    routes = torch.full((r, n + 1), -1, dtype=torch.long, device=dev)
    routes[:, 0] = 0
    steps_lp: list[torch.Tensor] = []
    steps_ent: list[torch.Tensor] = []
    for step in range(1, n + 1 if steps is None else min(steps, n) + 1):
        if sampling == "free" and not greedy:
            noise = torch.empty(r, n, device=dev).exponential_(1, generator=generator)
            enc, h, c, *after = step_fn(tb, cur, t, mask, done, prev, lstm_in, h, c, noise)
        else:
            enc, h, c, logits, logp, allowed = _policy(model, tb, cur, t, mask, done, prev,
                                                       lstm_in, h, c)
            with torch.no_grad():
                choice = (logits.argmax(1) if greedy
                          else _compat_choice(logp, mask, done, n - 1, generator))
            after = _advance(tb, choice, enc, logp, allowed, cur, t, mask, done)
        lp, ent, routes[:, step], lstm_in, t, cur, done, mask = after
        steps_lp.append(lp)
        steps_ent.append(ent)
        prev = enc
        if steps is None and (sampling != "free" or greedy or step % SYNC_EVERY == 0) and bool(
                done.all()):
            break
    if steps is not None:
        return routes, torch.stack(steps_lp).sum(0), torch.stack(steps_ent).sum(0)
    lengths = (routes >= 0).sum(1)
    routes = routes[:, : int(lengths.max())]
    return routes, torch.stack(steps_lp).sum(0), torch.stack(steps_ent).sum(0)


def _start(model: PointerNet, inst: Instances, ids: torch.Tensor, tb: _Tables,
           ) -> tuple[torch.Tensor, ...]:
    """Steps 1-2 of the decoding sequence (the start still admissible, then visited): each
    route's node, time and admissible nodes, the first pass's encodings (the next pass's
    recursion input), the LSTM's first input and its initial state."""
    r, n = ids.shape[0], inst.n_nodes
    cur = torch.zeros(r, dtype=torch.long, device=inst.device)
    t = inst.t_start_u.index_select(0, ids)
    mask = (t.unsqueeze(1) + tb.dist[:, 0]) <= tb.latest
    x, bias = _observe(model, tb, cur, t, mask)
    prev = model.encode_dense(x, x, bias)
    lstm_in = prev.view(r, n, -1)[:, 0]
    h, c = model.initial_state(r)
    return cur, t, mask & (tb.col != 0), prev, lstm_in, h, c


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
