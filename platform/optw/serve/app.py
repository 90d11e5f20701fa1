"""The trip planner as a Ray Serve application (FastAPI ingress; endpoints:
``docs/planner.md``). No ``from __future__ import annotations``: FastAPI must see ``Request``."""

import asyncio
import concurrent.futures
import logging
import os
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from ray import serve
from starlette.exceptions import HTTPException

from optw.checks import echoed
from optw.errors import OptwError
from optw.raylocal import configure_ray_env, ensure_token, interrupt_on_signals
from optw.serve.errors import PlanError
from optw.serve.models import RegistryModels
from optw.serve.planner import Planner
from optw.serve.request import MAX_BODY_BYTES
from optw.serve.settings import MAX_ONGOING_REQUESTS, ServeSettings, check_fit, serve_settings

log = logging.getLogger(__name__)

APP_NAME = "planner"
app = FastAPI(title="optw trip planner",
              description="Itineraries for tourists from each region's champion model.")
#: The planner's endpoints, for the 404 and 405 messages.
ENDPOINTS = ("GET /", "POST /plan", "GET /regions", "GET /regions/{id}", "GET /healthz")
#: The planner page's files (plain HTML, JS and inline SVG, nothing external).
STATIC_DIR = Path(__file__).with_name("static")
STATIC_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}


def static_file(name: str) -> Response:
    """One file of :data:`STATIC_DIR` (no sub-folders; 404 naming the path otherwise)."""
    path = STATIC_DIR / name
    if "/" in name or name.startswith(".") or path.suffix not in STATIC_TYPES or not path.is_file():
        raise PlanError(404, "path", f"path: no file {name[:200]!r} in the planner's static "
                        f"files; the planner serves {', '.join(ENDPOINTS)}")
    return Response(path.read_bytes(), media_type=STATIC_TYPES[path.suffix],
                    headers={"Cache-Control": "no-cache"})


def check_content_type(value: str | None) -> None:
    """``POST /plan`` takes JSON only: 415 naming the ``Content-Type`` header otherwise."""
    if (value or "").split(";", 1)[0].strip().lower() != "application/json":  # the media type
        got = f"{echoed(value)!r}" if value else "no Content-Type header"
        raise PlanError(415, "content-type", f"content-type: expected application/json, got "
                        f"{got}; send the header Content-Type: application/json")


@app.exception_handler(PlanError)
async def _plan_error(_: Request, exc: PlanError) -> JSONResponse:
    return JSONResponse(exc.to_dict(), status_code=exc.status)


@app.exception_handler(HTTPException)
async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    """Starlette's own errors (404, 405, ...) as ``{error, field, status}``, not ``{"detail"}``."""
    path = request.url.path[:200]
    if exc.status_code == 404:
        err = PlanError(404, "path", f"path: no endpoint {path!r}; the planner serves "
                        f"{', '.join(ENDPOINTS)}")
    elif exc.status_code == 405:
        err = PlanError(405, "method", f"method: {request.method} is not allowed on {path!r}; "
                        f"use {(exc.headers or {}).get('Allow', '?')}")
    else:
        err = PlanError(exc.status_code, None, f"{exc.detail}")
    return JSONResponse(err.to_dict(), status_code=err.status, headers=exc.headers)


@app.exception_handler(Exception)
async def _internal_error(_: Request, exc: Exception) -> JSONResponse:
    log.error("internal error: %s: %s", type(exc).__name__, exc)
    err = PlanError(500, None, f"internal error: {type(exc).__name__}: {exc}")
    return JSONResponse(err.to_dict(), status_code=500)


@serve.deployment(name="Planner", num_replicas=1, max_ongoing_requests=MAX_ONGOING_REQUESTS,
                  ray_actor_options={"num_cpus": 0.5}, health_check_period_s=10)
@serve.ingress(app)
class PlannerDeployment:
    """One replica: the catalog, a model cache and ``solve_threads`` solve threads. Requests
    wait for a solve slot here, asynchronously, so ``/healthz`` never waits for a solve."""

    def __init__(self, settings: ServeSettings):
        import torch

        from optw.catalog import open_catalog

        torch.set_num_threads(1)
        catalog = open_catalog(settings.catalog)
        catalog.region(catalog.list_regions()[0])  # read the node table now, not on a request
        self.models = RegistryModels(settings.tracking_uri, settings.check_interval,
                                     timeout=settings.registry_timeout)
        self.planner = Planner(catalog, self.models, solve_options=settings.solve_options)
        self.solve_slots = asyncio.Semaphore(settings.solve_threads)
        self.solver = concurrent.futures.ThreadPoolExecutor(settings.solve_threads,
                                                            thread_name_prefix="optw-solve")
        self.in_flight = 0  # /plan requests past parsing: solving or waiting for a slot
        self.started = time.time()

    @app.post("/plan")
    async def plan(self, request: Request) -> JSONResponse:
        """An itinerary for one tourist (see ``docs/planner.md`` for the body)."""
        check_content_type(request.headers.get("content-type"))
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > MAX_BODY_BYTES:
            raise PlanError(413, "body", f"request body of {length} bytes is over the limit of "
                            f"{MAX_BODY_BYTES} bytes")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                raise PlanError(413, "body", f"request body is over the limit of "
                                f"{MAX_BODY_BYTES} bytes")
        req = self.planner.parse(bytes(body))  # cheap: bad requests never wait for a solve
        self.in_flight += 1
        try:
            # the model first, without a solve slot (uncached: up to registry_timeout, then 503)
            model = await asyncio.to_thread(self.models.get, req.region.id)
            async with self.solve_slots:
                answer = await asyncio.get_running_loop().run_in_executor(
                    self.solver, self.planner.solve, req, model)
        except PlanError:
            raise
        except Exception as exc:  # a bug or a broken model: say so, keep serving
            log.exception("planning failed for region %s", req.region.id)
            raise PlanError(500, None, f"internal error while planning: "
                            f"{type(exc).__name__}: {exc}") from exc
        finally:
            self.in_flight -= 1
        return JSONResponse(answer)

    @app.get("/regions")
    async def regions(self) -> list[dict[str, Any]]:
        """Every region with its number of points, benchmark start/times and day."""
        return self.planner.regions()

    @app.get("/regions/{region_id}")
    async def region(self, region_id: str) -> dict[str, Any]:
        """One region with all its points."""
        return self.planner.region(region_id)

    @app.get("/")
    async def page(self) -> Response:
        """The planner page: pick a region, click a start on its map, plan, see the route."""
        return static_file("index.html")

    @app.get("/static/{name}")
    async def static(self, name: str) -> Response:
        """The page's own script and styles."""
        return static_file(name)

    @app.get("/healthz")
    async def healthz(self) -> dict[str, Any]:
        """Liveness: regions, cached model versions, plans in flight, uptime; never waits."""
        return {"status": "ok", "regions": len(self.planner.catalog),
                "models": self.models.loaded(), "plans_in_flight": self.in_flight,
                "tracking_uri": self.models.uri,
                "uptime_s": round(time.time() - self.started, 1), "pid": os.getpid()}

    def __del__(self) -> None:
        if hasattr(self, "models"):
            self.models.close()
        if hasattr(self, "solver"):
            self.solver.shutdown(wait=False, cancel_futures=True)


