"""How a trained model is evaluated (:func:`evaluate_model`) against ILS; no Ray or MLflow."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from optw.catalog import TOURIST_SETS
from optw.catalog.generator import VALIDATION_SIZE
from optw.checks import integer, require
from optw.decode.limits import MAX_BEAMS, MIN_BEAMS, PAPER_BEAMS
from optw.evaluate.stats import gap


@dataclass
class EvaluateSettings:
    """What a trained model is evaluated on (a profile's ``[evaluate]`` table)."""

    beams: int = PAPER_BEAMS
    active_search: int = 0  # active-search epochs (0: off)
    validation_tourists: int = VALIDATION_SIZE
    keep_greedy: bool = True  # beam search and the sweep keep the greedy routes
    #: beam widths timed on each benchmark tourist (the paper's score/time figure)
    beam_sweep: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128])
    #: solve tourists one at a time (each row's own ``seconds``), else a batch per region
    one_by_one: bool = False
    #: the generated tourists evaluated: ``validation`` (ours) or ``paper`` (``--paper-sets``)
    tourists: str = "validation"

    def __post_init__(self) -> None:
        def width(w: Any) -> bool:
            return integer(w) and MIN_BEAMS <= w <= MAX_BEAMS

        widths = f"{MIN_BEAMS}..{MAX_BEAMS}"
        require(isinstance(self.beam_sweep, list) and all(map(width, self.beam_sweep)),
                "evaluate.beam_sweep", self.beam_sweep, f"a list of widths in {widths}")
        require(width(self.beams), "evaluate.beams", self.beams, f"must be an integer in {widths}")
        require(integer(self.active_search) and self.active_search >= 0,
                "evaluate.active_search", self.active_search, "must be an integer >= 0")
        require(integer(self.validation_tourists)
                and 0 <= self.validation_tourists <= VALIDATION_SIZE,
                "evaluate.validation_tourists", self.validation_tourists,
                f"must be an integer in 0..{VALIDATION_SIZE}")
        for name in ("keep_greedy", "one_by_one"):
            value = getattr(self, name)
            require(type(value) is bool, f"evaluate.{name}", value, "must be true or false")
        require(isinstance(self.tourists, str) and self.tourists in TOURIST_SETS,
                "evaluate.tourists", self.tourists,
                f"expected one of {', '.join(map(repr, TOURIST_SETS))}")


def evaluate_model(checkpoint: str, regions: list[str], method: str,
                   settings: EvaluateSettings, catalog_dir: str,
                   progress: bool | None = None,
                   ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Rows per (region, tourist, method) of greedy, beam search and active search (if asked)
    and per (region, beams) of the benchmark tourist's beam sweep."""
    import torch
    from tqdm import tqdm

    from optw.catalog import open_catalog
    from optw.model import load_model

    torch.set_num_threads(1)
    model = load_model(checkpoint)
    catalog = open_catalog(catalog_dir)
    rows: list[dict[str, Any]] = []
    sweep: list[dict[str, Any]] = []
    epochs = 0  # of active search over all tourists: the bar's total
    if settings.active_search:
        epochs = settings.active_search * sum(
            1 + min(settings.validation_tourists, len(catalog.tourists(rid, settings.tourists)))
            for rid in regions)
    show = sys.stderr.isatty() if progress is None else progress
    with tqdm(total=epochs, desc="active search", unit="epoch", file=sys.stderr,
              dynamic_ncols=True, disable=not (show and epochs)) as bar:
        for rid in regions:
            _evaluate_region(model, catalog, rid, method, settings, rows, sweep, bar)
    return rows, sweep


def _evaluate_region(model: Any, catalog: Any, rid: str, method: str,
                     settings: EvaluateSettings, rows: list[dict[str, Any]],
                     sweep: list[dict[str, Any]], bar: Any) -> None:
    """:func:`evaluate_model` of one region: its rows and sweep appended."""
    from optw.decode.solve import search_progress, solve

    region = catalog.region(rid)
    val = catalog.tourists(rid, settings.tourists)[: settings.validation_tourists]
    batches = [catalog.benchmark(rid)]
    if len(val):
        batches += [val[k] for k in range(len(val))] if settings.one_by_one else [val]
    greedy = [solve(model, region, tourists, "greedy") for tourists in batches]
    reuse = settings.keep_greedy
    beam = [solve(model, region, tourists, "beam", beams=settings.beams, keep_greedy=reuse,
                  greedy=g) for tourists, g in zip(batches, greedy, strict=True)]
    runs: list[tuple[str, list[list[Any]]]] = [(f"{method}_greedy", greedy), (method, beam)]
    if settings.active_search:
        runs.append((f"{method}_as", [
            solve(model, region, tourists, "active_search", beams=settings.beams,
                  epochs=settings.active_search,
                  progress=search_progress(bar, tourists.tourist_id.tolist(), region=rid))
            for tourists in batches]))
    for name, solved in runs:
        for tourists, sols in zip(batches, solved, strict=True):
            for tid, sol in zip(tourists.tourist_id, sols, strict=True):
                rows.append({"region": rid, "tourist": int(tid), "kind": tourists.kind,
                             "method": name, "score": float(sol.score),
                             "seconds": float(sol.seconds), "route": json.dumps(sol.route)})
    for width in settings.beam_sweep:
        # the evaluation's own width on the benchmark tourist was solved just above
        sol = (beam[0][0] if width == settings.beams else
               solve(model, region, batches[0], "beam", beams=width,
                     keep_greedy=reuse, greedy=greedy[0])[0])
        sweep.append({"region": rid, "method": method, "beams": width,
                      "score": float(sol.score), "seconds": float(sol.seconds)})


def validation_score(rows: list[dict[str, Any]], region: str, method: str) -> float:
    """Mean score of ``method`` on ``region``'s generated tourists (else on all its rows)."""
    mine = [r for r in rows if r["region"] == region and r["method"] == method]
    vals = [r["score"] for r in mine if r["kind"] != "benchmark"] or [r["score"] for r in mine]
    return float(np.mean(vals)) if vals else float("nan")


def gap_to_ils(metrics: dict[str, float], ils_means: dict[str, float]) -> float | None:
    """Mean gap of ``val_score/<region>`` (or ``val_score``) to the regions' ILS means."""
    pairs = [(ils, metrics.get(f"val_score/{rid}", metrics.get("val_score")))
             for rid, ils in ils_means.items()]
    pairs = [(ils, score) for ils, score in pairs if score is not None and ils > 0]
    if not pairs:
        return None
    ils, score = zip(*pairs, strict=True)
    return float(np.mean(gap(ils, score)))


def ils_validation_means(catalog_dir: str, regions: list[str], n_tourists: int) -> dict[str, float]:
    """Mean stored ILS score over each region's first ``n_tourists`` validation tourists."""
    from optw.baselines import load_ils_results

    ils = load_ils_results(catalog_dir)
    val = ils[(ils["kind"] == "validation") & ils["region"].isin(regions)
              & (ils["tourist"] <= n_tourists)]
    return {str(k): float(v) for k, v in val.groupby("region")["score"].mean().items()}
