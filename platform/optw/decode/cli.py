"""``optw solve``: routes for a region's tourists from a trained model.

Examples::

    optw solve --region pr01 --checkpoint pr01_uni_samp_500000.pt            # beam search 128
    optw solve --region t101 --checkpoint model.pt --greedy --tourist validation --json
    optw solve --region t101 --checkpoint model.pt --active-search 128 --tourist me.json

A tourist file holds a JSON object or a list of objects
``{"start": [x, y], "t_start": ..., "t_end": ..., "scores": [...]}`` with one score per point of
interest (or per node, start and end included); an optional ``"tourist"`` gives its id.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

TOURIST_FIELDS = ("start", "t_start", "t_end", "scores")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("solve", help="solve tourists of a region with a trained model")
    p.add_argument("--region", required=True, help="region id, e.g. pr01")
    p.add_argument("--checkpoint", required=True, type=Path,
                   help="model file: ours or the authors' published .pt")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--greedy", action="store_true", help="greedy decoding")
    how.add_argument("--samples", type=int, default=None, metavar="N",
                     help="best of N sampled routes")
    how.add_argument("--active-search", type=int, default=None, metavar="EPOCHS",
                     help="active search for EPOCHS epochs, then beam search")
    p.add_argument("--beams", type=int, default=128, help="beam width 1..128 (default 128)")
    p.add_argument("--tourist", default="benchmark",
                   help="benchmark (default), validation, or a tourist JSON file")
    p.add_argument("--published", action="store_true",
                   help="published-outputs mode: do not add the greedy route to the candidates")
    p.add_argument("--seed", type=int, default=0, help="seed of sampling / active search")
    p.add_argument("--threads", type=int, default=None, help="torch threads")
    p.add_argument("--json", action="store_true", help="one JSON object per tourist")
    p.add_argument("--catalog", type=Path, default=None)
    p.set_defaults(func=_solve)


def _number(obj: dict, key: str, where: str) -> float:
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where}: {key!r} must be a number, got {value!r}")
    return float(value)


def read_tourists(path: Path, region):
    """Tourists of ``region`` from a JSON file (see the module docstring)."""
    import numpy as np

    from optw.catalog import Tourists

    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"tourist file {path} does not exist") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"tourist file {path} is not valid JSON: {exc}") from exc
    records = data if isinstance(data, list) else [data]
    if not records:
        raise ValueError(f"tourist file {path} holds no tourist")
    n, n_points = region.n_nodes, region.n_points
    ids, starts, t_start, t_end, scores = [], [], [], [], []
    for i, rec in enumerate(records):
        where = f"tourist file {path}, tourist {i}"
        if not isinstance(rec, dict):
            raise ValueError(f"{where}: expected an object, got {type(rec).__name__}")
        for key in TOURIST_FIELDS:
            if key not in rec:
                raise ValueError(f"{where}: missing field {key!r}")
        start = rec["start"]
        if (not isinstance(start, list) or len(start) != 2
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                           for v in start)):
            raise ValueError(f"{where}: 'start' must be [x, y], got {start!r}")
        ts, te = _number(rec, "t_start", where), _number(rec, "t_end", where)
        if te <= ts:
            raise ValueError(f"{where}: 't_end' ({te:g}) must be after 't_start' ({ts:g})")
        sc = rec["scores"]
        if not isinstance(sc, list) or len(sc) not in (n_points, n):
            got = len(sc) if isinstance(sc, list) else type(sc).__name__
            raise ValueError(f"{where}: 'scores' needs {n_points} values (one per point of "
                             f"interest of {region.id}) or {n}, got {got}")
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in sc):
            raise ValueError(f"{where}: 'scores' must be numbers")
        row = np.zeros(n)
        row[1:-1] = sc if len(sc) == n_points else sc[1:-1]
        tid = rec.get("tourist", i)
        if isinstance(tid, bool) or not isinstance(tid, int):
            raise ValueError(f"{where}: 'tourist' must be an integer id, got {tid!r}")
        ids.append(tid)
        starts.append([float(start[0]), float(start[1])])
        t_start.append(ts)
        t_end.append(te)
        scores.append(row)
    return Tourists(
        region_id=region.id, tourist_id=np.array(ids, dtype=np.int64), kind="file",
        start_xy=np.array(starts), t_start=np.array(t_start), t_end=np.array(t_end),
        scores=np.stack(scores),
    )


def _solve(args) -> int:
    import torch

    from optw.catalog import open_catalog
    from optw.decode.beam import check_width
    from optw.decode.solve import solve
    from optw.model import load_model

    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    check_width(args.beams)
    if args.samples is not None and args.samples < 1:
        raise ValueError(f"--samples must be >= 1, got {args.samples}")
    if args.active_search is not None and args.active_search < 0:
        raise ValueError(f"--active-search needs a number of epochs >= 0, got "
                         f"{args.active_search}")
    cat = open_catalog(args.catalog)
    region = cat.region(args.region)
    if args.tourist in ("benchmark", "validation"):
        tourists = cat.tourists(args.region, args.tourist)
    else:
        tourists = read_tourists(Path(args.tourist), region)
    model = load_model(args.checkpoint)
    if args.greedy:
        method, label = "greedy", "greedy"
    elif args.samples is not None:
        method, label = "sampling", f"best of {args.samples} samples"
    elif args.active_search is not None:
        method, label = "active_search", (f"active search {args.active_search} epochs + "
                                          f"beam {args.beams}")
    else:
        method, label = "beam", f"beam search {args.beams}"
    solutions = solve(model, region, tourists, method=method, beams=args.beams,
                      samples=args.samples or 128, epochs=args.active_search or 0,
                      keep_greedy=not args.published, seed=args.seed)
    for s in solutions:
        if args.json:
            print(json.dumps(s.to_dict()))
        else:
            print(f"{s.region} tourist {s.tourist} ({label}): score {s.score:g} "
                  f"in {s.seconds:.3f} s")
            print("  route: " + " ".join(str(v) for v in s.route))
    return 0
