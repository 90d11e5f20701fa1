"""The one filter of Ray's lines: what of Ray's internals reaches a terminal.

Ray prints lines nobody has to act on into a driver's output, its loggers' console handlers
and, from C++ and at exit, straight to the file descriptors. :data:`RAY_NOISE` names them once
and every place the project shows Ray's output drops them (Ray's log folder,
``/tmp/ray/session_latest/logs``, keeps them all):

- in a driver (``optw job run``, ``optw tune``, ``jobs/train_all.py``, ``jobs/tune.py``):
  :func:`quiet_ray_output` wraps stdout and stderr in :class:`DropLines` and puts
  :class:`RayLogFilter` on Ray's loggers. Dropped: the raylet's "N PYTHON worker processes
  have been started" warning, Ray's token notice, Ray Train's placement-group cleaner's "Detected
  that the Ray Train controller actor ... is dead" (a finished Tune trial's), and every line of
  a Ray Train worker (``(RayTrainWorker pid=...)``: a failed worker's traceback; the job names
  the failure in one line, and ``$OPTW_RAY_TRAIN_LOG_LEVEL=INFO`` brings these lines back);
- in ``jobs/embedded.sh``'s follower (:mod:`optw.distributed.follow`): also the job manager's
  own INFO/DEBUG lines (:data:`RAY_INFO`) and "Running entrypoint for job";
- in a Ray Train worker (:func:`quiet_train_worker`): Ray Train's records below
  ``$OPTW_RAY_TRAIN_LOG_LEVEL`` (default WARNING). Ray Train 2.60 logs every report from a
  logger named by its file's path, outside ``ray.train``, so RunConfig's log level misses it;
- in ``optw serve`` (:func:`filter_ray_noise`): Serve's start/stop lines (``[mutex.cc : 452]
  RAW: Lock blocking`` from C++ at shutdown, ``Task ServeController.graceful_shutdown failed
  ... infinite retries``, ``Connecting to existing Serve app ... will not be applied``) and
  C++ stack dumps (``logging.cc: @ 0x... (unknown)``), through a small filter process on the
  stdout and stderr file descriptors, so C++ output and output at exit are filtered too;
- in every worker process of a job (:func:`quiet_ray_internals`, from the job's
  ``worker_process_setup_hook``): Ray Train's controller warns, with a traceback, "Failed to
  send resource request ... If this only happens transiently during network partition or CPU
  being overloaded, it's safe to ignore this error" when Ray's AutoscalingCoordinator actor
  (created on first use: a new worker process that imports Ray Data) does not answer within
  Ray's hard-coded 5 s; the request only informs an autoscaler, and Ray Train sends it again
  at its next scaling decision. :class:`TransientRayTimeouts` drops exactly those records
  whose error is a ``GetTimeoutError``; any other failure there still shows.

Tune's progress tables are not printed at all (``optw tune`` runs Tune with ``verbose=0`` and
prints a line per finished trial), and a driver stopped by SIGTERM exits as on Ctrl-C, without
Ray's C++ stack dump (:func:`optw.raylocal.interrupt_on_signals`).

Warnings and errors always pass (other than those lines and records). A low layer (no
``optw`` imports): ``distributed`` and ``serve`` both use it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import TextIO

#: Lines of Ray's internals dropped from every output the project shows (a driver's stdout
#: and stderr, the follower, a Ray Train worker's console, ``optw serve``'s terminal).
RAY_NOISE = re.compile(
    r"\(raylet\).*PYTHON worker processes have been started on node"
    r"|^Running entrypoint for job "
    r"|\[mutex\.cc : \d+\] RAW: "
    r"|ServeController\.graceful_shutdown"
    r"|Connecting to existing Serve app"
    r"|Token authentication is enabled for this Ray cluster"
    r"|\(PlacementGroupCleaner pid=\d+[^)]*\).*Detected that the Ray Train controller actor"
    r"|logging\.cc:\d+: +(@ +0x[0-9a-f]+|\*\*\* SIG\w+ received)"
    r"|^\s*(PC: )?@ +0x[0-9a-f]+ .*\(unknown\)"
    r"|^\*\*\* SIG\w+ received at time=")
#: A Ray Train worker's lines in a driver's output (its traceback when it fails): dropped
#: unless Ray Train's console level (:func:`train_log_level`) is below WARNING.
RAY_TRAIN_WORKER = re.compile(r"\(RayTrainWorker pid=\d+")
#: Ray's own INFO/DEBUG log lines (e.g. the job manager's in the follower): dropped by
#: :class:`RayLogFilter` as well; ``optw serve`` shows them (e.g. where the dashboard is).
RAY_INFO = re.compile(r"^\d{4}-\d\d-\d\d [\d:,]+\s+(INFO|DEBUG) \w+\.py:\d+ -- ")
#: Ray Train's console log level in the job (``RunConfig(logging_config=...)`` and the worker's
#: console handlers): its INFO lines (every report, checkpoint path and worker-group start)
#: stay in the session's log files; ``OPTW_RAY_TRAIN_LOG_LEVEL=INFO`` brings them back.
TRAIN_LOG_LEVEL_ENV = ("OPTW_RAY_TRAIN_LOG_LEVEL", "WARNING")


def train_log_level() -> str:
    level = os.environ.get(TRAIN_LOG_LEVEL_ENV[0], "").strip().upper()
    return level if level in logging.getLevelNamesMapping() else TRAIN_LOG_LEVEL_ENV[1]


class RayLogFilter(logging.Filter):
    """Keeps a line or a log record unless it is Ray's noise: a line matching
    :data:`RAY_NOISE` or :data:`RAY_INFO`, a Ray Train worker's line (:data:`RAY_TRAIN_WORKER`)
    or a Ray Train record below ``train_level``, a record whose message matches
    :data:`RAY_NOISE` at any level."""

    def __init__(self, train_level: str | None = None):
        super().__init__()
        self.train_level = logging.getLevelNamesMapping()[train_level or train_log_level()]

    def keep(self, line: str) -> bool:
        """Should this output line be shown?"""
        if RAY_NOISE.search(line) or RAY_INFO.search(line):
            return False
        return self.train_level < logging.WARNING or not RAY_TRAIN_WORKER.search(line)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if RAY_NOISE.search(message):
            return False
        if record.levelno >= logging.WARNING:
            return True
        train = "/ray/train/" in record.name.replace(os.sep, "/")
        if train and record.levelno < self.train_level:
            return False
        return self.keep(message)


#: Ray Train's logger of its requests to Ray's AutoscalingCoordinator (in the controller).
AUTOSCALING_CLIENT_LOGGER = ("ray.train.v2._internal.execution.scaling_policy."
                             "autoscaling_coordinator_client")


class TransientRayTimeouts(logging.Filter):
    """Drops a record whose error is Ray's ``GetTimeoutError`` (a call that did not answer in
    time on a busy machine and is made again later); keeps every other record."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return exc is None or not any(c.__name__ == "GetTimeoutError"
                                      for c in type(exc).__mro__)


