"""The planner's model cache: one checkpoint for every region (``optw plan --checkpoint``) or
each region's registry champion, reloaded when the ``champion`` alias moves.

Registry calls (the alias lookup, the download and load of a new version) run in a small thread
pool, at most one per region at a time. A region with a cached model is served with it at once,
never waiting for a lookup (the lookup runs in the background and its result serves later
requests); only a region without one waits, at most ``timeout`` seconds, then gets 503. So a
registry that is down or hangs never holds a request of a cached region at all.

MLflow and torch are imported when a model is first loaded.
"""

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

from optw.serve.errors import PlanError
from optw.serve.settings import DEFAULT_CHECK_INTERVAL, DEFAULT_REGISTRY_TIMEOUT

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_CHECK_INTERVAL", "DEFAULT_REGISTRY_TIMEOUT", "CheckpointModels",
           "LoadedModel", "ModelProvider", "RegistryModels"]


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

        self.path = Path(path)
        self._loaded = LoadedModel(load_model(self.path), None, str(self.path))

    def get(self, region_id: str) -> LoadedModel:
        return self._loaded


@dataclass
class _Entry:
    current: LoadedModel | None = None
    checked: float = -math.inf
    pending: concurrent.futures.Future | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


class RegistryModels:
    """Each region's ``models:/optw-<region>@champion``, cached per region.

    The alias is looked up again at most every ``check_interval`` seconds (one cheap registry
    query, in the background); when it points at another version, that version is loaded
    (in the background too) and replaces the cached one. Requests never wait for that check:
    they solve with the cached model. If the registry cannot be reached, a cached model keeps
    serving. A region without a cached model waits for the registry at most ``timeout``
    seconds, then gets a 503 :class:`PlanError` (the lookup goes on in the background, and its
    result serves the next request). ``clock``: the time source of the check interval.
    """

    def __init__(self, uri: str | None = None, check_interval: float = DEFAULT_CHECK_INTERVAL,
                 *, timeout: float = DEFAULT_REGISTRY_TIMEOUT, workers: int = 4,
                 clock: Callable[[], float] = time.monotonic):
        from optw.tracking import tracking_uri

        self.uri = tracking_uri(uri)
        self.check_interval = float(check_interval)
        self.timeout = float(timeout)
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self._guard = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="optw-registry")

    def _entry(self, region_id: str) -> _Entry:
        with self._guard:
            return self._entries.setdefault(region_id, _Entry())

    def _fresh(self, e: _Entry) -> bool:
        return e.current is not None and self._clock() - e.checked < self.check_interval

    def get(self, region_id: str) -> LoadedModel:
        """The region's model. A cached model is returned at once, whatever the registry does:
        when its check is due, the lookup (and the load of a new champion) starts in the
        background and serves later requests. Only a region without a cached model waits for
        the registry, at most ``timeout`` seconds (then 503)."""
        e = self._entry(region_id)
        current = e.current
        if current is not None and self._fresh(e):
            return current
        with e.lock:
            if (e.current is None or not self._fresh(e)) and (
                    e.pending is None or e.pending.done()):
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
            if e.current is not None:
                log.warning("registry %s unreachable (%s); serving cached %s version %s",
                            self.uri, exc, region_id, e.current.version)
                e.checked = self._clock()
                return e.current
            raise PlanError(503, "region", f"region: the model registry {self.uri} is "
                            f"unavailable ({type(exc).__name__}: {_short(exc)})") from exc
        if info is None:
            e.current = None
            raise PlanError(409, "region", f"region: {region_id} has no champion model yet "
                            f"({name} does not exist); train and register one first")
        if e.current is None or e.current.version != info.version:
            t0 = time.perf_counter()
            try:
                solver = load_solver(name, uri=self.uri)  # into memory; no download left
            except Exception as exc:
                if e.current is not None:
                    log.error("cannot load %s (%s); keeping version %s", name, exc,
                              e.current.version)
                    e.checked = self._clock()
                    return e.current
                raise PlanError(503, "region", f"region: cannot load {name} "
                                f"({type(exc).__name__}: {_short(exc)})") from exc
            e.current = LoadedModel(solver.model, solver.version, name)
            log.info("loaded %s version %s in %.2f s", name, solver.version,
                     time.perf_counter() - t0)
        e.checked = self._clock()
        assert e.current is not None
        return e.current

    def loaded(self) -> dict[str, int | None]:
        """Region -> cached model version."""
        with self._guard:
            return {r: e.current.version for r, e in self._entries.items() if e.current}

    def close(self) -> None:
        """Stop the lookup threads (a lookup in flight ends on MLflow's own HTTP timeout)."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def _short(exc: Exception, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[:limit] + "..."
