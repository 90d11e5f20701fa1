"""glibc's mmap threshold raised to 1 GiB, so decoding's large short-lived tensors reuse heap
blocks instead of paying page faults for fresh pages at every step (docs/measurements.md);
not off glibc, with ``MALLOC_MMAP_THRESHOLD_`` set or with ``OPTW_MALLOC=0``."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import os
import sys

M_MMAP_THRESHOLD = -3  # glibc's ``mallopt`` parameter number of the mmap threshold
THRESHOLD = 1 << 30  # blocks up to this size come from the heap and are reused after free

_applied: bool | None = None


def reuse_large_blocks() -> bool:
    """Raise glibc's mmap threshold (once per process); returns whether this process has it."""
    global _applied
    if _applied is None:
        _applied = _apply()
    return _applied


@functools.cache
def _libc() -> ctypes.CDLL:
    """The C library (``find_library`` runs a subprocess: looked up once per process)."""
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")


def _apply() -> bool:
    if (os.environ.get("OPTW_MALLOC", "1").strip() == "0" or "MALLOC_MMAP_THRESHOLD_" in
            os.environ or not sys.platform.startswith("linux")):
        return False
    try:
        mallopt = _libc().mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, THRESHOLD) == 1


def release_free_memory() -> None:
    """Hand the heap's free memory back to the system (glibc's ``malloc_trim``): a long-lived
    process keeps the peak of an evaluation otherwise, as the raised threshold leaves large
    blocks on the heap. A no-op off glibc."""
    with contextlib.suppress(OSError, AttributeError):
        _libc().malloc_trim(0)
