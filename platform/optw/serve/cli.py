"""``optw serve`` (the trip planner service) and ``optw plan`` (one itinerary, in-process)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def register(sub: argparse._SubParsersAction) -> None:
    from optw.serve.planner import DEFAULT_CHECK_INTERVAL, METHODS, PREFERENCES

    s = sub.add_parser(
        "serve", help="run the trip planner service (Ray Serve, POST /plan)",
        description="Deploy the trip planner on a local Ray (or --ray-address) and serve until "
        "Ctrl-C. Models come from the registry alias models:/optw-<region>@champion "
        "($MLFLOW_TRACKING_URI or the project's mlflow.db); see docs/planner.md.",
    )
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    s.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    s.add_argument("--catalog", type=Path, default=None,
                   help="catalog folder (default: $OPTW_CATALOG or region_catalog/)")
    s.add_argument("--tracking-uri", default=None,
                   help="MLflow store with the registry (default: $MLFLOW_TRACKING_URI or the "
                   "project's sqlite mlflow.db)")
    s.add_argument("--replicas", type=int, default=1, help="planner replicas (default 1)")
    s.add_argument("--solve-threads", type=int, default=1,
                   help="solves at once per replica, torch using 1 thread each (default 1; 2 "
                   "raises throughput on long routes on a 2-core machine)")
    s.add_argument("--check-interval", type=float, default=DEFAULT_CHECK_INTERVAL,
                   help="seconds between checks for a new champion (default %(default)s)")
    s.add_argument("--ray-address", default="local",
                   help="'local' starts a private Ray (default); 'auto' or an address joins one")
    s.set_defaults(func=_serve)

    p = sub.add_parser(
        "plan", help="plan one itinerary in-process (no server)",
        description="Solve one tourist's trip with the region's champion model (or a "
        "checkpoint) and print the itinerary. Times are minutes or HH:MM.",
    )
    p.add_argument("--region", required=True)
    p.add_argument("--start", default=None, metavar="X,Y",
                   help="start and end location (default: the region's benchmark start)")
    p.add_argument("--from", dest="t_start", default=None, metavar="TIME",
                   help="day start, minutes or HH:MM (default: the benchmark's)")
    p.add_argument("--to", dest="t_end", default=None, metavar="TIME",
                   help="day end, minutes or HH:MM (default: the benchmark's)")
    p.add_argument("--method", choices=list(METHODS), default=None,
                   help="greedy, beam (default) or active-search")
    p.add_argument("--beams", type=int, default=None, help="beam width 1..128 (default 16)")
    p.add_argument("--preference", default=None, help=f"one of {', '.join(PREFERENCES)} "
                   "(default balanced)")
    p.add_argument("--scores", type=Path, default=None, metavar="FILE",
                   help="JSON list with one score per point (instead of --preference)")
    p.add_argument("--checkpoint", type=Path, default=None,
                   help="model file (default: the registry champion of the region)")
    p.add_argument("--catalog", type=Path, default=None)
    p.add_argument("--tracking-uri", default=None)
    p.add_argument("--json", action="store_true", help="print the answer as JSON")
    p.set_defaults(func=_plan)


def _serve(args) -> int:
    from optw.serve.app import start_planner

    start_planner(args.host, args.port, blocking=True, catalog=args.catalog,
                  tracking_uri=args.tracking_uri, check_interval=args.check_interval,
                  num_replicas=args.replicas, solve_threads=args.solve_threads,
                  num_cpus=0.5 * max(1, args.solve_threads), ray_address=args.ray_address)
    return 0


def _request(args) -> dict[str, Any]:
    req: dict[str, Any] = {"region": args.region}
    if args.start is not None:
        parts = args.start.split(",")
        try:
            x, y = (float(v) for v in parts)
        except ValueError:
            raise ValueError(f"--start: expected X,Y (two numbers), got {args.start!r}") from None
        req["start"] = {"x": x, "y": y}
    for key, value in (("t_start", args.t_start), ("t_end", args.t_end)):
        if value is not None:
            req[key] = value if ":" in value else _minutes(value, key)
    if args.method is not None:
        req["method"] = args.method
    if args.beams is not None:
        req["beams"] = args.beams
        req.setdefault("method", "beam")
    if args.preference is not None:
        req["preference"] = args.preference
    if args.scores is not None:
        req["scores"] = json.loads(args.scores.read_text())
    return req


def _minutes(text: str, key: str) -> float:
    try:
        return float(text)
    except ValueError:
        flag = "--from" if key == "t_start" else "--to"
        raise ValueError(f"{flag}: expected minutes or HH:MM, got {text!r}") from None


def _plan(args) -> int:
    import torch

    from optw.catalog import open_catalog
    from optw.serve.planner import CheckpointModels, PlanError, Planner, RegistryModels

    torch.set_num_threads(1)  # decoding runs many small ops: more threads only contend
    catalog = open_catalog(args.catalog)
    if args.checkpoint is not None:
        models: Any = CheckpointModels(args.checkpoint)
    else:
        models = RegistryModels(args.tracking_uri, check_interval=float("inf"))
    try:
        planner = Planner(catalog, models)
        try:
            answer = planner.plan(_request(args))
        except PlanError as exc:
            raise ValueError(exc.message) from None
    finally:
        if isinstance(models, RegistryModels):
            models.close()
    if args.json:
        print(json.dumps(answer, indent=2))
    else:
        print(render_itinerary(answer, catalog.region(args.region).n_points))
    return 0


def render_itinerary(answer: dict[str, Any], n_points: int | None = None) -> str:
    """A plan as a table a person can read (clock times when the request used HH:MM)."""
    from optw.serve.planner import format_time

    def t(v: float) -> str:
        return format_time(v) if answer.get("clock") else f"{v:.1f}"

    model = (f"model version {answer['model_version']}" if answer.get("model_version")
             is not None else "model from checkpoint")
    how = answer["method"] + (f" (beam width {answer['beams']})" if answer.get("beams") else "")
    lines = [
        f"Trip in {answer['region']} from ({answer['start']['x']:g}, {answer['start']['y']:g}), "
        f"{t(answer['t_start'])} to {t(answer['t_end'])}",
        f"{answer['visits']} visit(s){f' of {n_points} points' if n_points else ''}; "
        f"{how}, {model}; solved in {answer['solve_ms']:.0f} ms",
        "",
        f"{'stop':>4}  {'place':<26} {'arrive':>8} {'start visit':>11} {'leave':>8} "
        f"{'score':>8}",
    ]
    for s in answer["route"]:
        place = (s["kind"] if s["kind"] != "visit" else f"point {s['node']}") + \
            f" ({s['x']:g}, {s['y']:g})"
        arrive = "" if s["kind"] == "start" else t(s["arrival"])
        begin = t(s["start"]) if s["kind"] == "visit" else ""
        leave = "" if s["kind"] == "end" else t(s["leave"])
        score = f"{s['score']:g}" if s["kind"] == "visit" else ""
        lines.append(f"{s['stop']:>4}  {place:<26} {arrive:>8} {begin:>11} {leave:>8} "
                     f"{score:>8}")
    lines.append(f"{'':>4}  {'total':<26} {'':>8} {'':>11} {'':>8} {answer['score']:>8g}")
    return "\n".join(lines)


if __name__ == "__main__":
    from optw.cli import main

    sys.exit(main(["plan", *sys.argv[1:]]))