def quiet_ray_internals() -> None:
    """In each worker process of a job: Ray Train's transient AutoscalingCoordinator
    time-outs stay off the console (:class:`TransientRayTimeouts`; see the module docstring)."""
    logger = logging.getLogger(AUTOSCALING_CLIENT_LOGGER)
    if not any(isinstance(f, TransientRayTimeouts) for f in logger.filters):
        logger.addFilter(TransientRayTimeouts())


class DropLines:
    """A text stream that passes every line to ``stream`` except those ``keep`` refuses (Ray
    prints each worker line with its own ``print``: whole lines, from several threads)."""

    def __init__(self, stream: TextIO, log_filter: RayLogFilter | None = None):
        self._stream, self._filter = stream, log_filter or RayLogFilter()
        self._partial, self._lock = "", threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            *lines, self._partial = (self._partial + text).split("\n")
            kept = "".join(f"{line}\n" for line in lines if self._filter.keep(line))
            if kept:
                self._stream.write(kept)
        return len(text)

    def flush(self) -> None:
        with self._lock:
            if self._partial and self._filter.keep(self._partial):
                self._stream.write(self._partial)
            self._partial = ""
            self._stream.flush()

    def __getattr__(self, name: str):  # encoding, isatty, fileno, ...
        return getattr(self._stream, name)


def quiet_ray_loggers() -> None:
    """Ray's Python loggers at WARNING (e.g. the job SDK's "WebSocket closed"), and the
    records of :data:`RAY_NOISE` dropped at any level (:class:`RayLogFilter` on the ``ray``
    logger's handlers and on Ray's loggers that exist now)."""
    names = [n for n in logging.root.manager.loggerDict if n.split(".")[0] == "ray"]
    for name in {*names, "ray", "ray.train", "ray.tune", "ray.data"}:
        logger = logging.getLogger(name)
        logger.setLevel(logging.WARNING)
        for holder in (logger, *logger.handlers):
            if not any(isinstance(f, RayLogFilter) for f in holder.filters):
                holder.addFilter(RayLogFilter())


@contextlib.contextmanager
def quiet_ray_output() -> Iterator[None]:
    """In a driver, for the block: stdout and stderr through :class:`DropLines` and Ray's
    loggers at WARNING (Ray's warnings and errors still show)."""
    quiet_ray_loggers()
    before = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = DropLines(before[0]), DropLines(before[1])
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        sys.stdout, sys.stderr = before


def quiet_train_worker(level: str | None = None) -> None:
    """In a Ray Train worker: the console handlers get a :class:`RayLogFilter`."""
    for handler in logging.getLogger().handlers:
        console = (isinstance(handler, logging.StreamHandler)
                   and not isinstance(handler, logging.FileHandler))
        if console and not any(isinstance(f, RayLogFilter) for f in handler.filters):
            handler.addFilter(RayLogFilter(level))


_FILTER = """
import re, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the planner, which then closes us
noise, out = re.compile(sys.argv[1]), sys.stdout.buffer
for line in sys.stdin.buffer:
    if not noise.search(line.decode("utf-8", "replace")):
        out.write(line)
        out.flush()
"""


def filter_ray_noise(fds: tuple[int, ...] = (1, 2)) -> list[subprocess.Popen]:
    """Drop Ray's internal lines (:data:`RAY_NOISE`) from this process's output ``fds`` from
    now on, written from Python or straight to the file descriptor, and put Serve's logger at
    WARNING (``optw serve`` calls it once its settings are checked); returns the filter
    processes, which end when this process closes its output (at exit)."""
    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    procs = []
    for fd in fds:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        target = os.dup(fd)
        read, write = os.pipe()
        try:
            procs.append(subprocess.Popen(
                [sys.executable, "-c", _FILTER, RAY_NOISE.pattern], stdin=read, stdout=target,
                stderr=subprocess.DEVNULL, close_fds=True))
        finally:
            os.close(read)
            os.close(target)
        os.dup2(write, fd)
        os.close(write)
    return procs
