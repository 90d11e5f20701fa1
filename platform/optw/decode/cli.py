"""``optw solve``: routes for a region's tourists from a trained model.

Examples::

    optw solve --region pr01 --checkpoint pr01_uni_samp_500000.pt            # beam search 128
    optw solve --region t101 --checkpoint model.pt --greedy --tourist validation --json
    optw solve --region t101 --checkpoint model.pt --active-search 128 --tourist me.json
    optw solve --region pr01 --checkpoint pr01_uni_samp_500000.pt --tourist paper --published

``--tourist paper``: the paper's own 64 tourists of the region (a catalog built with
``--paper-sets``; a CPU approximation is flagged on standard error). A tourist file: README.md
("A tourist as JSON"), checked by :func:`optw.catalog.read_tourists`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from optw.decode.limits import (
    MAX_ACTIVE_SEARCH_EPOCHS,
    MAX_BEAMS,
    MAX_SAMPLES,
    MIN_BEAMS,
    PAPER_BEAMS,
    SAMPLES,
)
from optw.errors import UserError
from optw.threads import MAX_THREADS

if TYPE_CHECKING:
    from optw.catalog import Region, TouristBatch

TOURIST_CHOICES = ("benchmark", "validation", "paper")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("solve", help="solve tourists of a region with a trained model")
    p.add_argument("--region", required=True, help="region id, e.g. pr01")
    p.add_argument("--checkpoint", required=True, type=Path,
                   help="model file: ours or the authors' published .pt")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--greedy", action="store_true", help="greedy decoding")
    how.add_argument("--samples", type=int, default=None, metavar="N",
                     help=f"best of N sampled routes, 1..{MAX_SAMPLES}")
    how.add_argument("--active-search", type=int, default=None, metavar="EPOCHS",
                     help=f"active search for EPOCHS epochs (0..{MAX_ACTIVE_SEARCH_EPOCHS}; the "
                     "paper: 128), then beam search")
    p.add_argument("--beams", type=int, default=PAPER_BEAMS,
                   help=f"beam width {MIN_BEAMS}..{MAX_BEAMS} (default {PAPER_BEAMS})")
    p.add_argument("--tourist", default="benchmark",
                   help="benchmark (default), validation, paper (the paper's own set) or a "
                   "tourist JSON file")
    p.add_argument("--published", action="store_true",
                   help="published-outputs mode: do not add the greedy route to the candidates")
    p.add_argument("--seed", type=int, default=0, help="seed of sampling / active search")
    p.add_argument("--threads", type=int, default=None,
                   help=f"torch threads, 1..{MAX_THREADS} (default: the cores not busy with "
                   "other work, see optw.threads)")
    p.add_argument("--json", action="store_true", help="one JSON object per tourist")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="active search: a progress bar on stderr with the epochs done and the "
                   "best score sampled so far (default: when stderr is a terminal)")
    p.add_argument("--catalog", type=Path, default=None)
    p.set_defaults(func=_solve)


def read_tourists(path: Path, region: Region) -> TouristBatch:
    """Tourists of ``region`` from a JSON file; errors name the file, tourist and field."""
    from optw.catalog import TouristError
    from optw.catalog import read_tourists as read_records
    from optw.catalog.tourist_json import load_json

    where = f"tourist file {path}"
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise UserError(f"{where} does not exist (--tourist takes "
                        f"{', '.join(TOURIST_CHOICES)} or a tourist JSON file)") from None
    except OSError as exc:
        raise UserError(f"{where} cannot be read: {exc.strerror or exc}") from None
    data = load_json(raw, where)  # one line for bad JSON, deep nesting, huge numbers
    if isinstance(data, dict) and set(data) == {"tourists"}:
        data = data["tourists"]
    try:
        return read_records([data] if isinstance(data, dict) else data, region, kind="file")
    except TouristError as exc:
        raise exc.within(where) from None


def _solve(args) -> int:
    from tqdm import tqdm

    from optw.catalog import TouristBatch, open_catalog
    from optw.decode.limits import check_beams
    from optw.decode.solve import region_mismatch, search_progress, solve
    from optw.model import load_model
    from optw.threads import check_threads, set_torch_threads

    if args.threads is not None:
        check_threads(args.threads, "--threads")
    check_beams(args.beams, "--beams")
    for flag, value, what, lo, hi in (
            ("--samples", args.samples, "routes", 1, MAX_SAMPLES),
            ("--active-search", args.active_search, "epochs", 0, MAX_ACTIVE_SEARCH_EPOCHS)):
        if value is not None and not lo <= value <= hi:
            raise UserError(f"{flag}: expected a number of {what} in {lo}..{hi}, got {value}")
    set_torch_threads(args.threads)  # default: the cores that other work leaves free
    cat = open_catalog(args.catalog)
    region = cat.region(args.region)
    if args.tourist in TOURIST_CHOICES:
        batch = TouristBatch.of(cat.tourists(args.region, args.tourist))
        if args.tourist == "paper" and not cat.paper_exact(args.region):
            print(f"note: the paper set of {args.region} is the CPU approximation, not the "
                  "paper's exact tourists (see optw.catalog.paper_sets)", file=sys.stderr)
    else:
        batch = read_tourists(Path(args.tourist), region)
    model = load_model(args.checkpoint)
    if warning := region_mismatch(model, region):
        print(f"warning: {args.checkpoint}: {warning}", file=sys.stderr)
    if args.greedy:
        method, label = "greedy", "greedy"
    elif args.samples is not None:
        method, label = "sampling", f"best of {args.samples} samples"
    elif args.active_search is not None:
        method, label = "active_search", (f"active search {args.active_search} epochs + "
                                          f"beam {args.beams}")
    else:
        method, label = "beam", f"beam search {args.beams}"
    searching = method == "active_search" and bool(args.active_search)
    show = searching and (sys.stderr.isatty() if args.progress is None else args.progress)
    with tqdm(total=(args.active_search or 0) * len(batch.ids), desc="active search",
              unit="epoch", file=sys.stderr, dynamic_ncols=True, disable=not show) as bar:
        solutions = solve(model, region, batch.tourists, method=method, beams=args.beams,
                          samples=args.samples or SAMPLES, epochs=args.active_search or 0,
                          keep_greedy=not args.published, seed=args.seed,
                          progress=search_progress(bar, list(batch.ids)) if show else None)
    for s, tourist in zip(solutions, batch.ids, strict=True):
        if args.json:
            print(json.dumps({**s.to_dict(), "tourist": tourist}))
        else:
            print(f"{s.region} tourist {tourist} ({label}): score {s.score:g} "
                  f"in {s.seconds:.3f} s")
            print("  route: " + " ".join(str(v) for v in s.route))
    return 0
