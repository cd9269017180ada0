"""Hold glibc's mmap threshold for the whole of ``skalpel run``, so that the overhead compares like with like.

glibc serves allocations above its mmap threshold (128 KiB at start) with fresh ``mmap``
pages, which fault in on every use; on each free of such a block it raises the threshold
to that block's size (up to 32 MiB), after which blocks that size come from its heap and
are reused warm. The profiler frees large buffers of its own when a window ends, so the
un-profiled steps timed after it ran with a threshold a plain run never reaches: on a
ResNet loop 10-12% faster than a plain run (``MALLOC_MMAP_THRESHOLD_=33554432`` reproduces
it), which read as a profiler overhead of +17-20% where the real one was 0-5%. Setting the
threshold (``mallopt``) turns glibc's adjustment off: every step, before, inside and after
the window, then runs with the same allocator. It is set at the 32 MiB the adjustment ends
at, and said in a note; a user's own ``MALLOC_MMAP_THRESHOLD_`` is left alone.
"""

from __future__ import annotations

import ctypes
import os

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)
HELD_BYTES = 32 * 2**20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit: where its own adjustment stops


def hold_mmap_threshold() -> str | None:
    """Fix the mmap threshold for the rest of the process; the note saying so, or None (not glibc, or the user's)."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return None
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return None  # not glibc: its allocator has no such threshold
    if not mallopt(M_MMAP_THRESHOLD, HELD_BYTES) or not mallopt(M_TRIM_THRESHOLD, 2 * HELD_BYTES):
        return None
    return (
        f"malloc's mmap threshold was held at {HELD_BYTES // 2**20} MiB for the whole run, so that the steps before "
        "and after the profiler use the same allocator (MALLOC_MMAP_THRESHOLD_ chooses another)"
    )
