"""What each step cost the process, read on the store's writer thread, bar two clocks read on the training thread.

At each step boundary the training thread reads ``time.perf_counter()`` and its own run-queue
wait (``RunQueueClock``: one ``pread`` of ``/proc/thread-self/schedstat``, parsed on the writer
thread). The core wait has to be read there: spread over the steps between two readings, one step
that waited 100 ms for a core on a busy machine looks like a step that took 50 ms longer. At each
of its polls the writer thread reads the rest once (``Counters.read``): the process's CPU time,
RSS (``/proc/self/statm``), and, once the script has initialised CUDA and the training thread has
said which device it uses, the caching allocator's allocated and reserved bytes. ``Timeline``
interpolates those readings at each step's start and end: a step's CPU time is the counter's
growth between the two (spread evenly over the steps of one poll, 0.2 to 1 s), its memory the value at
its end. Where a source is not readable (not Linux, a locked-down /proc) its column stays empty;
CUDA is never initialised here.
"""

from __future__ import annotations

import bisect
import os
import sys
import time
from dataclasses import dataclass

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class RunQueueClock:
    """The calling thread's run-queue wait so far: ``read()`` on the training thread (1-2 us, unparsed), ``seconds``
    on the writer thread."""

    def __init__(self) -> None:
        self._fd = _open("/proc/thread-self/schedstat")  # the thread that opens it: the training thread

    def read(self) -> bytes | None:
        if self._fd is None:
            return None
        try:
            return os.pread(self._fd, 64, 0)
        except OSError:
            return None

    @staticmethod
    def seconds(raw: bytes | None) -> float | None:
        try:
            return int(raw.split()[1]) / 1e9 if raw is not None else None
        except (ValueError, IndexError):
            return None

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None


@dataclass(frozen=True)
class Reading:
    at: float  # time.perf_counter() when read (the clock the training thread stamps its steps with)
    cpu_s: float  # process CPU time so far (every thread)
    rss: int | None
    cuda_allocated: int | None
    cuda_reserved: int | None


class Counters:
    """The process's counters, read on the writer thread."""

    def __init__(self) -> None:
        self._statm = _open("/proc/self/statm")
        self.cuda_device: int | None = None  # the training thread's CUDA device, once it said which

    def read(self) -> Reading:
        rss = None
        if self._statm is not None:
            try:
                rss = int(os.pread(self._statm, 64, 0).split()[1]) * _PAGE
            except (OSError, ValueError, IndexError):
                rss = None
        allocated = reserved = None
        if self.cuda_device is not None:
            cuda = sys.modules["torch"].cuda
            try:
                allocated, reserved = cuda.memory_allocated(self.cuda_device), cuda.memory_reserved(self.cuda_device)
            except Exception:  # noqa: BLE001 - a device torn down at the end: no reading, the run goes on
                pass
        return Reading(time.perf_counter(), time.process_time(), rss, allocated, reserved)

    def close(self) -> None:
        if self._statm is not None:
            try:
                os.close(self._statm)
            except OSError:
                pass
            self._statm = None


def cuda_in_use() -> bool:
    """Whether the script has initialised CUDA (a flag: never initialises it)."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.is_initialized()


class Timeline:
    """The readings of the last polls, interpolated at any time between them."""

    def __init__(self) -> None:
        self.readings: list[Reading] = []
        self._times: list[float] = []

    def add(self, reading: Reading) -> None:
        self.readings.append(reading)
        self._times.append(reading.at)

    def forget_before(self, at: float) -> None:
        """Keep the last reading at or before ``at`` and every later one (what later steps are read between)."""
        keep = max(bisect.bisect_right(self._times, at) - 1, 0)
        if keep:
            del self.readings[:keep], self._times[:keep]

    def at(self, at: float) -> tuple[float, int | None, int | None, int | None]:
        """(cpu_s, rss, cuda_allocated, cuda_reserved) at ``at``: linear between the readings around it."""
        index = bisect.bisect_left(self._times, at)
        if index >= len(self.readings):
            last = self.readings[-1]
            return last.cpu_s, last.rss, last.cuda_allocated, last.cuda_reserved
        after = self.readings[index]
        if index == 0 or after.at == at:
            return after.cpu_s, after.rss, after.cuda_allocated, after.cuda_reserved
        before = self.readings[index - 1]
        share = (at - before.at) / (after.at - before.at)
        return (before.cpu_s + (after.cpu_s - before.cpu_s) * share, _between(before.rss, after.rss, share),
                _between(before.cuda_allocated, after.cuda_allocated, share),
                _between(before.cuda_reserved, after.cuda_reserved, share))  # fmt: skip


def _between(one: int | None, two: int | None, share: float) -> int | None:
    """The whole number of bytes ``share`` of the way from ``one`` to ``two`` (``two`` where either is unknown)."""
    if one is None or two is None:
        return two
    return int(round(one + (two - one) * share))


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


def device_memory_limit(device: int) -> int | None:
    """What CUDA allocated memory creeps towards: the device's total (CUDA initialised by the script)."""
    torch = sys.modules.get("torch")
    try:
        return int(torch.cuda.get_device_properties(device).total_memory)  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001 - no limit, no projection; the creep is still said
        return None
