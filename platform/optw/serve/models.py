"""The planner's models: one checkpoint for every region, or each region's registry champion,
reloaded when the ``champion`` alias moves. MLflow and torch are imported on first load."""

from __future__ import annotations

import concurrent.futures
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from optw.checks import echoed
from optw.serve.errors import PlanError
from optw.serve.settings import DEFAULT_CHECK_INTERVAL, DEFAULT_REGISTRY_TIMEOUT

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedModel:
    """A model ready to solve, with where it came from."""

    model: Any
    version: int | None
    source: str


class ModelProvider(Protocol):
    def get(self, region_id: str) -> LoadedModel: ...


class CheckpointModels:
    """One checkpoint file for every region (``optw plan --checkpoint``)."""

    def __init__(self, path: str | Path):
        from optw.model import load_model

        path = Path(path)
        self._loaded = LoadedModel(load_model(path), None, str(path))

    def get(self, region_id: str) -> LoadedModel:
        return self._loaded


@dataclass
class _Entry:
    current: LoadedModel | None = None
    checked: float = -math.inf
    pending: concurrent.futures.Future | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


class RegistryModels:
    """Each region's ``models:/optw-<region>@champion``, cached. Registry calls run in a thread
    pool, one per region at a time; the alias is rechecked at most every ``check_interval``
    seconds (``clock``), in the background. A cached model serves at once; a region without one
    waits at most ``timeout`` seconds, then gets a 503 (the lookup goes on for the next)."""

    def __init__(self, uri: str | None = None, check_interval: float = DEFAULT_CHECK_INTERVAL,
                 *, timeout: float = DEFAULT_REGISTRY_TIMEOUT,
                 clock: Callable[[], float] = time.monotonic):
        from optw.tracking import tracking_uri

        self.uri = tracking_uri(uri)
        self.check_interval = float(check_interval)
        self.timeout = float(timeout)
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self._guard = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=4, thread_name_prefix="optw-registry")

    def get(self, region_id: str) -> LoadedModel:
        """The region's model (see the class docstring)."""
        with self._guard:
            e = self._entries.setdefault(region_id, _Entry())
        with e.lock:
            fresh = e.current is not None and self._clock() - e.checked < self.check_interval
            if not fresh and (e.pending is None or e.pending.done()):
                e.pending = self._pool.submit(self._refresh, region_id, e)
            pending, current = e.pending, e.current
        if current is not None:
            return current  # never wait for the registry while a model is cached
        try:
            return pending.result(timeout=self.timeout)
        except concurrent.futures.TimeoutError:
            raise PlanError(503, "region", f"region: the model registry {self.uri} did not "
                            f"answer within {self.timeout:g} s (unreachable, or still loading "
                            f"the model of {region_id}); try again") from None

    def _refresh(self, region_id: str, e: _Entry) -> LoadedModel:
        from optw.tracking import CHAMPION, champion, load_solver, model_name

        name = f"models:/{model_name(region_id)}@{CHAMPION}"
        try:
            info = champion(region_id, uri=self.uri)
        except Exception as exc:
            return self._cached(e, exc, f"the model registry {self.uri} is unavailable")
        if info is None:
            e.current = None
            raise PlanError(409, "region", f"region: {region_id} has no champion model yet "
                            f"({name} does not exist); train and register one first")
        if e.current is None or e.current.version != info.version:
            t0 = time.perf_counter()
            try:
                solver = load_solver(name, uri=self.uri)  # into memory; no download left
            except Exception as exc:
                return self._cached(e, exc, f"cannot load {name}")
            e.current = LoadedModel(solver.model, solver.version, name)
            log.info("loaded %s version %s in %.2f s", name, solver.version,
                     time.perf_counter() - t0)
        e.checked = self._clock()
        return e.current

    def _cached(self, e: _Entry, exc: Exception, failure: str) -> LoadedModel:
        """After a failed registry call: the cached model (the failure logged), else a 503."""
        if e.current is None:
            detail = echoed(" ".join(str(exc).split()), 300)
            raise PlanError(503, "region", f"region: {failure} ({type(exc).__name__}: "
                            f"{detail})") from exc
        log.warning("%s (%s); serving the cached version %s", failure, exc, e.current.version)
        e.checked = self._clock()
        return e.current

    def loaded(self) -> dict[str, int | None]:
        """Region -> cached model version."""
        with self._guard:
            return {r: e.current.version for r, e in self._entries.items() if e.current}

    def close(self) -> None:
        """Stop the lookup threads (a lookup in flight ends on MLflow's own HTTP timeout)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