def build_app(catalog: str | Path | None = None, tracking_uri: str | None = None, *,
              settings: ServeSettings | None = None, **options: Any) -> serve.Application:
    """The bound Serve application of checked ``settings``, else of :func:`serve_settings`'s."""
    if settings is None:
        settings = serve_settings(catalog=catalog, tracking_uri=tracking_uri, ray_running=True,
                                  **options)
    return PlannerDeployment.options(
        num_replicas=settings.num_replicas, ray_actor_options={"num_cpus": settings.num_cpus},
    ).bind(settings)


_started_ray = False
#: Seconds Ray Serve's HTTP proxy gets to start (Serve's own limit: 60).
PROXY_START_TIMEOUT_S = 300.0


def start_planner(host: str = "127.0.0.1", port: int = 8000, blocking: bool = False,
                  **options: Any) -> str:
    """Deploy the planner at ``http://host:port`` (``port=0``: a free one) and return that URL;
    ``blocking`` serves until Ctrl-C. ``options``: :func:`serve_settings`'s, checked before Ray
    starts (a local Ray unless Ray is initialised here or ``ray_address`` names one)."""
    import ray

    settings = serve_settings(host=host, port=port, ray_running=ray.is_initialized(), **options)
    return deploy(settings, blocking=blocking)


def _allow_slow_proxy_start(seconds: float) -> None:
    """Give Serve's HTTP proxy ``seconds`` to start, not its fixed 60 s (a private constant)."""
    try:
        from ray.serve._private import api as serve_api
    except ImportError:
        return
    current = getattr(serve_api, "HTTP_PROXY_TIMEOUT", None)
    if isinstance(current, (int, float)) and current < seconds:
        serve_api.HTTP_PROXY_TIMEOUT = seconds


def deploy(settings: ServeSettings, blocking: bool = False,
           names: dict[str, str] | None = None) -> str:
    """Start Ray (unless initialised) and Serve, run the planner with checked ``settings`` and
    return its URL once ``/healthz`` answers; ``names``: how errors name the settings."""
    global _started_ray
    import ray

    names = {"num_replicas": "num_replicas", "num_cpus": "num_cpus", **(names or {})}
    started_here = not ray.is_initialized()
    if started_here:
        configure_ray_env()  # the project's Ray defaults (a local Ray started here reads them)
        if settings.ray_address == "local":
            ensure_token()
        ray.init(address=settings.ray_address, include_dashboard=False,
                 num_cpus=settings.ray_cpus, log_to_driver=False, configure_logging=False)
        _started_ray = True
    try:
        if settings.ray_address != "local" or not started_here:
            # a cluster we joined: all replicas must fit, or requests would wait for ever
            total = float(ray.cluster_resources().get("CPU", 0.0))
            check_fit(settings.num_replicas, settings.num_cpus, total, names, "the Ray cluster")
        _allow_slow_proxy_start(max(settings.ready_timeout, PROXY_START_TIMEOUT_S))
        serve.start(http_options={"host": settings.host, "port": settings.port,
                                  "request_timeout_s": settings.request_timeout})
        serve.run(build_app(settings=settings), name=APP_NAME, route_prefix="/")
        _wait_ready(settings.url, settings.ready_timeout)
    except BaseException:
        if started_here:  # leave a Ray (and its Serve) that someone else started alone
            stop_planner()
        raise
    if blocking:
        print(f"trip planner listening on {settings.url} (Ctrl-C stops it)", flush=True)
        # SIGINT too: a planner started in the background would otherwise ignore it
        interrupt_on_signals((signal.SIGINT, signal.SIGTERM))
        try:
            while True:
                time.sleep(1.0)
        except KeyboardInterrupt:
            print("stopping the trip planner", flush=True)
        finally:
            stop_planner()
    return settings.url


def _wait_ready(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError as exc:  # URLError too
            last = exc
        time.sleep(0.2)
    raise OptwError(f"the planner did not answer {url}/healthz within {timeout:g} s ({last})")


def stop_planner() -> None:
    """Shut Serve down, and Ray too when :func:`start_planner` started it."""
    global _started_ray
    import ray

    if ray.is_initialized():
        serve.shutdown()
        if _started_ray:
            ray.shutdown()
            _started_ray = False
