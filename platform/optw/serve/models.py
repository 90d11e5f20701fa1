"""The planner's model cache: one checkpoint for every region (``optw plan --checkpoint``) or
each region's registry champion, reloaded when the ``champion`` alias moves.

Registry calls (the alias lookup, the download and load of a new version) run in a small thread
pool, at most one per region at a time, and a request waits for one at most ``timeout`` seconds:
then it is served with the cached model, or answered 503 when there is none. So a registry that
is down or hangs never holds a request longer than that.

MLflow and torch are imported when a model is first loaded.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import threading
import time
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
    query); when it points at another version, that version is loaded and replaces the cached
    one. While one request waits for that check, others keep solving with the previous model.
    If the registry cannot be reached, a cached model keeps serving. A request waits for the
    registry at most ``timeout`` seconds: then it gets the cached model, or a 503
    :class:`PlanError` when the region has none yet (the lookup goes on in the background, and
    its result serves the next request).
    """

    def __init__(self, uri: str | None = None, check_interval: float = DEFAULT_CHECK_INTERVAL,
                 *, timeout: float = DEFAULT_REGISTRY_TIMEOUT, workers: int = 4):
        from optw.tracking import tracking_uri

        self.uri = tracking_uri(uri)
        self.check_interval = float(check_interval)
        self.timeout = float(timeout)
        self._entries: dict[str, _Entry] = {}
        self._guard = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="optw-registry")

    def _entry(self, region_id: str) -> _Entry:
        with self._guard:
            return self._entries.setdefault(region_id, _Entry())

    def _fresh(self, e: _Entry) -> bool:
        return e.current is not None and time.monotonic() - e.checked < self.check_interval

    def get(self, region_id: str) -> LoadedModel:
        e = self._entry(region_id)
        current = e.current
        if self._fresh(e) and current is not None:
            return current
        with e.lock:
            if self._fresh(e) and e.current is not None:
                return e.current
            started = e.pending is None or e.pending.done()
            if started:
                e.pending = self._pool.submit(self._refresh, region_id, e)
            pending = e.pending
            current = e.current
        if current is not None and not started:
            return current  # another request is checking or reloading: use the cached model
        try:
            return pending.result(timeout=self.timeout)
        except concurrent.futures.TimeoutError:
            if current is not None:
                log.warning("registry %s did not answer within %g s; serving cached %s "
                            "version %s", self.uri, self.timeout, region_id, current.version)
                return current
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
                e.checked = time.monotonic()
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
                    e.checked = time.monotonic()
                    return e.current
                raise PlanError(503, "region", f"region: cannot load {name} "
                                f"({type(exc).__name__}: {_short(exc)})") from exc
            e.current = LoadedModel(solver.model, solver.version, name)
            log.info("loaded %s version %s in %.2f s", name, solver.version,
                     time.perf_counter() - t0)
        e.checked = time.monotonic()
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
