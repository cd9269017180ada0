"""How many CPU cores this process may really use: its affinity mask, capped by a cgroup CPU quota.

``os.cpu_count()`` counts the machine; a container or ``taskset`` may give the process far
fewer, and more DataLoader workers or threads than that only fight over the same cores.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

_CGROUP_V2 = Path("/sys/fs/cgroup/cpu.max")
_LOADAVG = Path("/proc/loadavg")
_CGROUP_V1 = (Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"), Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us"))


def usable_cores() -> int:
    """Cores in the affinity mask, lowered to the cgroup quota (rounded up) when one is set; at least 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cores = os.cpu_count() or 1
    quota = cgroup_quota_cores()
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return max(1, cores)


def idle_cores(loadavg: Path = _LOADAVG) -> int:
    """The usable cores that no other task is running on at this instant; at least 1.

    /proc/loadavg counts the machine's runnable tasks now (this one included). It says something
    only when this process may use every core of the machine; in a container or under taskset
    the other tasks may run elsewhere, so then the usable cores count as idle.
    """
    cores = usable_cores()
    if cores < (os.cpu_count() or cores):
        return cores
    try:
        running = int(loadavg.read_text().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return cores
    return max(1, min(cores, cores - (running - 1)))


def cgroup_quota_cores(v2: Path = _CGROUP_V2, v1: tuple[Path, Path] = _CGROUP_V1) -> float | None:
    """The CPU quota in cores (quota / period), or None when there is none or it cannot be read."""
    try:
        quota, period = v2.read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us, period_us = (int(path.read_text().strip()) for path in v1)
    except (OSError, ValueError):
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None
