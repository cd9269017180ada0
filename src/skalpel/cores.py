"""How many CPU cores this process may really use: its affinity mask, capped by a cgroup CPU quota.

``os.cpu_count()`` counts the machine; a container or ``taskset`` may give the process far
fewer, and more DataLoader workers or threads than that only fight over the same cores.
The one place that reads the affinity, the cgroup quota and /proc/loadavg: the capture's CPU
facts, the job's worker pool, the trace loader and ``skalpel tune`` all ask here.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

_CGROUP_V2 = Path("/sys/fs/cgroup/cpu.max")
_LOADAVG = Path("/proc/loadavg")
_CGROUP_V1 = (Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"), Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us"))


def affinity_cores() -> int:
    """Cores in the affinity mask (as ``os.process_cpu_count`` counts), else the machine's; at least 1."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):  # not on Linux
        return max(os.cpu_count() or 1, 1)


def usable_cores() -> int:
    """Cores in the affinity mask, lowered to the cgroup quota (rounded up) when one is set; at least 1."""
    cores = affinity_cores()
    quota = cgroup_quota_cores()
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return cores


def idle_cores(loadavg: Path = _LOADAVG) -> int:
    """The usable cores that no other task is running on at this instant; at least 1.

    /proc/loadavg counts the machine's runnable tasks now (this one included). It says something
    only when this process may use every core of the machine; in a container or under taskset
    the other tasks may run elsewhere, so then the usable cores count as idle.
    """
    cores = usable_cores()
    if cores < (os.cpu_count() or cores):
        return cores
    running = runnable_tasks(loadavg)
    if running is None:
        return cores
    return max(1, min(cores, cores - (running - 1)))


def runnable_tasks(loadavg: Path = _LOADAVG) -> int | None:
    """Tasks runnable on the machine right now, this one included (Linux /proc/loadavg); None where unreadable."""
    try:
        return int(loadavg.read_text().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return None


def cgroup_quota_cores(v2: Path = _CGROUP_V2, v1: tuple[Path, Path] = _CGROUP_V1) -> float | None:
    """The CPU quota in cores (quota / period), or None when there is none or it cannot be read."""
    try:
        quota, period = v2.read_text().split()[:2]  # cgroup v2: "max 100000" or "200000 100000"
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us, period_us = (int(path.read_text().strip()) for path in v1)
    except (OSError, ValueError):
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


MAX_LOADER_WORKERS = 4  # more rarely helps one process, and each costs memory


def loader_workers(cores: float) -> int | None:
    """DataLoader workers for a loader that starves the step: one per usable core, at most
    ``MAX_LOADER_WORKERS``; None on one core (a worker would only compete with training).

    While the step waits for its batch the intra-op threads have nothing to run, so the workers
    may use every core; one worker cannot make batches faster than the training process made them
    alone. Measured on the 2-core starving loop (1 intra-op thread): 2 workers 1.7x, 1 worker 0.72x
    (issue 22) and 0.83x (tests/test_tune_runs.py). Where the intra-op threads alone fill every
    core, ``threads_beside_workers`` gives one core back. The one sizing ``skalpel run``'s DataLoader
    advice (``diagnose/input.py``) and ``skalpel tune``'s ``num_workers`` candidate share, so that
    the fix run prints is the one tune measures.
    """
    return None if cores < 2 else min(MAX_LOADER_WORKERS, int(cores))


WORKER_HANDOFF_MS = 1.5
"""The least a DataLoader worker takes to hand one batch to the training process (collate into shared memory,
pickle, queue, unpickle), whatever its fetch costs: a fetch per batch below this gains nothing from workers.
Measured with a free ``__getitem__`` (16 x 256 int64 per batch, 1 intra-op thread, 2 cores): 0 workers
0.15-0.17 ms a batch, 1 worker 1.5-1.9 ms, 2 workers 2.0 ms; at load 17, 2.2 and 2.4 ms
(benchmarks/loader_handoff.py)."""


WORKER_SIDE_HANDOFF_MS = 0.75
"""A DataLoader worker's own CPU a batch for handing it over (collate into shared memory, pickle, queue), beyond what
the training process would spend making the batch itself: a worker's CPU a batch less the process's own, at 0
workers (1 intra-op thread, 2 cores): TensorDataset batches 0.9 - 0.12 ms, makemore's 1.76 - 0.67 ms."""


def threads_beside_workers(cores: float, threads: int) -> int | None:
    """The intra-op threads to set beside ``loader_workers``: one core fewer where the threads fill every usable
    core (there the workers fight them at every parallel region: 2 threads on 2 cores with 1 worker measured 1.33x
    slower, issue 21); None to keep them."""
    if cores < 2 or threads < int(cores):
        return None
    return int(cores) - 1


def worker_split(workers: int, threads: int, cores: int) -> tuple[int, int]:
    """DataLoader workers and intra-op threads that share ``cores`` without fighting: ``(workers, threads)``.

    Unchanged when they already fit (``workers + threads <= cores``); else about half the cores
    each, at least one of both (one worker keeps batches off the training loop; one thread trains).
    ``skalpel tune`` tries this split, and ``skalpel run``'s DataLoader advice can name the same numbers.
    """
    cores = max(1, cores)
    if workers + threads <= cores:
        return workers, threads
    split_workers = max(1, min(workers, cores // 2))
    return split_workers, max(1, cores - split_workers)


def workers_that_fit(workers: int, threads: int, cores: float) -> tuple[int, int | None] | None:
    """DataLoader workers, and the intra-op threads to set (None: keep them), where ``workers`` worker processes and
    ``threads`` intra-op threads ask for more than ``cores``; None when they fit.

    The workers go on the cores the threads leave free; where the threads fill every core, one worker and one
    thread fewer. The other setting worth timing beside it is no worker at all (``num_workers=0``), which wins
    where a batch takes less to make than a worker takes to hand one over (``WORKER_HANDOFF_MS``). The one plan
    ``skalpel run``'s ``loader_oversubscribed`` advice names and ``skalpel tune``'s ``fewer_workers`` and
    ``no_workers`` candidates time.
    """
    usable = int(cores)
    if workers < 1 or workers + threads <= usable:
        return None
    free = usable - threads
    if free >= 1:
        return min(free, workers), None
    return 1, max(usable - 1, 1)


def fewer_workers(workers: int, threads: int, cores: int) -> int | None:
    """Fewer DataLoader workers where workers and intra-op threads exceed ``cores`` (``workers_that_fit``); None
    when they fit."""
    fit = workers_that_fit(workers, threads, cores)
    return None if fit is None or fit[0] >= workers else fit[0]
