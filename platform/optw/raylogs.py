"""The one filter of Ray's lines: :data:`RAY_NOISE` (Ray internals nobody has to act on) is
dropped wherever Ray's output shows; other warnings and errors always pass."""

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

#: Lines of Ray's internals dropped from every output the project shows.
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
#: A Ray Train worker's lines: dropped unless :func:`train_log_level` is below WARNING.
RAY_TRAIN_WORKER = re.compile(r"\(RayTrainWorker pid=\d+")
#: Ray's own INFO/DEBUG log lines (dropped by :class:`RayLogFilter`, not by ``optw serve``).
RAY_INFO = re.compile(r"^\d{4}-\d\d-\d\d [\d:,]+\s+(INFO|DEBUG) \w+\.py:\d+ -- ")
#: The variable and default of Ray Train's console log level in the job.
TRAIN_LOG_LEVEL_ENV = ("OPTW_RAY_TRAIN_LOG_LEVEL", "WARNING")


def train_log_level() -> str:
    """``$OPTW_RAY_TRAIN_LOG_LEVEL`` when it is a level's name, else WARNING."""
    level = os.environ.get(TRAIN_LOG_LEVEL_ENV[0], "").strip().upper()
    return level if level in logging.getLevelNamesMapping() else TRAIN_LOG_LEVEL_ENV[1]


class RayLogFilter(logging.Filter):
    """Keeps a line or a log record unless it is :data:`RAY_NOISE`, or below WARNING
    :data:`RAY_INFO`, a Ray Train worker's line or a Ray Train record below ``train_level``."""

    def __init__(self, train_level: str | None = None):
        super().__init__()
        self.train_level = logging.getLevelNamesMapping()[train_level or train_log_level()]

    def keep(self, line: str) -> bool:
        if RAY_NOISE.search(line) or RAY_INFO.search(line):
            return False
        return self.train_level < logging.WARNING or not RAY_TRAIN_WORKER.search(line)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if record.levelno >= logging.WARNING:
            return not RAY_NOISE.search(message)
        # Ray Train logs its reports from loggers named by their file's path
        train = "/ray/train/" in record.name.replace(os.sep, "/")
        return not (train and record.levelno < self.train_level) and self.keep(message)


#: Ray Train's logger of its requests to Ray's AutoscalingCoordinator (in the controller).
AUTOSCALING_CLIENT_LOGGER = ("ray.train.v2._internal.execution.scaling_policy."
                             "autoscaling_coordinator_client")


class TransientRayTimeouts(logging.Filter):
    """Drops the AutoscalingCoordinator's transient ``GetTimeoutError`` (sent again later)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return exc is None or not any(c.__name__ == "GetTimeoutError"
                                      for c in type(exc).__mro__)


def _add_once(holder: logging.Filterer, kind: type[logging.Filter]) -> None:
    if not any(isinstance(f, kind) for f in holder.filters):
        holder.addFilter(kind())


def quiet_ray_internals() -> None:
    """In a job's worker processes: :class:`TransientRayTimeouts` on the autoscaling client."""
    _add_once(logging.getLogger(AUTOSCALING_CLIENT_LOGGER), TransientRayTimeouts)


class DropLines:
    """A text stream passing ``stream`` the lines :meth:`RayLogFilter.keep` keeps."""

    def __init__(self, stream: TextIO):
        self._stream, self._filter = stream, RayLogFilter()
        self._partial, self._lock = "", threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            *lines, self._partial = (self._partial + text).split("\n")
            if kept := "".join(f"{line}\n" for line in lines if self._filter.keep(line)):
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
    """Ray's Python loggers at WARNING, :class:`RayLogFilter` on them and their handlers."""
    names = [n for n in logging.root.manager.loggerDict if n.split(".")[0] == "ray"]
    for name in {*names, "ray", "ray.train", "ray.tune", "ray.data"}:
        logger = logging.getLogger(name)
        logger.setLevel(logging.WARNING)
        for holder in (logger, *logger.handlers):
            _add_once(holder, RayLogFilter)


@contextlib.contextmanager
def quiet_ray_output() -> Iterator[None]:
    """In a driver, for the block: stdout and stderr through :class:`DropLines`, Ray at WARNING."""
    quiet_ray_loggers()
    before = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = DropLines(before[0]), DropLines(before[1])
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        sys.stdout, sys.stderr = before


def quiet_train_worker() -> None:
    """In a Ray Train worker: the console handlers get a :class:`RayLogFilter`."""
    for handler in logging.getLogger().handlers:
        if (isinstance(handler, logging.StreamHandler)
                and not isinstance(handler, logging.FileHandler)):
            _add_once(handler, RayLogFilter)


_FILTER = """
import re, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the planner, which then closes us
noise, out = re.compile(sys.argv[1]), sys.stdout.buffer
for line in sys.stdin.buffer:
    if not noise.search(line.decode("utf-8", "replace")):
        out.write(line)
        out.flush()
"""


def filter_ray_noise() -> list[subprocess.Popen]:
    """Filter processes dropping :data:`RAY_NOISE` from this process's stdout and stderr."""
    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    procs = []
    for fd in (1, 2):
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        target = os.dup(fd)
        read, write = os.pipe()
        try:
            procs.append(subprocess.Popen([sys.executable, "-c", _FILTER, RAY_NOISE.pattern],
                                          stdin=read, stdout=target, stderr=subprocess.DEVNULL))
        finally:
            os.close(read)
            os.close(target)
        os.dup2(write, fd)
        os.close(write)
    return procs
