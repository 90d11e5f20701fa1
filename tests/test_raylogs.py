"""The one filter of Ray's lines (optw.raylogs): one pattern list for jobs, sweeps and `optw
serve`; Ray Train's transient AutoscalingCoordinator time-outs kept off the console (their
tracebacks reach `PROFILE=smoke make run`'s output on a busy 2-core machine otherwise); a
driver stopped by SIGTERM exits as on Ctrl-C, without Ray's C++ stack dump."""

from __future__ import annotations

import io
import logging
import os
import signal
import subprocess
import sys
import time

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


#: Ray's lines that reached `optw job run`'s and `optw tune`'s terminal, as Ray 2.60 prints them.
DRIVER_NOISE = (
    "2026-01-01 10:00:00,000\tWARNING authentication_token_setup.py:85 -- Token authentication "
    "is enabled for this Ray cluster. Set RAY_AUTH_MODE=disabled to opt out.",
    "\x1b[36m(PlacementGroupCleaner pid=4242)\x1b[0m Detected that the Ray Train controller "
    "actor (abc123) is dead. Cleaning up placement group = [pg] created by this run.",
    "\x1b[36m(RayTrainWorker pid=77)\x1b[0m Traceback (most recent call last):",
    "\x1b[36m(RayTrainWorker pid=77)\x1b[0m RuntimeError: [enforce fail at alloc_cpu.cpp:127]",
    "[2026-01-01 10:00:00,000 E 1 2] logging.cc:474:     @     0x7fb38525a050  (unknown)",
    "*** SIGTERM received at time=1764300000 on cpu 1 ***",
    "PC: @     0x7f29e9c0e7d8  (unknown)  clock_nanosleep",
)


def test_drivers_drop_rays_token_notice_cleaner_lines_worker_tracebacks_and_stack_dumps(
        monkeypatch, capsys):
    """What `optw job run` and `optw tune` show (quiet_ray_output: stdout, stderr and Ray's
    loggers): Ray's token notice (a WARNING record of Ray's), the placement-group cleaner's
    line after a finished trial, a Ray Train worker's traceback and C++ stack dumps are
    dropped; the job's own lines and Ray's other warnings pass. A worker's lines come back
    with OPTW_RAY_TRAIN_LOG_LEVEL=INFO."""
    monkeypatch.delenv(raylogs.TRAIN_LOG_LEVEL_ENV[0], raising=False)
    keep = raylogs.RayLogFilter()
    assert not any(keep.keep(line) for line in DRIVER_NOISE)
    token = logging.LogRecord("ray._private.authentication.authentication_token_setup",
                              logging.WARNING, __file__, 85, DRIVER_NOISE[0].split("-- ")[1],
                              None, None)
    other = logging.LogRecord("ray.train", logging.WARNING, __file__, 1,
                              "Ray Train: a worker died", None, None)
    assert not keep.filter(token) and keep.filter(other)
    assert raylogs.RayLogFilter("INFO").keep(DRIVER_NOISE[2])
    with raylogs.quiet_ray_output():
        for line in DRIVER_NOISE:
            print(line, file=sys.stderr)
            print(line)
        print("job x: 1 model(s) trained", file=sys.stderr)
        print("trial 1/2: gap to ILS 3.10% at epoch 4 (lr=0.001)")
        logging.getLogger("ray._private.authentication.authentication_token_setup").warning(
            token.getMessage())
    out, err = capsys.readouterr()
    assert out == "trial 1/2: gap to ILS 3.10% at epoch 4 (lr=0.001)\n"
    assert err == "job x: 1 model(s) trained\n"


def test_a_driver_stopped_by_sigterm_exits_as_on_ctrl_c():
    """A driver connected to a local Ray (optw.distributed.rayenv.connect, as `optw job run`
    and `optw tune` connect) and stopped by SIGTERM ends as on Ctrl-C: a KeyboardInterrupt, so
    the command's clean-up runs and `optw` exits 130, and no stack dump of Ray's C++ core
    (`logging.cc: @ 0x... (unknown)`) is printed."""
    code = """if True:
        import time
        from optw.distributed.rayenv import connect
        connect("local")
        print("ready", flush=True)
        try:
            time.sleep(300)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            raise SystemExit(130)
    """
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a Ray of its own
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline() == "ready\n", proc.stderr.read()
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and out == "interrupted\n", (proc.returncode, out, err)
    assert "(unknown)" not in err and "SIGTERM received" not in err, err


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
