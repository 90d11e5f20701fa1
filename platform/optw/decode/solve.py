"""The one entry point for inference: :func:`solve` returns one :class:`Solution` per tourist,
each route checked by the independent validator (:func:`optw.env.check_route`; an invalid route
is a bug and raises)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from optw.catalog.region import Region, Tourists
from optw.decode.active_search import active_search
from optw.decode.beam import beam_search, best_routes
from optw.decode.core import greedy_routes, rollout
from optw.decode.limits import (
    ACTIVE_SEARCH_BATCH,
    ACTIVE_SEARCH_EPOCHS,
    ACTIVE_SEARCH_LR,
    PAPER_BEAMS,
    SAMPLES,
)
from optw.env.instances import make_instances
from optw.env.validate import check_route
from optw.errors import UserError
from optw.model.network import PointerNet

METHODS = ("greedy", "sampling", "beam", "active_search")


@dataclass
class Solution:
    """A route for one tourist: ``tourist`` the batch's ``tourist_id`` or a caller's id (e.g.
    ``"alice"``); ``route`` from 0 to ``n-1``; ``arrival``/``start``: per route position
    (minutes); ``seconds``: the call's wall time per tourist (active search: its own)."""

    region: str
    tourist: int | str
    method: str
    route: list[int]
    score: float
    arrival: list[float] = field(default_factory=list)
    start: list[float] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return {"region": self.region, "tourist": self.tourist, "method": self.method,
                "route": self.route, "score": self.score, "seconds": self.seconds}


def region_mismatch(model: PointerNet, region: Region) -> str | None:
    """A one-line warning if ``model`` was trained on other regions than ``region``, else None."""
    trained = model.trained_on
    if not trained or region.id in trained:
        return None
    shown = ", ".join(trained[:3]) + (f" and {len(trained) - 3} more" if len(trained) > 3 else "")
    return (f"the model was trained on {shown}, not on {region.id} ({region.group}): "
            "its routes there may be poor")


def search_progress(bar: Any, tourist_ids: Sequence[Any], **shown: Any,
                    ) -> Callable[[int, float], None]:
    """A ``progress`` for :func:`solve`'s active search: each call moves the tqdm ``bar`` one
    epoch on and shows ``shown``, the tourist and its best sampled score so far."""
    best: dict[int, float] = {}

    def progress(k: int, reward: float) -> None:
        best[k] = max(best.get(k, float("-inf")), reward)
        bar.set_postfix(**shown, tourist=tourist_ids[k], best=f"{best[k]:g}", refresh=False)
        bar.update(1)

    return progress


def solve(model: PointerNet, region: Region, tourists: Tourists, method: str = "beam",
          beams: int = PAPER_BEAMS, samples: int = SAMPLES, keep_greedy: bool = True,
          epochs: int = ACTIVE_SEARCH_EPOCHS, batch_size: int = ACTIVE_SEARCH_BATCH,
          lr: float = ACTIVE_SEARCH_LR, seed: int | None = 0,
          device: str | torch.device | None = None,
          progress: Callable[[int, float], None] | None = None,
          greedy: list[Solution] | None = None) -> list[Solution]:
    """Solve every tourist of ``tourists`` (one region) with ``method``: ``greedy``;
    ``sampling`` (the best of ``samples`` routes); ``beam`` (width ``beams``, checked at the edge
    by :func:`~optw.decode.limits.check_beams`); ``active_search`` (``epochs`` of REINFORCE on a
    copy of the model, ``batch_size`` routes, Adam ``lr``, then beam search). ``keep_greedy`` and
    ``greedy`` (the caller's greedy solutions, reused): docs/model.md. ``seed``: of sampling and
    active search (None: unseeded). ``progress(k, reward)``: after every active-search epoch of
    tourist ``k``, its best sampled reward.
    """
    if method not in METHODS:
        raise UserError(f"unknown method {method!r}; expected one of {', '.join(METHODS)}")
    if method in ("sampling", "active_search") and (
            isinstance(samples, bool) or not isinstance(samples, int) or samples < 1):
        raise UserError(f"samples must be a positive integer, got {samples!r}")
    if len(tourists) == 0:
        return []
    if greedy is not None and [g.tourist for g in greedy] != [
            int(t) for t in tourists.tourist_id]:
        raise ValueError("greedy: one greedy solution per tourist of the batch, in its order")
    if device is None:
        device = next(model.parameters()).device
    model = model.to(device)
    was_training = model.training
    model.eval()
    try:
        inst = make_instances(region, tourists, device)
        gen = torch.Generator(device=device)
        if seed is not None:
            gen.manual_seed(seed)
        else:
            gen.seed()
        per_tourist: list[float] | None = None
        t0 = time.perf_counter()
        if method == "greedy":
            routes = greedy_routes(model, inst)
        elif method == "sampling":
            ids = torch.arange(inst.n_tourists, device=device).repeat_interleave(samples)
            with torch.inference_mode():
                out = rollout(model, inst, ids, generator=gen)
            routes = best_routes(inst, [(ids, out.routes, out.log_prob)]).routes
        elif method == "beam":
            routes = beam_search(model, inst, beams).routes
        else:
            routes, per_tourist = [], []
            for k in range(len(tourists)):
                tk = time.perf_counter()
                sub = make_instances(region, tourists[k], device)
                routes.append(active_search(
                    model, sub, epochs=epochs, batch_size=batch_size, lr=lr, beams=beams,
                    generator=gen, keep_greedy=keep_greedy,
                    progress=None if progress is None else functools.partial(progress, k)))
                per_tourist.append(time.perf_counter() - tk)
        reused = 0.0
        if keep_greedy and method in ("sampling", "beam"):
            scores = inst.scores.double()
            if greedy is None:
                kept = greedy_routes(model, inst)
            else:
                kept, reused = [g.route for g in greedy], sum(g.seconds for g in greedy)
            routes = [g if float(scores[k][g].sum()) > float(scores[k][r].sum()) else r
                      for k, (r, g) in enumerate(zip(routes, kept, strict=True))]
        elapsed = time.perf_counter() - t0 + reused
    finally:
        model.train(was_training)
    solutions = []
    for k, route in enumerate(routes):
        check = check_route(region, route, tourists, k)
        tourist = int(tourists.tourist_id[k])
        check.raise_if_invalid(f"internal error: the {method} route for tourist {tourist} of "
                               f"{region.id}")
        solutions.append(Solution(
            region.id, tourist, method, route, check.score, check.arrival, check.start,
            per_tourist[k] if per_tourist is not None else elapsed / len(tourists)))
    return solutions
