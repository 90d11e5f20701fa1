"""Beam search with static shapes, and as replayed CUDA graphs (opt-in; for GPUs).

The compacted beam search (:mod:`optw.decode.beam`) is the fastest on a CPU, where arithmetic
is the cost: its beams carry only their admissible nodes. On a GPU its data-dependent shapes
and per-step host synchronisation make it bound by launching kernels (issue 24: beam 128 on
t101 took 116 ms on an H200, mostly launches). Here every tourist keeps ``width`` beam slots
of all n nodes at every step, as the static training rollout does (:mod:`optw.decode.static`):

- a slot is live, or dead (not born yet, finished, or not kept): a dead slot's summed
  log-probability is ``-inf``, so it offers no candidate, and only the end is allowed to it
  (its pass is computed and ignored);
- one step: the network pass of every slot, candidates ``sum + log p`` as a ``[K, width·n]``
  table in the authors' (beam, node) order, one ``topk``; the kept pairs' parents' states are
  gathered, a kept pair that takes the end is a finished route, and each tourist's best
  finished route (highest score, the earliest and best-ranked among equal scores) is updated
  on the device;
- no host synchronisation inside a step; a check whether any slot is live every
  :data:`~optw.decode.static.SYNC_EVERY` steps.

Same ranking as the compacted search; its values agree within float rounding only (other
matrix shapes), so a near-tie may rank otherwise: opt-in (``mode="static"``). ``mode="graph"``
(CUDA) captures :data:`~optw.decode.static.SYNC_EVERY` steps as one CUDA graph per (model,
node count, tourists, width) the first time and replays it: one launch per chunk of steps.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import NamedTuple

import torch

from optw.decode.static import SYNC_EVERY, _move, _policy, _start, _Tables, _tables
from optw.env.instances import Instances
from optw.model.network import PointerNet

#: Beam-search modes: the compacted search (the default, exact), static shapes, and static
#: shapes replayed as CUDA graphs (CUDA only).
BEAM_MODES = ("compact", "static", "graph")


def beam_search_mode(device: torch.device | str, choice: str = "auto") -> str:
    """The beam-search mode on ``device``: ``choice`` unless it is ``"auto"``, then the
    environment variable ``OPTW_BEAM`` if set, else ``"compact"``; ``"graph"`` needs CUDA."""
    where = "beam mode"
    if choice == "auto":
        where, choice = "OPTW_BEAM", os.environ.get("OPTW_BEAM", "").strip() or "compact"
    if choice not in BEAM_MODES:
        raise ValueError(f"{where}={choice!r}; expected one of {BEAM_MODES}")
    if choice == "graph" and torch.device(device).type != "cuda":
        raise ValueError(f"{where}=graph replays CUDA graphs: it needs a CUDA device, not "
                         f"{torch.device(device)}")
    return choice


class _Beams(NamedTuple):
    """The search between two steps: per slot [R = K·width] and per tourist [K]."""

    cur: torch.Tensor  # node [R]
    t: torch.Tensor  # time [R]
    mask: torch.Tensor  # admissible nodes [R, n]
    done: torch.Tensor  # dead slot [R]
    prev: torch.Tensor  # the last pass's encodings [R·n, d] (recursion)
    lstm_in: torch.Tensor  # [R, d]
    h: torch.Tensor
    c: torch.Tensor
    sum_lp: torch.Tensor  # summed log-probability, -inf when dead [R]
    score: torch.Tensor  # the partial route's score (float64) [R]
    routes: torch.Tensor  # the partial routes [R, n + 1], -1 after their last node
    step: torch.Tensor  # steps taken (0-d)
    best_score: torch.Tensor  # per tourist: the best finished route's score [K] (float64)
    best_lp: torch.Tensor  # its summed log-probability [K]
    best_route: torch.Tensor  # [K, n + 1]
    finished: torch.Tensor  # routes finished [K]


def _begin(model: PointerNet, inst: Instances, width: int,
           ) -> tuple[_Tables, torch.Tensor, _Beams]:
    """The tables, each slot's tourist's scores [R, n] (float64) and the first state: slot 0
    of each tourist live at its start, the others dead."""
    dev, k, n = inst.device, inst.n_tourists, inst.n_nodes
    ids = torch.arange(k, device=dev).repeat_interleave(width)
    tb = _tables(model, inst, ids)
    cur, t, mask, prev, lstm_in, h, c = _start(model, inst, ids, tb)
    first = tb.rr % width == 0
    r = ids.shape[0]
    routes = torch.full((r, n + 1), -1, dtype=torch.long, device=dev)
    routes[:, 0] = 0
    scores = inst.scores.double().repeat_interleave(width, dim=0)
    return tb, scores, _Beams(
        cur=cur, t=t, mask=mask & first.unsqueeze(1), done=~first, prev=prev,
        lstm_in=lstm_in.contiguous(), h=h.contiguous(), c=c.contiguous(),
        sum_lp=torch.where(first, 0.0, float("-inf")),
        score=scores[:, 0],
        routes=routes, step=torch.zeros((), dtype=torch.long, device=dev),
        best_score=torch.full((k,), float("-inf"), dtype=torch.float64, device=dev),
        best_lp=torch.zeros(k, device=dev),
        best_route=torch.full((k, n + 1), -1, dtype=torch.long, device=dev),
        finished=torch.zeros(k, dtype=torch.long, device=dev))


def _beam_step(model: PointerNet, tb: _Tables, scores: torch.Tensor, width: int,
               b: _Beams) -> _Beams:
    """One step of every tourist's search (``scores`` [R, n] float64: each slot's tourist's)."""
    r, n = b.mask.shape
    k = r // width
    enc, h, c, _, logp, _ = _policy(model, tb, b.cur, b.t, b.mask, b.done, b.prev,
                                    b.lstm_in, b.h, b.c)
    # every (slot, node) pair of a tourist in one row, in (beam, node) order
    vals, idx = (b.sum_lp.unsqueeze(1) + logp).view(k, width * n).topk(width, dim=1)
    first = tb.rr.view(k, width)[:, :1]  # each tourist's first slot
    parent = (first + torch.div(idx, n, rounding_mode="floor")).view(r)
    choice = (idx % n).view(r)
    vals = vals.view(r)
    kept = torch.isfinite(vals)
    step = b.step + 1
    # (a replayed chunk may run past step n once every slot is dead: its writes go nowhere)
    column = step.clamp(max=n).expand(r, 1)
    routes = b.routes.index_select(0, parent).scatter_(1, column, choice.unsqueeze(1))
    score = b.score.index_select(0, parent) + scores.gather(1, choice.unsqueeze(1)).squeeze(1)
    ended = kept & (choice == n - 1)

    # each tourist's best finished route: the first of the step's best (rank order), if better
    top, arg = torch.where(ended, score, float("-inf")).view(k, width).max(1)
    better = top > b.best_score
    row = first.squeeze(1) + arg
    best_route = torch.where(better.unsqueeze(1), routes.index_select(0, row), b.best_route)
    best_lp = torch.where(better, vals.index_select(0, row), b.best_lp)

    t, cur, done, mask = _move(tb, choice, b.cur.index_select(0, parent),
                               b.t.index_select(0, parent), b.mask.index_select(0, parent),
                               b.done.index_select(0, parent))
    done = done | ~kept
    return _Beams(
        cur=cur, t=t, mask=mask & ~done.unsqueeze(1), done=done,
        prev=enc.view(r, n, -1).index_select(0, parent).view(r * n, -1),
        lstm_in=enc.index_select(0, parent * n + choice),
        h=h.index_select(0, parent), c=c.index_select(0, parent),
        sum_lp=torch.where(done, float("-inf"), vals), score=score, routes=routes, step=step,
        best_score=torch.where(better, top, b.best_score), best_lp=best_lp,
        best_route=best_route, finished=b.finished + ended.view(k, width).sum(1))


