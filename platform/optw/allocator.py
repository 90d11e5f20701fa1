"""The C allocator, set for decoding's large short-lived tensors.

Beam search and the global models' batches allocate and free tables of tens to hundreds of MB
at every decoding step. glibc serves blocks above its mmap threshold (at most 32 MB by
default) with fresh pages from the kernel and hands them back on free, so every step pays
page faults to zero them again: on a 2-core machine, ``make run``'s evaluation of a model on
pr10 (beam 8 on 64 validation tourists, one thread) spent 7 of its 28 s in the kernel.
:func:`reuse_large_blocks` raises the threshold to 1 GiB, so freed blocks stay in the heap for
the next step: kernel time 7.1 -> 2.1 s, wall 1.13x faster (best of two rounds each), peak
memory +12 % (1.58 -> 1.77 GB; the process keeps what it freed). ``benchmarks/
bench_allocator.py`` measures it.

The decoder calls it (:class:`optw.decode.core.Decoder`), once per process. It does nothing
off glibc, when ``MALLOC_MMAP_THRESHOLD_`` is set (the user's own setting wins), or with
``OPTW_MALLOC=0``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

#: glibc's ``mallopt`` parameter number of the mmap threshold.
M_MMAP_THRESHOLD = -3
#: Blocks up to this size come from the heap and are reused after free.
THRESHOLD = 1 << 30

_applied: bool | None = None


def reuse_large_blocks() -> bool:
    """Raise glibc's mmap threshold to :data:`THRESHOLD` (once per process; see the module
    docstring). Returns whether this process now runs with it."""
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
