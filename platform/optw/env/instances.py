"""Tensor form of a batch of K tourists of one region (the model's instances).

Times are int32 *time units* (hundredths of a minute): every rounded travel time is a whole
number of them, so the admissibility sums and comparisons are exact (arriving exactly at closing
time never flips with float rounding). Static features follow the published weights, not the
paper's prose (docs/model.md's table; ``shared/spec/published-checkpoints.md``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from optw.catalog.region import Region, Tourists, to_time_units

#: Number of static / dynamic node features.
N_STATIC = 7
N_DYNAMIC = 8
#: ``latest`` value of a node that can never be visited (far below any reachable time).
NEVER = -(2**30)


@dataclass(frozen=True, eq=False)
class Instances:
    """K tourists of one region as tensors (node 0 = start, ``n - 1`` = end copy of the start,
    both open from ``t_start`` to ``t_end``, duration and score 0). ``latest[k, j] = min(c_j,
    T_end - d_j - dist(j, end))`` is the latest start of a visit of j (:data:`NEVER` when even
    the opening is too late): j is admissible iff ``arrival <= latest``."""

    region_id: str
    tourist_id: torch.Tensor  # [K] int64
    dist_u: torch.Tensor  # [K, n, n] int32 travel time units (shared block + start/end rows)
    node_u: torch.Tensor  # [K, n, 4] int32: opening, closing, duration, latest (time units)
    t_start_u: torch.Tensor  # [K] int32
    t_end_u: torch.Tensor  # [K] int32
    scores: torch.Tensor  # [K, n] float32
    static: torch.Tensor  # [K, n, 7] float32
    t_max: float
    s_max: float

    @property
    def n_tourists(self) -> int:
        return int(self.dist_u.shape[0])

    @property
    def n_nodes(self) -> int:
        return int(self.dist_u.shape[1])

    @property
    def end(self) -> int:
        """Index of the end node."""
        return self.n_nodes - 1

    @property
    def device(self) -> torch.device:
        return self.dist_u.device


def make_instances(region: Region, tourists: Tourists,
                   device: str | torch.device = "cpu") -> Instances:
    """Build :class:`Instances` for every tourist of ``tourists`` (a batch of one region)."""
    if tourists.region_id != region.id:
        raise ValueError(f"tourists of region {tourists.region_id!r} given for {region.id!r}")
    k, n = len(tourists), region.n_nodes
    if k == 0:
        raise ValueError("no tourists given")
    if tourists.scores.shape != (k, n):
        raise ValueError(f"scores have shape {tourists.scores.shape}, expected {(k, n)}")
    t_start = np.asarray(tourists.t_start, dtype=np.float64)
    t_end = np.asarray(tourists.t_end, dtype=np.float64)
    if np.any(t_end <= t_start):
        bad = int(np.flatnonzero(t_end <= t_start)[0])
        raise ValueError(f"tourist {int(tourists.tourist_id[bad])}: t_end {t_end[bad]:g} is not "
                         f"after t_start {t_start[bad]:g}")
    coords = region.coordinates(tourists.start_xy)  # [K, n, 2]
    dist = tourists.distances(region)  # [K, n, n] rounded minutes
    opening, closing, duration = (np.broadcast_to(v, (k, n)).copy()
                                  for v in (region.opening, region.closing, region.duration))
    scores = np.asarray(tourists.scores, dtype=np.float64).copy()
    for table, ends in ((opening, t_start), (closing, t_end), (duration, 0.0), (scores, 0.0)):
        table[:, 0] = table[:, -1] = ends

    dist_u, open_u, close_u, dur_u = map(to_time_units, (dist, opening, closing, duration))
    ts_u, te_u = to_time_units(t_start), to_time_units(t_end)
    latest = np.minimum(close_u, te_u[:, None] - dur_u - dist_u[:, :, -1])
    latest = np.where(open_u <= latest, latest, NEVER)

    t_max, s_max = region.t_max, region.s_max
    max_dur = region.max_duration or 1.0
    static = np.stack([coords[..., 0] / 100.0, coords[..., 1] / 100.0, duration / max_dur,
                       opening / t_max, closing / t_max, scores / s_max,
                       np.broadcast_to(t_end[:, None] / t_max, (k, n))], axis=-1)

    def i32(a: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(a.astype(np.int32), device=device)

    return Instances(
        region_id=region.id, tourist_id=torch.tensor(np.array(tourists.tourist_id, dtype=np.int64)),
        dist_u=i32(dist_u), node_u=i32(np.stack([open_u, close_u, dur_u, latest], axis=-1)),
        t_start_u=i32(ts_u), t_end_u=i32(te_u),
        scores=torch.as_tensor(scores, dtype=torch.float32, device=device),
        static=torch.as_tensor(static, dtype=torch.float32, device=device), t_max=t_max,
        s_max=s_max)


def _pad_nodes(t: torch.Tensor, n: int, dims: tuple[int, ...]) -> torch.Tensor:
    """``t`` with its node dimensions ``dims`` grown to ``n``: zero padding nodes go just before
    the end node (which stays last)."""
    m = t.shape[dims[0]]
    if m == n:
        return t
    idx = torch.cat([torch.arange(m - 1), torch.tensor([n - 1])]).to(t.device)
    for d in dims:
        shape = list(t.shape)
        shape[d] = n
        t = torch.zeros(shape, dtype=t.dtype, device=t.device).index_copy_(d, idx, t)
    return t


def stack_instances(parts: list[Instances]) -> Instances:
    """One :class:`Instances` holding the tourists of ``parts`` (of one or several regions) in
    order, padded to the largest node count. Padding nodes sit just before each part's end node
    and can never be visited (``latest`` is :data:`NEVER`, score 0), so the compacted decoder
    never computes with them: a padded tourist gets the same rollouts as alone.
    ``t_max``/``s_max`` are the first part's (static features are already scaled per region).
    """
    if not parts:
        raise ValueError("no instances to stack")
    if len(parts) == 1:
        return parts[0]
    n = max(p.n_nodes for p in parts)
    padded = []
    for p in parts:
        node_u = _pad_nodes(p.node_u, n, (1,))
        node_u[:, p.n_nodes - 1:n - 1, 3] = NEVER  # padding: never admissible
        padded.append(dict(
            tourist_id=p.tourist_id, dist_u=_pad_nodes(p.dist_u, n, (1, 2)), node_u=node_u,
            t_start_u=p.t_start_u, t_end_u=p.t_end_u, scores=_pad_nodes(p.scores, n, (1,)),
            static=_pad_nodes(p.static, n, (1,))))
    return Instances(region_id="+".join(dict.fromkeys(p.region_id for p in parts)),
                     **{k: torch.cat([d[k] for d in padded]) for k in padded[0]},
                     t_max=parts[0].t_max, s_max=parts[0].s_max)
