"""Batched OPTW environment: pure functions on a :class:`State` of R routes, each pointing at
its tourist by ``ids`` (an index into the shared :class:`~optw.env.instances.Instances` tensors,
never copied); the rules every decoder calls are written here once (docs/model.md).

The admissible mask is carried as in the authors' code (new mask = old AND the conditions now):
"inadmissible once, inadmissible for good", which the decoder's compaction relies on; the end
stays admissible until chosen. Decoding sequence (``shared/spec/published-checkpoints.md``):
:func:`reset` (start still admissible), ``step(state, 0)`` (start visited, same time), then each
``step`` moves to the chosen node: ``t <- max(t + dist(cur, j), o_j) + d_j``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields

import torch

from optw.env.instances import Instances

GRAPHS = ("lookahead", "complete")


@dataclass(frozen=True, eq=False)
class State:
    """R partial routes; ``time_u`` in time units. The training rollout carries not-done routes
    without ``visited``, ``done`` and ``route`` (None; visited nodes are out of ``mask``), which
    :func:`step` and :func:`reward` need."""

    ids: torch.Tensor  # [R] int64 tourist index into the Instances
    current: torch.Tensor  # [R] int64 current node
    time_u: torch.Tensor  # [R] int32
    visited: torch.Tensor | None  # [R, n] bool
    mask: torch.Tensor  # [R, n] bool admissible next nodes
    done: torch.Tensor | None  # [R] bool (end node chosen)
    route: torch.Tensor | None  # [R, L] int64 chosen nodes so far (start first); -1 after done

    @property
    def n_routes(self) -> int:
        return int(self.ids.shape[0])

    def index(self, idx: torch.Tensor) -> State:
        """The sub-batch of routes ``idx`` (an index tensor)."""
        return State(**{f.name: None if getattr(self, f.name) is None
                        else getattr(self, f.name).index_select(0, idx) for f in fields(self)})


def _dist_rows(inst: Instances, ids: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``dist_u[ids, rows]``: [R, n] travel times from node ``rows[r]`` of tourist ``ids[r]``."""
    n = inst.n_nodes
    return inst.dist_u.view(-1, n).index_select(0, ids * n + rows)


# --- the rules, written once: every decoder calls these -------------------------------------
def visit_end(arrival: torch.Tensor, opening: torch.Tensor, duration: torch.Tensor,
              ) -> torch.Tensor:
    """When a visit arriving at ``arrival`` ends: ``max(arrival, o_j) + d_j`` (time units)."""
    return torch.maximum(arrival, opening) + duration


def still_admissible(mask: torch.Tensor, time_u: torch.Tensor, travel: torch.Tensor,
                     latest: torch.Tensor) -> torch.Tensor:
    """The carried admissible set at time ``time_u`` [R]: ``mask`` [R, m] and arriving in time,
    ``time_u + travel <= latest`` (``travel``, ``latest`` [R, m]: from the current node)."""
    return mask & ((time_u.unsqueeze(1) + travel) <= latest)


def adjacency(columns: torch.Tensor, leave: torch.Tensor | None = None,
              sub: torch.Tensor | None = None, latest: torch.Tensor | None = None,
              ) -> torch.Tensor:
    """The graph Ad over m nodes of R routes, bool [R, m, m]: ``Ad[i, j]`` iff j is admissible
    (``columns`` [R, m]) and, with ``leave``, ``leave[i] + sub[i, j] <= latest[j]`` (``sub``: the
    travel times [R, m, m]); ``Ad[i, i]`` always. Without ``leave``: the complete graph."""
    adj = columns.unsqueeze(1)
    if leave is not None:
        adj = adj & ((leave.unsqueeze(2) + sub) <= latest.unsqueeze(1))
    return adj | torch.eye(columns.shape[1], dtype=torch.bool, device=columns.device)


