"""The C allocator, set for decoding's large short-lived tensors: glibc serves blocks above its
mmap threshold with fresh pages and returns them on free, so every decoding step, which
allocates and frees tables of tens to hundreds of MB, pays page faults again.
:func:`reuse_large_blocks` (called by the decoder) raises the threshold to 1 GiB so freed
blocks stay in the heap, at the cost of a higher peak memory (``docs/measurements.md``). It
does nothing off glibc, when ``MALLOC_MMAP_THRESHOLD_`` is set (the user's own setting wins),
or with ``OPTW_MALLOC=0``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
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


def _apply() -> bool:
    if (os.environ.get("OPTW_MALLOC", "1").strip() == "0" or "MALLOC_MMAP_THRESHOLD_" in
            os.environ or not sys.platform.startswith("linux")):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, THRESHOLD) == 1
