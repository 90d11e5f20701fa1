"""``optw serve`` (the trip planner service) and ``optw plan`` (one itinerary, in-process)."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Any

from optw.errors import OptwError, UserError

#: ``optw plan``: request field -> the option it comes from, for error messages.
PLAN_OPTIONS = {"region": "--region", "start": "--start", "t_start": "--from", "t_end": "--to",
                "scores": "--scores", "preference": "--preference", "method": "--method",
                "beams": "--beams"}
#: The longest ``optw plan`` waits for the registry (alias lookup and model download).
PLAN_REGISTRY_TIMEOUT = 60.0


def register(sub: argparse._SubParsersAction) -> None:
    from optw.decode.limits import MAX_BEAMS, MIN_BEAMS, SERVE_BEAMS
    from optw.serve import settings as st
    from optw.serve.preferences import PREFERENCES
    from optw.serve.request import METHODS

    # values are read as text and checked by the handlers: one line per bad value, before Ray
    s = sub.add_parser(
        "serve", help="run the trip planner service (Ray Serve, POST /plan)",
        description="Deploy the trip planner on a local Ray (or --ray-address) and serve until "
        "Ctrl-C. Models come from the registry alias models:/optw-<region>@champion "
        "($MLFLOW_TRACKING_URI or the project's mlflow.db); see docs/planner.md. Every option "
        "is checked before Ray starts.")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    s.add_argument("--port", default="8000",
                   help="HTTP port 1..65535, 0 = any free port (default 8000)")
    s.add_argument("--replicas", default="1",
                   help="planner replicas, >= 1, all fitting the CPUs (default 1)")
    s.add_argument("--solve-threads", default="1",
                   help=f"solves at once per replica, 1..{st.MAX_SOLVE_THREADS}, torch using 1 "
                   "thread each; each replica reserves 0.5 CPU per thread (default 1; 2 raises "
                   "throughput on long routes on a 2-core machine)")
    s.add_argument("--check-interval", default=str(st.DEFAULT_CHECK_INTERVAL),
                   help=f"seconds between checks for a new champion, 0..{st.MAX_CHECK_INTERVAL:g} "
                   f"(0: on every request; default {st.DEFAULT_CHECK_INTERVAL:g})")
    s.add_argument("--registry-timeout", default=str(st.DEFAULT_REGISTRY_TIMEOUT),
                   help="seconds a request waits for the registry, 0.1..600; then it is served "
                   "with the cached model, or answered 503 (default "
                   f"{st.DEFAULT_REGISTRY_TIMEOUT:g})")
    s.add_argument("--request-timeout", default=str(st.DEFAULT_REQUEST_TIMEOUT),
                   help="seconds after which an unanswered request gets 408, 1..3600 "
                   f"(default {st.DEFAULT_REQUEST_TIMEOUT:g})")
    s.add_argument("--ray-address", default="local",
                   help="'local' starts a private Ray (default); 'auto' or HOST:PORT joins one")
    s.set_defaults(func=_serve)

    p = sub.add_parser(
        "plan", help="plan one itinerary in-process (no server)",
        description="Solve one tourist's trip with the region's champion model (or a "
        "checkpoint) and print the itinerary. Times are minutes or HH:MM. Every option is "
        "checked before a model is loaded.")
    p.add_argument("--region", required=True)
    p.add_argument("--start", default=None, metavar="X,Y|LAT,LON",
                   help="start and end location, LAT,LON for a lat/lon region (default: the "
                   "region's own start); negative values work: --start -33.86,151.2 or "
                   "--start=-33.86,151.2")
    p.add_argument("--from", dest="t_start", default=None, metavar="TIME",
                   help="day start, minutes or HH:MM (default: the benchmark's). HH:MM is "
                   "the time of day on the Gavalas (t1xx, t2xx) and custom regions; on the "
                   "Solomon and Cordeau regions (c101, pr01, ...) time counts from 0 at the "
                   "depot's opening, so 09:00 means 540 minutes after it opens")
    p.add_argument("--to", dest="t_end", default=None, metavar="TIME",
                   help="day end, minutes or HH:MM, as --from (default: the benchmark's)")
    p.add_argument("--method", default=None, help=f"{', '.join(METHODS)} (default beam)")
    p.add_argument("--beams", default=None,
                   help=f"beam width {MIN_BEAMS}..{MAX_BEAMS} (default {SERVE_BEAMS})")
    p.add_argument("--preference", default=None, help=f"one of {', '.join(PREFERENCES)} "
                   "(default balanced)")
    p.add_argument("--scores", default=None, metavar="FILE",
                   help="JSON list with one score per point (instead of --preference)")
    p.add_argument("--checkpoint", default=None,
                   help="model file (default: the registry champion of the region)")
    p.add_argument("--json", action="store_true", help="print the answer as JSON")
    # a value that starts with "-" and a digit is a value (a negative coordinate or time),
    # not an option: `--start -33.86,151.2` (argparse takes only "-5" and "-1.5" as numbers)
    p._negative_number_matcher = re.compile(r"^-\.?\d")
    p.set_defaults(func=_plan)
    for parser in (s, p):
        parser.add_argument("--catalog", default=None,
                            help="catalog folder (default: $OPTW_CATALOG or region_catalog/)")
        parser.add_argument("--tracking-uri", default=None,
                            help="MLflow store with the registry (default: $MLFLOW_TRACKING_URI "
                            "or the project's sqlite mlflow.db); must answer within 3 s")


def _serve(args) -> int:
    from optw.checks import int_in
    from optw.serve.settings import MAX_SOLVE_THREADS, SERVE_FLAGS, serve_settings

    threads = int_in(args.solve_threads, "--solve-threads", 1, MAX_SOLVE_THREADS,
                     "a number of solves at once per replica")
    settings = serve_settings(
        host=args.host, port=args.port, catalog=args.catalog, tracking_uri=args.tracking_uri,
        check_interval=args.check_interval, num_replicas=args.replicas, num_cpus=0.5 * threads,
        solve_threads=threads, ray_address=args.ray_address, registry_timeout=args.registry_timeout,
        request_timeout=args.request_timeout, names=SERVE_FLAGS)
    from optw.raylogs import filter_ray_noise
    from optw.serve.app import deploy  # imports Ray; starts it only now, with good settings

    filter_ray_noise()  # Ray's internal start/stop lines stay off the terminal
    deploy(settings, blocking=True, names=SERVE_FLAGS)
    return 0


def _request(args) -> dict[str, Any]:
    """The ``/plan`` request of the options, their formats checked (values: parse_request)."""
    from optw.checks import parse_number, word
    from optw.serve.preferences import PREFERENCES
    from optw.serve.request import METHODS

    req: dict[str, Any] = {"region": word(args.region, "--region", "a region id such as t101")}
    if args.start is not None:
        if len(xy := [parse_number(v) for v in args.start.split(",")]) != 2 or None in xy:
            raise UserError(f"--start: expected X,Y (two finite numbers), got {args.start!r}")
        req["start"] = {"x": xy[0], "y": xy[1]}
    for key, option in (("t_start", "--from"), ("t_end", "--to")):
        if (value := getattr(args, key)) is not None:
            req[key] = value if ":" in value else parse_number(value)
            if req[key] is None:
                raise UserError(f"{option}: expected minutes (a finite number) or HH:MM, got "
                                f"{value!r}")
    for key, what, known in (("method", "method", METHODS), ("preference", "profile", PREFERENCES)):
        if (value := getattr(args, key)) is not None:
            if value not in known:
                raise UserError(f"--{key}: unknown {what} {value!r}; expected one of "
                                f"{', '.join(known)}")
            req[key] = value
    if args.beams is not None:  # an integer's text as the integer; checked with the request
        beams = args.beams.strip()
        req["beams"] = int(beams) if re.fullmatch(r"[+-]?\d{1,30}", beams, re.ASCII) else beams
        req.setdefault("method", "beam")
    if args.scores is not None:
        if args.preference is not None:
            raise UserError("--scores: give --scores or --preference, not both")
        if not (path := Path(args.scores)).is_file():
            raise UserError(f"--scores: file {path} does not exist")
        try:
            req["scores"] = json.loads(path.read_text())
        except ValueError as exc:  # UnicodeDecodeError too
            raise UserError(f"--scores: {path} is not valid JSON ({exc})") from None
        except OSError as exc:
            raise UserError(f"--scores: cannot read {path} ({exc.strerror or exc})") from None
    return req


def _option_error(exc: Any) -> Exception:
    """A :class:`PlanError` as one line naming the option: 4xx a UserError, 503 (the registry)
    an OptwError naming ``--tracking-uri``, 500 (a route the validator refused) a bug."""
    field = exc.field or ""
    option = "--tracking-uri" if exc.status >= 500 else \
        PLAN_OPTIONS.get(field.split("[")[0].split(".")[0])
    message = exc.message
    if option:
        rest = message[len(field) + 1:].lstrip() if message.startswith(f"{field}:") else message
        label = option if option.lstrip("-") == field or exc.status >= 500 else \
            f"{option} ({field})"
        message = f"{label}: {rest}"
    if exc.status == 500:
        return RuntimeError(message)
    return (OptwError if exc.status >= 500 else UserError)(message)


def _models(args) -> Any:
    """The checkpoint, or the registry (checked to answer and exist before anything loads)."""
    from optw.serve.models import CheckpointModels, RegistryModels
    from optw.serve.settings import tracking_store
    from optw.tracking.uri import ENV_URI, sqlite_path

    if args.checkpoint is not None:
        if not (path := Path(args.checkpoint)).is_file():
            raise UserError(f"--checkpoint: file {path} does not exist")
        try:
            return CheckpointModels(path)
        except Exception as exc:
            raise UserError(f"--checkpoint: cannot load {path} ({type(exc).__name__}: "
                            f"{' '.join(str(exc).split())})") from None
    uri = tracking_store(args.tracking_uri, "--tracking-uri")
    if (db := sqlite_path(uri)) is not None and not db.is_file():
        label = "--tracking-uri" if args.tracking_uri or not os.environ.get(ENV_URI) \
            else f"${ENV_URI}"
        raise UserError(f"{label}: no MLflow store at {db} ({uri}): no model is registered "
                        "there; train one first, or give --checkpoint")
    return RegistryModels(uri, check_interval=math.inf, timeout=PLAN_REGISTRY_TIMEOUT)


def _plan(args) -> int:
    from optw.serve.errors import PlanError
    from optw.serve.models import RegistryModels
    from optw.serve.planner import Planner
    from optw.serve.request import clock_note, parse_request
    from optw.serve.settings import open_catalog_checked

    data = _request(args)  # the options' own formats
    catalog = open_catalog_checked(args.catalog, "--catalog")
    if isinstance(data.get("start"), dict) and data["region"] in catalog and \
            catalog.region(data["region"]).coords == "latlon":
        data["start"] = {"lat": data["start"]["x"], "lon": data["start"]["y"]}  # LAT,LON
    models = None
    try:
        req = parse_request(data, catalog)  # against the region: nothing loaded yet
        models = _models(args)
        import torch

        torch.set_num_threads(1)  # decoding runs many small ops: more threads only contend
        answer = Planner(catalog, models, warn=_warning).solve(req)
    except PlanError as exc:
        raise _option_error(exc) from None
    finally:
        if isinstance(models, RegistryModels):
            models.close()
    if args.json:
        print(json.dumps(answer, indent=2))
    else:
        print(render_itinerary(answer, req.region.n_points, clock_note(req.region)))
    return 0


def _warning(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def render_itinerary(answer: dict[str, Any], n_points: int | None = None,
                     note: str | None = None) -> str:
    """A plan as a readable table (clock times when the request used HH:MM; ``begin``: after
    any wait), ``note`` (what a clock time means in the region) under the summary."""
    from optw.serve.request import format_time

    latlon = answer.get("coords") == "latlon"

    def t(v: float) -> str:
        return format_time(v) if answer.get("clock") or latlon else f"{v:.1f}"

    def where(p: dict[str, Any]) -> str:
        return f"({p['lat']:.5g}, {p['lon']:.5g})" if "lat" in p else f"({p['x']:g}, {p['y']:g})"

    model = (f"model version {answer['model_version']}" if answer.get("model_version")
             is not None else "model from checkpoint")
    how = answer["method"] + (f" (beam width {answer['beams']})" if answer.get("beams") else "")
    places = []
    for s in answer["route"]:
        name = s.get("name") or s["kind"]
        if s["kind"] == "visit" and name == f"POI {s['node']}":
            name = f"point {s['node']}"  # a region without names
        places.append(name[:40] if s["kind"] == "visit" and latlon else f"{name[:40]} {where(s)}")
    w = max(26, *map(len, places))
    lines = [
        f"Trip in {answer['region']} from {where(answer['start'])}, "
        f"{t(answer['t_start'])} to {t(answer['t_end'])}",
        f"{answer['visits']} visit(s){f' of {n_points} points' if n_points else ''}; "
        f"{how}, {model}; solved in {answer['solve_ms']:.0f} ms",
        *([f"Note: {note}"] if note else []),
        "",
        f"{'stop':>4}  {'place':<{w}} {'arrive':>8} {'begin':>8} {'leave':>8} {'score':>8}",
    ]
    for s, place in zip(answer["route"], places, strict=True):
        arrive = "" if s["kind"] == "start" else t(s["arrival"])
        begin = t(s["start"]) if s["kind"] == "visit" else ""
        leave = "" if s["kind"] == "end" else t(s["leave"])
        score = f"{s['score']:g}" if s["kind"] == "visit" else ""
        lines.append(f"{s['stop']:>4}  {place:<{w}} {arrive:>8} {begin:>8} {leave:>8} {score:>8}")
    lines.append(f"{'':>4}  {'total':<{w}} {'':>8} {'':>8} {'':>8} {answer['score']:>8g}")
    return "\n".join(lines)
