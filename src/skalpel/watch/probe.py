"""What one step cost the process, read at each step boundary for a few microseconds.

RSS from ``/proc/self/statm`` and the run-queue wait of the training thread from
``/proc/thread-self/schedstat`` (both read with ``pread`` on a file kept open), the process's
CPU time, and, once the script has initialised CUDA, the caching allocator's allocated and
reserved bytes. Where a source is not readable (not Linux, a locked-down /proc) its column
stays empty; CUDA is never initialised here.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(frozen=True)
class Reading:
    cpu_s: float  # process CPU time so far (every thread)
    runq_s: float | None  # the training thread's run-queue wait so far
    rss: int | None
    cuda_allocated: int | None
    cuda_reserved: int | None


class Probe:
    def __init__(self) -> None:
        self._statm = _open("/proc/self/statm")
        self._schedstat = _open("/proc/thread-self/schedstat")  # the thread that opens it: the training thread
        self._cuda = None

    def read(self) -> Reading:
        rss = runq = None
        if self._statm is not None:
            try:
                rss = int(os.pread(self._statm, 64, 0).split()[1]) * _PAGE
            except (OSError, ValueError, IndexError):
                rss = None
        if self._schedstat is not None:
            try:
                runq = int(os.pread(self._schedstat, 64, 0).split()[1]) / 1e9
            except (OSError, ValueError, IndexError):
                runq = None
        allocated = reserved = None
        cuda = self._cuda or self._cuda_module()
        if cuda is not None:
            allocated, reserved = cuda.memory_allocated(), cuda.memory_reserved()
        return Reading(time.process_time(), runq, rss, allocated, reserved)

    def _cuda_module(self):
        """torch.cuda once the script has initialised it (never initialised here: no context of ours)."""
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():  # cheap: a flag
            self._cuda = torch.cuda
        return self._cuda

    def close(self) -> None:
        for fd in (self._statm, self._schedstat):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._statm = self._schedstat = None


def _open(path: str) -> int | None:
    try:
        fd = os.open(path, os.O_RDONLY)
        os.pread(fd, 64, 0)
        return fd
    except (OSError, AttributeError):
        return None


def host_memory_limit() -> int | None:
    """What RSS creeps towards: the machine's MemTotal."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def device_memory_limit() -> int | None:
    """What CUDA allocated memory creeps towards: the current device's total (CUDA initialised by the script)."""
    torch = sys.modules.get("torch")
    try:
        return int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001 - no limit, no projection; the creep is still said
        return None