def _steps(model: PointerNet, tb: _Tables, scores: torch.Tensor, width: int, b: _Beams,
           count: int) -> _Beams:
    for _ in range(count):
        b = _beam_step(model, tb, scores, width, b)
    return b


class _Graph(NamedTuple):
    """A captured chunk of steps (its replay) and the buffers it reads and writes in place."""

    replay: Callable[[], None]
    tables: _Tables
    scores: torch.Tensor
    beams: _Beams


#: Captured chunks per model (dropped with the model), by (nodes, tourists, width).
_GRAPHS: weakref.WeakKeyDictionary[PointerNet, dict[tuple[int, int, int], _Graph]] = (
    weakref.WeakKeyDictionary())


def _load(dst: tuple[torch.Tensor, ...], src: tuple[torch.Tensor, ...]) -> None:
    for a, v in zip(dst, src, strict=True):
        a.copy_(v)


def _capture(device: torch.device, fn: Callable[[], None]) -> Callable[[], None]:
    """Run ``fn`` once eagerly on a side stream (as CUDA graph capture asks), capture it as a
    CUDA graph, and return the graph's replay."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def _graphed(model: PointerNet, inst: Instances, width: int, tb: _Tables,
             scores: torch.Tensor, b: _Beams) -> _Beams:
    """Run the search from ``b`` by replaying a captured chunk of :data:`SYNC_EVERY` steps
    that updates its buffers in place (captured on first use for this model and shape, after
    running the first chunk eagerly)."""
    n = inst.n_nodes
    key = (n, inst.n_tourists, width)
    graphs = _GRAPHS.setdefault(model, {})
    g = graphs.get(key)
    if g is None:
        tables, buf_scores = _Tables(*(x.clone() for x in tb)), scores.clone()
        beams = _Beams(*(x.clone() for x in b))

        def chunk() -> None:
            _load(beams, _steps(model, tables, buf_scores, width, beams, SYNC_EVERY))

        g = graphs[key] = _Graph(_capture(inst.device, chunk), tables, buf_scores, beams)
        done = SYNC_EVERY  # the capture ran the first chunk
    else:
        _load(g.tables, tb)
        g.scores.copy_(scores)
        _load(g.beams, b)
        done = 0
    while done < n and not bool(g.beams.done.all()):
        g.replay()
        done += SYNC_EVERY
    return _Beams(*(x.clone() for x in g.beams))


def static_beam_search(model: PointerNet, inst: Instances, width: int, graph: bool = False,
                       ) -> tuple[list[list[int]], list[float], list[float], list[int]]:
    """Beam search of ``width`` slots for every tourist of ``inst`` with static shapes (see the
    module docstring; ``graph``: replayed as CUDA graphs): per tourist the best finished route,
    its score and summed log-probability, and how many routes finished. Call it without
    gradients."""
    n = inst.n_nodes
    tb, scores, b = _begin(model, inst, width)
    if graph:
        b = _graphed(model, inst, width, tb, scores, b)
    else:
        for step in range(1, n + 1):
            b = _beam_step(model, tb, scores, width, b)
            if step % SYNC_EVERY == 0 and bool(b.done.all()):
                break
    if not bool(torch.isfinite(b.best_score).all()):  # cannot happen: every search finishes
        raise RuntimeError("beam search finished no route for some tourist")
    routes = [[v for v in row if v >= 0] for row in b.best_route.tolist()]
    return routes, b.best_score.tolist(), b.best_lp.tolist(), b.finished.tolist()
