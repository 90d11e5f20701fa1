"""The trip planner as a Ray Serve application (FastAPI ingress).

Endpoints: ``POST /plan``, ``GET /regions``, ``GET /regions/{id}``, ``GET /healthz``
(``docs/planner.md``). Start it with :func:`start_planner` or ``optw serve``::

    from optw.serve import start_planner, stop_planner
    url = start_planner(port=8000)          # local Ray, returns "http://127.0.0.1:8000"
    ...
    stop_planner()

No ``from __future__ import annotations`` here: FastAPI must see the real ``Request`` type of
the ingress methods' parameters.
"""

import asyncio
import logging
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from ray import serve

from optw.serve.planner import (
    DEFAULT_CHECK_INTERVAL,
    MAX_BODY_BYTES,
    PlanError,
    Planner,
    RegistryModels,
)

log = logging.getLogger(__name__)

APP_NAME = "planner"
app = FastAPI(title="optw trip planner",
              description="Itineraries for tourists from each region's champion model.")


@app.exception_handler(PlanError)
async def _plan_error(_: Request, exc: PlanError) -> JSONResponse:
    return JSONResponse(exc.to_dict(), status_code=exc.status)


@serve.deployment(name="Planner", num_replicas=1, max_ongoing_requests=16,
                  ray_actor_options={"num_cpus": 0.5}, health_check_period_s=10)
@serve.ingress(app)
class PlannerDeployment:
    """One replica: the catalog, a per-region model cache and a small solve pool.

    ``settings``: ``catalog`` (folder or None), ``tracking_uri``, ``check_interval`` (s),
    ``solve_threads`` (concurrent solves; torch runs 1 thread each), ``solve_options``.
    """

    def __init__(self, settings: dict[str, Any]):
        import torch

        from optw.catalog import open_catalog

        torch.set_num_threads(1)
        catalog = open_catalog(settings.get("catalog"))
        catalog.region(catalog.list_regions()[0])  # read the node table now, not on a request
        self.models = RegistryModels(settings.get("tracking_uri"),
                                     settings.get("check_interval", DEFAULT_CHECK_INTERVAL))
        self.planner = Planner(catalog, self.models,
                               solve_options=settings.get("solve_options"))
        self.solve_slots = asyncio.Semaphore(int(settings.get("solve_threads", 1)))
        self.started = time.time()

    @app.post("/plan")
    async def plan(self, request: Request) -> JSONResponse:
        """An itinerary for one tourist (see ``docs/planner.md`` for the body)."""
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
        async with self.solve_slots:
            try:
                answer = await asyncio.to_thread(self.planner.solve, req)
            except PlanError:
                raise
            except Exception as exc:  # a bug or a broken model: say so, keep serving
                log.exception("planning failed for region %s", req.region.id)
                raise PlanError(500, None, f"internal error while planning: "
                                f"{type(exc).__name__}: {exc}") from exc
        return JSONResponse(answer)

    @app.get("/regions")
    async def regions(self) -> list[dict[str, Any]]:
        """Every region with its number of points, benchmark start/times and day."""
        return self.planner.regions()

    @app.get("/regions/{region_id}")
    async def region(self, region_id: str) -> dict[str, Any]:
        """One region with all its points."""
        return self.planner.region(region_id)

    @app.get("/healthz")
    async def healthz(self) -> dict[str, Any]:
        """Liveness: regions known, models cached (region -> version), uptime."""
        return {"status": "ok", "regions": len(self.planner.catalog),
                "models": self.models.loaded(), "tracking_uri": self.models.uri,
                "uptime_s": round(time.time() - self.started, 1), "pid": os.getpid()}

    def __del__(self) -> None:
        models = getattr(self, "models", None)
        if models is not None:
            models.close()


def build_app(catalog: str | Path | None = None, tracking_uri: str | None = None, *,
              check_interval: float = DEFAULT_CHECK_INTERVAL, num_replicas: int = 1,
              num_cpus: float = 0.5, solve_threads: int = 1,
              solve_options: dict[str, Any] | None = None) -> serve.Application:
    """The bound Serve application. The tracking URI and catalog folder are resolved here, in
    the caller's process, and handed to the replicas explicitly."""
    from optw.catalog import default_catalog_dir
    from optw.tracking import tracking_uri as resolve_uri

    settings = {
        "catalog": str(Path(catalog).resolve()) if catalog else str(default_catalog_dir()),
        "tracking_uri": resolve_uri(tracking_uri),
        "check_interval": float(check_interval),
        "solve_threads": int(solve_threads),
        "solve_options": dict(solve_options or {}),
    }
    return PlannerDeployment.options(
        num_replicas=num_replicas, ray_actor_options={"num_cpus": num_cpus},
    ).bind(settings)


_started_ray = False


def start_planner(host: str = "127.0.0.1", port: int = 8000, blocking: bool = False, *,
                  catalog: str | Path | None = None, tracking_uri: str | None = None,
                  check_interval: float = DEFAULT_CHECK_INTERVAL, num_replicas: int = 1,
                  num_cpus: float = 0.5, solve_threads: int = 1,
                  solve_options: dict[str, Any] | None = None, ray_address: str = "local",
                  ray_cpus: int | None = None, ready_timeout: float = 60.0) -> str:
    """Deploy the planner on Ray Serve at ``http://host:port`` and return that URL.

    Starts a local Ray (``ray_address="local"``; ``"auto"`` joins a running cluster) unless
    Ray is already initialised in this process. ``blocking`` serves until Ctrl-C, then shuts
    down. The registry (``tracking_uri``, default ``$MLFLOW_TRACKING_URI`` or the project's
    sqlite store) and the catalog folder are passed to the replicas explicitly.
    """
    global _started_ray
    import ray

    if not ray.is_initialized():
        ray.init(address=ray_address, include_dashboard=False, num_cpus=ray_cpus,
                 log_to_driver=False, configure_logging=False)
        _started_ray = True
    serve.start(http_options={"host": host, "port": port})
    serve.run(build_app(catalog, tracking_uri, check_interval=check_interval,
                        num_replicas=num_replicas, num_cpus=num_cpus,
                        solve_threads=solve_threads, solve_options=solve_options),
              name=APP_NAME, route_prefix="/")
    url = f"http://{host}:{port}"
    _wait_ready(url, ready_timeout)
    if blocking:
        print(f"trip planner listening on {url} (Ctrl-C stops it)", flush=True)
        _stop_on_signals()
        try:
            while True:
                time.sleep(1.0)
        except KeyboardInterrupt:
            print("stopping the trip planner", flush=True)
        finally:
            stop_planner()
    return url


def _stop_on_signals() -> None:
    """SIGINT and SIGTERM end a blocking planner cleanly (also when started in the background,
    where SIGINT would otherwise be ignored)."""
    if threading.current_thread() is not threading.main_thread():
        return

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)


def _wait_ready(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=5) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError) as exc:
            last = exc
        time.sleep(0.2)
    raise RuntimeError(f"the planner did not answer {url}/healthz within {timeout:g} s ({last})")


def stop_planner() -> None:
    """Shut Serve down, and Ray too when :func:`start_planner` started it."""
    global _started_ray
    import ray

    if ray.is_initialized():
        serve.shutdown()
        if _started_ray:
            ray.shutdown()
            _started_ray = False
