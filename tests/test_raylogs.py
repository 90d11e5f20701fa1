"""The one filter of Ray's lines (optw.raylogs): one pattern list for jobs and `optw serve`,
and Ray Train's transient AutoscalingCoordinator time-outs kept off the console (issue 25,
`PROFILE=smoke make run` printed their tracebacks on a busy 2-core machine)."""

from __future__ import annotations

import io
import logging

from ray.exceptions import GetTimeoutError

from conftest import local_ray
from optw import raylogs
from optw.distributed.rayenv import RUNTIME_ENV


def _record(exc: BaseException | None) -> logging.LogRecord:
    info = (type(exc), exc, None) if exc is not None else None
    return logging.LogRecord(raylogs.AUTOSCALING_CLIENT_LOGGER, logging.WARNING, __file__, 1,
                             "Failed to send resource request for train-x.", None, info)


def test_one_pattern_list_serves_jobs_and_serve():
    """Every line either filter dropped before (the driver's raylet warning, the follower's
    entrypoint line, Serve's start/stop lines, the token notice) matches RAY_NOISE; Ray's own
    INFO lines are dropped from a job's output but are not in `optw serve`'s list."""
    for line in ("(raylet) WARNING: 8 PYTHON worker processes have been started on node: x",
                 "Running entrypoint for job raysubmit_1: python x.py",
                 "[2026-01-01 00:00:00,000 E 1 2] [mutex.cc : 452] RAW: Lock blocking",
                 "(raylet) Task ServeController.graceful_shutdown failed. infinite retries",
                 'Connecting to existing Serve app in namespace "serve".',
                 "Token authentication is enabled for this Ray cluster. Set RAY"):
        assert raylogs.RAY_NOISE.search(line), line
    info = "2026-01-01 00:00:00,000\tINFO job_manager.py:12 -- Submitting job"
    assert not raylogs.RAY_NOISE.search(info) and not raylogs.RayLogFilter().keep(info)
    sink = io.StringIO()
    out = raylogs.DropLines(sink)
    print("job x: mode scratch", file=out)
    print("(raylet) A worker died or was killed while executing a task", file=out)
    out.flush()
    assert sink.getvalue().splitlines() == [
        "job x: mode scratch", "(raylet) A worker died or was killed while executing a task"]


def test_transient_coordinator_timeouts_are_dropped():
    """quiet_ray_internals puts TransientRayTimeouts on Ray Train's AutoscalingCoordinator
    client logger, once: a record whose error is GetTimeoutError is dropped; the same warning
    with another error, or none, still shows."""
    logger = logging.getLogger(raylogs.AUTOSCALING_CLIENT_LOGGER)
    before = list(logger.filters)
    try:
        raylogs.quiet_ray_internals()
        raylogs.quiet_ray_internals()
        added = [f for f in logger.filters if isinstance(f, raylogs.TransientRayTimeouts)]
        assert len(added) == 1
        assert not logger.filter(_record(GetTimeoutError("Get timed out")))
        assert logger.filter(_record(RuntimeError("The actor died unexpectedly")))
        assert logger.filter(_record(None))
    finally:
        logger.filters[:] = before


def test_the_hook_runs_in_a_jobs_actor_process():
    """On a real local Ray started as the product starts one, an actor process of the job (as
    Ray Train's controller is) has the filter installed by the job's worker setup hook
    (RUNTIME_ENV; it must not run outside a worker: it would start a Ray of its own). The hook
    imports nothing heavy: every worker process runs it (once it imported torch through
    optw.distributed, seconds of CPU per process), and the process runs at nice 0, not Ray's 15
    (RAY_ENV), with Ray Train's controller polling every 0.5 s, not 2 s (a worker's report
    waits for a poll: tiny runs spent most of their training time waiting)."""
    assert RUNTIME_ENV["worker_process_setup_hook"] == "optw.raylocal.setup_worker"
    with local_ray(num_cpus=1, object_store_mb=100) as ray:

        @ray.remote(num_cpus=0)
        class Probe:
            def filters(self) -> list[str]:
                logger = logging.getLogger(raylogs.AUTOSCALING_CLIENT_LOGGER)
                return [type(f).__name__ for f in logger.filters]

            def heavy(self) -> list[str]:
                import sys

                return [m for m in ("torch", "mlflow", "optw.distributed") if m in sys.modules]

            def niceness(self) -> int:
                import os

                return os.nice(0)

            def env(self, name: str) -> str | None:
                import os

                return os.environ.get(name)

        probe = Probe.remote()
        assert ray.get(probe.filters.remote(), timeout=120) == ["TransientRayTimeouts"]
        assert ray.get(probe.heavy.remote(), timeout=120) == []
        # Ray's default nice 15 starved the job's workers beside any other busy process
        assert ray.get(probe.niceness.remote(), timeout=120) == 0
        assert ray.get(probe.env.remote("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"),
                       timeout=120) == "0.5"
