"""Batched OPTW environment: pure functions on a :class:`State` of R routes (Kool/RL4CO style).

Each route points at its instance by ``ids`` (an index into the K tourists of an
:class:`~optw.env.instances.Instances`), so beam search and multi-sample rollouts index the shared
instance tensors and never copy them.

Admissibility (the paper's): node j is admissible at time t from the current node iff it is
unvisited, ``a_j + wait_j <= c_j`` and ``a_j + wait_j + d_j + dist(j, end) <= T_end`` with
``a_j = t + dist(current, j)`` and ``wait_j = max(0, o_j - a_j)``. As in the authors'
implementation the mask is carried from step to step (new mask = old mask AND the conditions
now), so admissible sets only shrink; this equals the plain definition whenever the rounded
travel times keep the triangle inequality up to the visit durations, and makes "inadmissible
once, inadmissible for good" a guarantee the model's compaction relies on. The end node stays
admissible until chosen (every move keeps it reachable by ``T_end``).

Decoding sequence (``shared/spec/published-checkpoints.md``): :func:`reset` gives the state with
the start still admissible (used for the first encoder pass); ``step(state, 0)`` then marks the
start visited at the same time; each later ``step`` moves to the chosen node:
``t <- max(t + dist(cur, j), o_j) + d_j``. The route is done once the end node is chosen.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from optw.catalog.region import TIME_UNITS_PER_MINUTE
from optw.env.instances import Instances

GRAPHS = ("lookahead", "complete")


@dataclass(frozen=True, eq=False)
class State:
    """R partial routes. ``time_u`` is the current time in units (hundredths of a minute).

    A decoder that needs only the admissible nodes (the training rollout) may carry states
    with ``visited``, ``done`` and ``route`` left out (None): not-done routes whose visited
    nodes are already out of ``mask``; :func:`step` and :func:`reward` need them."""

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

    @property
    def time(self) -> torch.Tensor:
        """Current time in minutes (float64)."""
        return self.time_u.double() / TIME_UNITS_PER_MINUTE

    def index(self, idx: torch.Tensor) -> State:
        """The sub-batch of routes ``idx`` (an index tensor or a bool mask)."""
        if idx.dtype == torch.bool:
            idx = idx.nonzero().squeeze(1)
        return State(**{f.name: None if getattr(self, f.name) is None
                        else getattr(self, f.name).index_select(0, idx) for f in fields(self)})


def _dist_rows(inst: Instances, ids: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``dist_u[ids, rows]``: [R, n] travel times from node ``rows[r]`` of tourist ``ids[r]``."""
    n = inst.n_nodes
    return inst.dist_u.view(-1, n).index_select(0, ids * n + rows)


def _dist_from(
    inst: Instances, ids: torch.Tensor, current: torch.Tensor, nodes: torch.Tensor | None
) -> torch.Tensor:
    """Travel times from ``current[r]`` to every node ([R, n]) or to ``nodes[R, m]``."""
    if nodes is None:
        return _dist_rows(inst, ids, current)
    n = inst.n_nodes
    return inst.dist_u.view(-1).take(((ids * n + current) * n).unsqueeze(1) + nodes)


def _node_table(inst: Instances, ids: torch.Tensor, nodes: torch.Tensor | None) -> torch.Tensor:
    """[R, m, 4] (opening, closing, duration, latest) of ``nodes`` (all nodes when None)."""
    if nodes is None:
        return inst.node_u.index_select(0, ids)
    n = inst.n_nodes
    flat = (ids * n).unsqueeze(1) + nodes
    return inst.node_u.view(-1, 4).index_select(0, flat.view(-1)).view(*nodes.shape, 4)


# --- the rules, written once: every decoder calls these -------------------------------------
def visit_end(arrival: torch.Tensor, opening: torch.Tensor, duration: torch.Tensor,
              ) -> torch.Tensor:
    """When a visit that arrives at ``arrival`` ends: ``max(arrival, o_j) + d_j`` (time units;
    waiting for the opening, then the visit)."""
    return torch.maximum(arrival, opening) + duration


def still_admissible(mask: torch.Tensor, time_u: torch.Tensor, travel: torch.Tensor,
                     latest: torch.Tensor) -> torch.Tensor:
    """The carried admissible set at time ``time_u`` [R]: ``mask`` [R, m] and arriving in time,
    ``time_u + travel <= latest`` (``travel``, ``latest`` [R, m]: from the current node)."""
    return mask & ((time_u.unsqueeze(1) + travel) <= latest)


