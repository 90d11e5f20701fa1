"""``optw serve``'s terminal: the planner's own lines, not Ray's internals.

Starting and stopping Serve prints lines meant for Ray's developers: ``[mutex.cc : 452] RAW:
Lock blocking`` (C++, at shutdown), ``Task ServeController.graceful_shutdown failed ...
infinite retries`` (the raylet, through the driver), ``Connecting to existing Serve app ...
will not be applied`` (Serve's INFO log) and Ray's token-authentication notice.
:func:`filter_ray_noise` drops exactly those: Serve's logger goes to WARNING, and the process's
stdout and stderr file descriptors go through a small filter process that drops the lines
matching :data:`RAY_NOISE` (so C++ output and output at exit are filtered too) and passes
everything else on unchanged. Only ``optw serve`` calls it, once its settings are checked.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys

#: Lines of Ray's internals that reach the terminal when Serve starts or stops.
RAY_NOISE = re.compile(r"\[mutex\.cc : \d+\] RAW: "
                       r"|ServeController\.graceful_shutdown"
                       r"|Connecting to existing Serve app"
                       r"|Token authentication is enabled for this Ray cluster")

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
    now on (see the module docstring); returns the filter processes, which end when this
    process closes its output (at exit)."""
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
