"""Demonstrations: routes of given tourists (a teacher's, e.g. ILS) for the policy to imitate,
as the action sequences a teacher-forced rollout follows."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from optw.catalog.region import Region, Tourists
from optw.env.validate import check_route
from optw.errors import UserError


@dataclass(frozen=True)
class Demonstrations:
    """Routes ``routes[i]`` (from 0 to the end ``n - 1``) of ``tourists[i]``, and scores."""

    tourists: Tourists
    routes: list[list[int]]
    scores: np.ndarray

    def __post_init__(self) -> None:
        if not len(self.tourists) == len(self.routes) == len(self.scores):
            raise ValueError(f"{len(self.tourists)} tourists, {len(self.routes)} routes and "
                             f"{len(self.scores)} scores: expected one of each per tourist")

    def __len__(self) -> int:
        return len(self.routes)

    def check(self, region: Region, where: str = "") -> None:
        """A :class:`UserError` naming region and tourist for the first demonstration whose
        scores are not one per node of ``region`` or whose route the route validator refuses
        (a node out of range, repeated, too late; another score); ``where`` ends the message."""
        n, ids = region.n_nodes, self.tourists.tourist_id
        if len(self) and self.tourists.scores.shape[1] != n:
            raise UserError(f"demonstration of {region.id} tourist {int(ids[0])} has "
                            f"{self.tourists.scores.shape[1]} scores, expected one per node "
                            f"({n}){where}")
        for i, (route, tid) in enumerate(zip(self.routes, ids, strict=True)):
            what = f"demonstration of {region.id} tourist {int(tid)}"
            if bad := [int(v) for v in route if not 0 <= v < n]:
                raise UserError(f"{what} visits nodes {bad}, outside the region's 0..{n - 1}"
                                f"{where}")
            try:
                res = check_route(region, route, self.tourists, i,
                                  claimed_score=float(self.scores[i]))
            except UserError as exc:  # a time that is not finite
                raise UserError(f"{what}: {exc}{where}") from None
            if not res.ok:
                raise UserError(f"{what} is not admissible: {'; '.join(res.problems)}{where}")

    def take(self, idx: np.ndarray) -> Demonstrations:
        """The demonstrations ``idx`` (an index array), in that order."""
        return Demonstrations(self.tourists[idx], [self.routes[int(i)] for i in idx],
                              self.scores[idx])


def actions(routes: list[list[int]], n_nodes: list[int], width: int,
            device: torch.device | str = "cpu") -> torch.Tensor:
    """``routes`` as the ``actions`` [R, L] of a teacher-forced rollout over instances of
    ``width`` nodes: each route's end node (``n_nodes[r] - 1`` of its own region) becomes
    ``width - 1``, the end of instances padded to ``width`` nodes
    (:func:`optw.env.instances.stack_instances`); padded with -1."""
    out = torch.full((len(routes), max(len(r) for r in routes)), -1, dtype=torch.long)
    for i, (route, n) in enumerate(zip(routes, n_nodes, strict=True)):
        out[i, : len(route)] = torch.tensor([width - 1 if v == n - 1 else v for v in route])
    return out.to(device)