@functools.cache
def _coefficients(dev: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The dynamic features' coefficients of the time and the travel time, made once per device
    (no host-to-device copy while a CUDA graph is captured)."""
    return (torch.tensor([-1, -1, -1, 1, 1, -1, -1, -1], dtype=dtype, device=dev),
            torch.tensor([0, 0, 0, 0, 1, -1, -1, -1], dtype=dtype, device=dev))


class Features:
    """The 8 dynamic features of the spec (docs/model.md): ``const[tourist, j] + t·coef_t +
    travel·coef_d`` in exact integer time units, then one float32 division."""

    def __init__(self, inst: Instances):
        k, n = inst.n_tourists, inst.n_nodes
        ts = inst.t_start_u.view(k, 1).expand(k, n)
        te = inst.t_end_u.view(k, 1).expand(k, n)
        o, c = inst.node_u[..., 0], inst.node_u[..., 1]
        #: [K, n, 8] the part that depends on the node only
        self.const = torch.stack([o, c, te, -ts, -ts, o, c, te], -1)
        self.span = (inst.t_end_u - inst.t_start_u).to(torch.float32)  # [K]
        self.coef_t, self.coef_d = _coefficients(inst.device, self.const.dtype)

    def rows(self, ids: torch.Tensor, flat: torch.Tensor, time_u: torch.Tensor,
             travel: torch.Tensor) -> torch.Tensor:
        """Features of packed rows [N, 8]: row i is node ``flat[i] % n`` of tourist ``ids[i]``
        (``flat = ids·n + node``) at time ``time_u[i]``, ``travel[i]`` away."""
        feats = torch.addr(torch.addr(self.const.view(-1, 8).index_select(0, flat), time_u,
                                      self.coef_t), travel, self.coef_d)
        return feats.to(torch.float32) / self.span.index_select(0, ids).unsqueeze(1)

    def tables(self, const: torch.Tensor, span: torch.Tensor, time_u: torch.Tensor,
               travel: torch.Tensor) -> torch.Tensor:
        """Features of R whole routes [R, n, 8] from ``const[ids]`` [R, n, 8] and ``span[ids]``
        [R] (gathered once per rollout), times [R] and travel times [R, n]."""
        feats = (const + time_u.view(-1, 1, 1) * self.coef_t
                 + travel.unsqueeze(2) * self.coef_d)
        return feats.to(torch.float32) / span.view(-1, 1, 1)


def visit(inst: Instances, ids: torch.Tensor, current: torch.Tensor, time_u: torch.Tensor,
          mask: torch.Tensor, action: torch.Tensor, latest: torch.Tensor,
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`step` for not-done routes carried as ids, node, time and mask only, moving to
    ``action`` [R] (not the end): the new time and admissible set (earlier visits are out of the
    mask already). ``latest``: ``inst.node_u[..., 3]``, made contiguous once by a caller."""
    n = inst.n_nodes
    base = ids * n
    travel = inst.dist_u.view(-1).take((base + current) * n + action)
    node = inst.node_u.view(-1, 4).index_select(0, base + action)  # [R, 4]
    time_u = visit_end(time_u + travel, node[:, 0], node[:, 2])
    mask = still_admissible(mask, time_u, _dist_rows(inst, ids, action),
                            latest.index_select(0, ids))
    mask.index_put_((torch.arange(action.shape[0], device=action.device), action),
                    mask.new_zeros(()))
    return time_u, mask


def reset(inst: Instances, ids: torch.Tensor | None = None) -> State:
    """Routes at the start node at ``T_start``, the start still admissible; ``ids`` [R]: the
    tourist of each route (default: one route per tourist)."""
    dev = inst.device
    if ids is None:
        ids = torch.arange(inst.n_tourists, device=dev)
    ids = ids.to(device=dev, dtype=torch.long)
    r, n = ids.shape[0], inst.n_nodes
    current = torch.zeros(r, dtype=torch.long, device=dev)
    time_u = inst.t_start_u.index_select(0, ids)
    travel = _dist_rows(inst, ids, current)
    mask = still_admissible(torch.ones_like(travel, dtype=torch.bool), time_u, travel,
                            inst.node_u[..., 3].index_select(0, ids))
    return State(ids, current, time_u, torch.zeros(r, n, dtype=torch.bool, device=dev), mask,
                 torch.zeros(r, dtype=torch.bool, device=dev),
                 torch.zeros(r, 0, dtype=torch.long, device=dev))


def step(inst: Instances, state: State, action: torch.Tensor, check: bool = True) -> State:
    """Move every unfinished route to ``action`` [R]; ``check``: refuse inadmissible ones."""
    action = action.to(dtype=torch.long)
    live = ~state.done
    if check:
        ok = state.mask.gather(1, action.unsqueeze(1)).squeeze(1) | state.done
        if not bool(ok.all()):
            bad = int((~ok).nonzero()[0, 0])
            raise ValueError(f"route {bad}: node {int(action[bad])} is not admissible")
    action = torch.where(live, action, state.current)
    time_u, mask = visit(inst, state.ids, state.current, state.time_u, state.mask, action,
                         inst.node_u[..., 3])  # the carried mask holds no visited node
    time_u = torch.where(live, time_u, state.time_u)
    visited = state.visited.clone()
    visited[torch.arange(action.shape[0], device=action.device), action] |= live
    done = state.done | (action == inst.n_nodes - 1)
    route = torch.cat([state.route, torch.where(live, action, -1).unsqueeze(1)], dim=1)
    return State(state.ids, action, time_u, visited, mask & ~done.unsqueeze(1), done, route)


def lookahead(inst: Instances, state: State) -> torch.Tensor:
    """The graph Ad of the spec (docs/model.md, :func:`adjacency`), bool [R, n, n], with rows
    for every i, admissible or not."""
    table = inst.node_u.index_select(0, state.ids)
    arrival = state.time_u.unsqueeze(1) + _dist_rows(inst, state.ids, state.current)
    return adjacency(state.mask, visit_end(arrival, table[..., 0], table[..., 2]),
                     inst.dist_u.index_select(0, state.ids), table[..., 3])


def dynamic_features(inst: Instances, state: State) -> torch.Tensor:
    """The 8 dynamic features of the spec (:class:`Features`), float32 [R, n, 8]."""
    feat = Features(inst)
    return feat.tables(feat.const.index_select(0, state.ids), feat.span.index_select(0, state.ids),
                       state.time_u, _dist_rows(inst, state.ids, state.current))


def reward(inst: Instances, state: State) -> torch.Tensor:
    """Sum of the scores of the visited nodes, float32 [R]."""
    return (inst.scores.index_select(0, state.ids) * state.visited).sum(1)