def adjacency(columns: torch.Tensor, leave: torch.Tensor | None = None,
              sub: torch.Tensor | None = None, latest: torch.Tensor | None = None,
              ) -> torch.Tensor:
    """The graph Ad over m nodes of R routes, bool [R, m, m]: ``Ad[i, j]`` iff column j is
    admissible (``columns`` [R, m]) and, given the lookahead terms, j can still be started by
    its latest start after a visit of i ending at ``leave[i]``
    (``leave[i] + sub[i, j] <= latest[j]``, ``sub`` the travel times [R, m, m]); ``Ad[i, i]``
    always. Without ``leave``: the complete graph over the admissible nodes."""
    adj = columns.unsqueeze(1)
    if leave is not None:
        adj = adj & ((leave.unsqueeze(2) + sub) <= latest.unsqueeze(1))
    return adj | torch.eye(columns.shape[1], dtype=torch.bool, device=columns.device)


_COEFFICIENTS: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}


def _coefficients(dev: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The dynamic features' coefficients of the time and of the travel time, made once per
    device (a host-to-device copy is not allowed while a CUDA graph is being captured)."""
    key = (dev, dtype)
    if key not in _COEFFICIENTS:
        _COEFFICIENTS[key] = (
            torch.tensor([-1, -1, -1, 1, 1, -1, -1, -1], dtype=dtype, device=dev),
            torch.tensor([0, 0, 0, 0, 1, -1, -1, -1], dtype=dtype, device=dev))
    return _COEFFICIENTS[key]


class Features:
    """The 8 dynamic features of the spec for the tourists of ``inst``, in order ``(o_j - t,
    c_j - t, T_end - t, t - T_start, a_j - T_start, o_j - a_j, c_j - a_j, T_end - a_j) /
    (T_end - T_start)`` with ``a_j = t + travel_j``: ``const[tourist, j] + t·coef_t +
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


def feasible(
    inst: Instances,
    ids: torch.Tensor,
    current: torch.Tensor,
    time_u: torch.Tensor,
    nodes: torch.Tensor | None = None,
) -> torch.Tensor:
    """The paper's two time conditions for moving now to each node (visits not considered).

    Returns a bool [R, n] (or [R, m] for the node subset ``nodes[R, m]``).
    """
    travel = _dist_from(inst, ids, current, nodes)
    return still_admissible(torch.ones_like(travel, dtype=torch.bool), time_u, travel,
                            _node_table(inst, ids, nodes)[..., 3])


def visit(inst: Instances, ids: torch.Tensor, current: torch.Tensor, time_u: torch.Tensor,
          mask: torch.Tensor, action: torch.Tensor, latest: torch.Tensor | None = None,
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`step` for not-done routes carried as ids, node, time and mask only (a
    :class:`State` without ``visited``, ``done`` and ``route``) moving to ``action`` [R], not
    the end: the time after the visit and the new admissible set. The visited node leaves the
    mask, which is all a visit changes (earlier visits left it already). ``latest``:
    ``inst.node_u[..., 3]``, which a caller that visits often may make contiguous once."""
    n = inst.n_nodes
    base = ids * n
    travel = inst.dist_u.view(-1).take((base + current) * n + action)
    node = inst.node_u.view(-1, 4).index_select(0, base + action)  # [R, 4]
    time_u = visit_end(time_u + travel, node[:, 0], node[:, 2])
    latest = inst.node_u[..., 3] if latest is None else latest
    mask = still_admissible(mask, time_u, _dist_rows(inst, ids, action),
                            latest.index_select(0, ids))
    mask.index_put_((torch.arange(action.shape[0], device=action.device), action),
                    mask.new_zeros(()))
    return time_u, mask


def reset(inst: Instances, ids: torch.Tensor | None = None) -> State:
    """Routes at the start node at ``T_start`` (start not yet visited, so still admissible).

    ``ids`` [R] picks the tourist of each route (default: one route per tourist).
    """
    dev = inst.device
    if ids is None:
        ids = torch.arange(inst.n_tourists, device=dev)
    ids = ids.to(device=dev, dtype=torch.long)
    r, n = ids.shape[0], inst.n_nodes
    current = torch.zeros(r, dtype=torch.long, device=dev)
    time_u = inst.t_start_u.index_select(0, ids)
    return State(
        ids=ids,
        current=current,
        time_u=time_u,
        visited=torch.zeros(r, n, dtype=torch.bool, device=dev),
        mask=feasible(inst, ids, current, time_u),
        done=torch.zeros(r, dtype=torch.bool, device=dev),
        route=torch.zeros(r, 0, dtype=torch.long, device=dev),
    )


def step(inst: Instances, state: State, action: torch.Tensor, check: bool = True) -> State:
    """Move every unfinished route to ``action`` [R] (ignored for finished routes).

    With ``check`` an inadmissible action raises ``ValueError`` (a caller bug).
    """
    action = action.to(dtype=torch.long)
    live = ~state.done
    if check:
        ok = state.mask.gather(1, action.unsqueeze(1)).squeeze(1) | state.done
        if not bool(ok.all()):
            bad = int((~ok).nonzero()[0, 0])
            raise ValueError(f"route {bad}: node {int(action[bad])} is not admissible")
    action = torch.where(live, action, state.current)
    ids = state.ids
    n = inst.n_nodes
    travel = _dist_from(inst, ids, state.current, action.unsqueeze(1)).squeeze(1)
    node = inst.node_u.view(-1, 4).index_select(0, ids * n + action)  # [R, 4]
    arrival = state.time_u + travel
    time_u = torch.where(live, visit_end(arrival, node[:, 0], node[:, 2]), state.time_u)
    visited = state.visited.clone()
    visited[torch.arange(action.shape[0], device=action.device), action] |= live
    mask = still_admissible(state.mask & ~visited, time_u, _dist_rows(inst, ids, action),
                            inst.node_u[..., 3].index_select(0, ids))
    done = state.done | (action == n - 1)
    mask = mask & ~done.unsqueeze(1)
    route = torch.cat([state.route, torch.where(live, action, -1).unsqueeze(1)], dim=1)
    return State(ids, action, time_u, visited, mask, done, route)


def lookahead(
    inst: Instances,
    state: State,
    nodes: torch.Tensor | None = None,
    valid: torch.Tensor | None = None,
    graph: str = "lookahead",
) -> torch.Tensor:
    """The graph Ad of the spec: bool [R, n, n] (or [R, m, m] over ``nodes[R, m]``).

    ``Ad[i, j]`` iff j is admissible now and, leaving i at
    ``max(t + dist(cur, i), o_i) + d_i``, j can still be started by its closing time and left
    in time to reach the end by ``T_end``; ``Ad[i, i]`` always. Rows are computed for every i,
    admissible or not. ``graph="complete"`` drops the lookahead test (admissible j only).
    ``valid[R, m]`` marks real entries of a padded ``nodes`` (padding is never a column).
    """
    adm = state.mask if nodes is None else state.mask.gather(1, nodes)
    if valid is not None:
        adm = adm & valid
    return graph_mask(inst, state.ids, state.current, state.time_u, nodes, adm, graph)


def graph_mask(
    inst: Instances,
    ids: torch.Tensor,
    current: torch.Tensor,
    time_u: torch.Tensor,
    nodes: torch.Tensor | None,
    adm: torch.Tensor,
    graph: str = "lookahead",
) -> torch.Tensor:
    """:func:`lookahead` from the raw fields (``ids``, ``current``, ``time_u`` [R]) and the
    admissible columns ``adm[R, m]`` (``nodes=None``: all n nodes)."""
    if graph not in GRAPHS:
        raise ValueError(f"unknown graph {graph!r}; expected one of {GRAPHS}")
    if graph == "complete":
        return adjacency(adm)
    r, n = adm.shape[0], inst.n_nodes
    table = _node_table(inst, ids, nodes)
    arrival = time_u.unsqueeze(1) + _dist_from(inst, ids, current, nodes)
    if nodes is None:
        sub = inst.dist_u.index_select(0, ids)
    else:
        flat = (ids * (n * n)).view(r, 1, 1) + nodes.unsqueeze(2) * n + nodes.unsqueeze(1)
        sub = inst.dist_u.view(-1).take(flat)
    return adjacency(adm, visit_end(arrival, table[..., 0], table[..., 2]), sub, table[..., 3])


def dynamic_features(
    inst: Instances, state: State, nodes: torch.Tensor | None = None
) -> torch.Tensor:
    """The 8 dynamic features of the spec, float32 [R, n, 8] (or [R, m, 8] for ``nodes``), in
    order ``(o_j - t, c_j - t, T_end - t, t - T_start, a_j - T_start, o_j - a_j, c_j - a_j,
    T_end - a_j) / (T_end - T_start)`` with ``a_j = t + dist(current, j)``."""
    return node_features(inst, state.ids, state.current, state.time_u, nodes)


def node_features(
    inst: Instances,
    ids: torch.Tensor,
    current: torch.Tensor,
    time_u: torch.Tensor,
    nodes: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`dynamic_features` from the raw fields (``ids``, ``current``, ``time_u`` [R])."""
    n = inst.n_nodes
    if nodes is None:
        nodes = torch.arange(n, device=ids.device).expand(ids.shape[0], n)
    r, m = nodes.shape
    travel = _dist_from(inst, ids, current, nodes)
    rows = ids.repeat_interleave(m)
    return Features(inst).rows(rows, rows * n + nodes.reshape(-1),
                               time_u.repeat_interleave(m), travel.reshape(-1)).view(r, m, 8)


def reward(inst: Instances, state: State) -> torch.Tensor:
    """Sum of the scores of the visited nodes, float32 [R]."""
    return (inst.scores.index_select(0, state.ids) * state.visited).sum(1)
