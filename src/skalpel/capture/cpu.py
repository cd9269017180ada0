"""What the process asked of the CPU and what it got, over the recorded steps (for ``cpu_contention``).

Asked: torch's intra-op threads, the DataLoader workers, the processes of the job on this
machine. Available: the cores the process may run on (``sched_getaffinity``) and the
cgroup quota (``cpu.max``, or ``cpu.cfs_quota_us`` on cgroup v1), as ``skalpel.cores``
reads them. Got: the process's CPU time against the wall time of the recorded steps, and
(Linux) the time its threads spent runnable but waiting for a core
(``/proc/self/task/*/schedstat``, the run-queue delay), which is contention itself rather
than a guess from load. The system load average, and the threads runnable at the end of
the window, say whether the machine is busier than its cores. The CPU time of the process's
children over the window (its DataLoader workers: ``/proc/<pid>/stat``) says what a batch costs
to make where the trace cannot see it, in the workers.

The facts go into the capture info (``CaptureInfo.cpu``), which the rule reads without torch.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from .. import cores


@dataclass(frozen=True)
class Snapshot:
    wall_s: float
    cpu_s: float  # user + system time of every thread of this process
    waits_ns: dict[str, int] | None  # run-queue delay of each live thread (None: not on this system)
    children_cpu_s: dict[str, float] | None = None  # user + system time of each live child process (None: unknown)


def snapshot() -> Snapshot:
    return Snapshot(time.perf_counter(), time.process_time(), _run_queue_waits(), _children_cpu())


def left_out(end: Snapshot, stretches: list[tuple[Snapshot, Snapshot]]) -> Snapshot:
    """``end`` as if the stretches between each pair of snapshots (the trace export) had not run: their wall time,
    their CPU time and each thread's run-queue delay in them taken off. The export of a loaded machine waits for a
    core for seconds: left in, it made the waits of a 0.1 s window 1.8 s (95% "contention" at load 1.2)."""
    wall, used = end.wall_s, end.cpu_s
    waits = dict(end.waits_ns) if end.waits_ns is not None else None
    for before, after in stretches:
        wall -= after.wall_s - before.wall_s
        used -= after.cpu_s - before.cpu_s
        if waits is not None and before.waits_ns is not None and after.waits_ns is not None:
            for tid, ns in after.waits_ns.items():
                if tid in waits:
                    waits[tid] -= ns - before.waits_ns.get(tid, 0)
    return Snapshot(wall, used, waits, end.children_cpu_s)


def facts(start: Snapshot, end: Snapshot, *, steps: int, loader_workers: int = 0,
          fetched: tuple[int, float] | None = None,
          fetched_unprofiled: tuple[int, float] | None = None) -> dict[str, Any]:  # fmt: skip
    """The CPU facts of the stretch between two snapshots (``steps`` recorded steps; ``fetched``: the DataLoader
    batches fetched in it and the script thread's CPU seconds inside those fetches, where skalpel run's hooks
    measured them; ``fetched_unprofiled``: the same over the un-profiled steps before the window, where the profiler
    does not inflate the Python that makes a batch)."""
    import torch

    wall = max(end.wall_s - start.wall_s, 1e-9)
    cpu = max(end.cpu_s - start.cpu_s, 0.0)
    quota = cores.cgroup_quota_cores()
    result: dict[str, Any] = {
        "intra_op_threads": torch.get_num_threads(),
        "inter_op_threads": torch.get_num_interop_threads(),
        "loader_workers": loader_workers,
        "processes": _local_processes(),
        "cores_available": cores.affinity_cores(),
        "cpu_quota_cores": None if quota is None else round(quota, 2),  # recorded to 2 decimals
        "cpu_s": round(cpu, 4),
        "wall_s": round(wall, 4),
        "steps": steps,
        "load_avg_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "runnable_now": cores.runnable_tasks(),
        "run_queue_wait_s": None,
    }
    if start.waits_ns is not None and end.waits_ns is not None:
        # per thread: a thread that ended in between takes its delay with it; one born in between brings all of its own
        waited = sum(ns - start.waits_ns.get(tid, 0) for tid, ns in end.waits_ns.items())
        result["run_queue_wait_s"] = round(max(waited, 0) / 1e9, 4)
    if fetched is not None and fetched[0] > 0:
        result["loader_batches"] = fetched[0]
        result["loader_fetch_cpu_s"] = round(max(fetched[1], 0.0), 6)
    if fetched_unprofiled is not None and fetched_unprofiled[0] > 0:
        result["unprofiled_loader_batches"] = fetched_unprofiled[0]
        result["unprofiled_loader_fetch_cpu_s"] = round(max(fetched_unprofiled[1], 0.0), 6)
    if loader_workers and start.children_cpu_s is not None and end.children_cpu_s is not None:
        # per child alive at the end: one started in between brings all of its time; one that ended takes its own
        used_by_children = sum(s - start.children_cpu_s.get(pid, 0.0) for pid, s in end.children_cpu_s.items())
        result["loader_worker_cpu_s"] = round(max(used_by_children, 0.0), 6)
    return result


def thread_wait_s(start: Snapshot, end: Snapshot, native_id: int) -> float | None:
    """The seconds one thread of this process (its native id) waited for a core between two snapshots; None where
    the system does not report it."""
    tid = str(native_id)
    if start.waits_ns is None or end.waits_ns is None or tid not in end.waits_ns:
        return None
    return max(end.waits_ns[tid] - start.waits_ns.get(tid, 0), 0) / 1e9


def _run_queue_waits() -> dict[str, int] | None:
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None  # not Linux
    waits = {}
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/schedstat", "rb") as file:
                fields = file.read().split()
        except OSError:
            continue  # the thread ended meanwhile
        if len(fields) >= 2:
            waits[task] = int(fields[1])
    return waits or None


def _children_cpu() -> dict[str, float] | None:
    """CPU seconds each live child of this process has run, over all its threads (Linux ``schedstat``: nanoseconds,
    where ``stat``'s clock ticks of 10 ms cannot see a worker's 1 ms batches over a few steps); None where
    unreadable."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    used: dict[str, float] = {}
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/children", "rb") as file:
                children = file.read().decode().split()
        except OSError:
            continue  # the thread ended, or a kernel without the file
        for child in children:
            try:
                threads = os.listdir(f"/proc/{child}/task")
            except OSError:
                continue  # the child ended meanwhile
            ran = 0
            for thread in threads:
                try:
                    with open(f"/proc/{child}/task/{thread}/schedstat", "rb") as file:
                        ran += int(file.read().split()[0])
                except (OSError, ValueError, IndexError):
                    continue
            used[child] = ran / 1e9
    return used


def _local_processes() -> int:
    try:
        return max(int(os.environ.get("LOCAL_WORLD_SIZE", "1")), 1)  # set by torchrun for the ranks on this node
    except ValueError:
        return 1
