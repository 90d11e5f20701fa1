"""How many torch threads to use: the cores this process may use now (torch's default, one per
core, is many times slower when other work keeps the cores busy)."""

from __future__ import annotations

import math
import os
import sys
import time

from optw.errors import UserError

MAX_THREADS = 256  # the largest explicit thread count (``--threads``)


def granted_cpus() -> int:
    """The cores this process may use: its affinity, cgroup quota, Ray grant or OMP_NUM_THREADS."""
    omp = os.environ.get("OMP_NUM_THREADS", "").strip()
    limits = [len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
              else (os.cpu_count() or 1), _cgroup_cpus(), _ray_grant(),
              int(omp) if omp.isascii() and omp.isdigit() else None]
    return max(1, min(n for n in limits if n))


def default_threads() -> int:
    """The granted cores less those other processes keep busy (by the load average), >= 1."""
    cpus = granted_cpus()
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):  # no load average on this platform
        return cpus
    own = min(load, time.process_time() / max(60.0, _age_s()))
    busy = max(0.0, load - own) * min(1.0, cpus / (os.cpu_count() or cpus))
    return max(1, min(cpus, math.floor(cpus - busy + 0.5)))


def check_threads(value: object, name: str = "threads") -> int:
    """An explicit thread count in 1..:data:`MAX_THREADS`, else a UserError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_THREADS:
        raise UserError(f"{name}: expected a number of threads in 1..{MAX_THREADS}, got "
                         f"{value!r}")
    return value


def set_torch_threads(threads: int | None = None) -> int:
    """Set torch's threads to ``threads`` (checked; default :func:`default_threads`); returns it."""
    import torch

    n = default_threads() if threads is None else check_threads(threads)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n


_IMPORTED = time.monotonic()  # the process's age where /proc does not tell it


def _age_s() -> float:
    """Seconds since this process started (/proc), else since this module was imported."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.monotonic() - _IMPORTED


def _cgroup_cpus() -> int | None:
    """CPUs of the cgroup v2 quota (``cpu.max``), rounded up; None without a quota."""
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        return max(1, math.ceil(int(quota) / int(period)))  # "max": no quota, a ValueError
    except (OSError, ValueError):
        return None


def _ray_grant() -> int | None:
    """CPUs Ray granted the current task or actor (None outside a Ray worker)."""
    ray = sys.modules.get("ray")
    try:
        ctx = ray.get_runtime_context() if ray is not None and ray.is_initialized() else None
        if ctx is None or ctx.worker.mode != ray.WORKER_MODE:  # the driver: no grant
            return None
        cpus = ctx.get_assigned_resources().get("CPU")
    except Exception:  # an old or partial Ray: no grant known
        return None
    return None if not cpus else max(1, math.ceil(cpus))
