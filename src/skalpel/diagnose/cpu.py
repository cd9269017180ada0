"""cpu_contention: the process gets much less CPU than it asks for.

Judged from the CPU facts the capture recorded over the recorded steps (``CaptureInfo.cpu``,
written by ``capture/cpu.py``): a trace loaded from disk without them is not judged.
The share is the part of the time the process's threads wanted a core that they spent
waiting for one (the run-queue delay, against CPU time plus that delay); where the system
does not report the delay, the CPU the process got against the threads it runs (capped
at the cores it may use), when it asks for more than those cores or the machine is busier
than its cores.
"""

from __future__ import annotations

from typing import Any

from ..cores import WORKER_HANDOFF_MS, WORKER_SIDE_HANDOFF_MS, workers_that_fit
from . import thresholds
from .common import job_data_wait_ms
from .rule import Context, Docs, NotJudged, Outcome, Rule


def usable_cores(cpu: dict[str, Any]) -> float | None:
    """Cores the captured process could use: its affinity, lowered by a cgroup quota.

    Read from the facts the capture recorded (``skalpel.cores`` answered them on the machine
    that ran the script), never from the machine that analyses the trace.
    """
    cores = cpu.get("cores_available")
    quota = cpu.get("cpu_quota_cores")
    if cores is None:
        return quota
    return min(float(cores), float(quota)) if quota else float(cores)


def waiting(cpu: dict[str, Any]) -> tuple[float, float] | None:
    """(waiting share in %, wait ms per step) of the recorded steps; None where the facts cannot say.

    The run-queue delay where the system reports it; else the CPU got against the threads run, judged only when
    the process asks for more than its cores or the machine is busier than them.
    """
    if not cpu.get("wall_s") or not cpu.get("steps"):
        return None
    cores = usable_cores(cpu) or 1.0
    threads = int(cpu.get("intra_op_threads") or 1)
    asked = threads * int(cpu.get("processes") or 1) + int(cpu.get("loader_workers") or 0)
    load = cpu.get("load_avg_1m")
    wait_s = cpu.get("run_queue_wait_s")
    if wait_s is not None:
        waiting_pct = 100.0 * wait_s / max(cpu["cpu_s"] + wait_s, 1e-9)
    elif asked > cores or (load is not None and load > cores):
        waiting_pct = max(0.0, 100.0 * (1.0 - cpu["cpu_s"] / cpu["wall_s"] / min(threads, cores)))
        wait_s = max(min(threads, cores) * cpu["wall_s"] - cpu["cpu_s"], 0.0)
    else:
        return None
    return waiting_pct, 1000.0 * wait_s / cpu["steps"]


def contended(cpu: dict[str, Any] | None, limits: thresholds.Threshold = thresholds.CPU_CONTENTION) -> bool:
    """Whether ``cpu_contention`` holds on these facts: the process waited for a core past its share and floor."""
    waited = waiting(cpu) if cpu else None
    return waited is not None and waited[0] >= limits.share_pct and waited[1] >= limits.floor


def _check_contention(ctx: Context, rule: Rule) -> Outcome:
    cpu = ctx.capture.cpu if ctx.capture is not None else None
    if not cpu or not cpu.get("wall_s") or not cpu.get("steps"):
        return NotJudged("no CPU facts: a capture by skalpel run or skalpel.profile() records them", applies=False)
    limits = rule.thresholds
    cores = usable_cores(cpu) or 1.0
    threads = int(cpu.get("intra_op_threads") or 1)
    processes = int(cpu.get("processes") or 1)
    workers = int(cpu.get("loader_workers") or 0)
    asked = threads * processes + workers
    load = cpu.get("load_avg_1m")
    got_cores = cpu["cpu_s"] / cpu["wall_s"]
    if not contended(cpu, limits):
        return []
    waiting_pct, wait_ms_per_step = waiting(cpu)
    evidence = {
        "waiting_pct": waiting_pct,  # not share_pct: listed after the code's own bottlenecks of its severity
        "wait_ms_per_step": wait_ms_per_step,
        "cores_used": got_cores,
        "intra_op_threads": threads,
        "processes": processes,
        "loader_workers": workers,
        "threads_asked": asked,
        "cores_available": cpu.get("cores_available"),
        "cpu_quota_cores": cpu.get("cpu_quota_cores"),
        "load_avg_1m": load,
        "runnable_now": cpu.get("runnable_now"),
    }
    causes = _causes(asked, threads, processes, workers, cores, load, cpu.get("cpu_quota_cores"))
    title = (
        f"CPU contention: the process waited for a core {waiting_pct:.0f}% of the time it wanted one "
        f"({wait_ms_per_step:.1f} ms/step); it asks for {asked} thread(s) on {cores:g} usable core(s)"
        + (f", system load {load:.1f}" if load is not None else "")
    )
    severity = rule.severity_for(waiting_pct)
    measures, no_workers = workers_measured(ctx, cpu) if workers else ({}, None)
    evidence.update(measures)
    fix = _fix(threads, processes, workers, cores, load, causes, no_workers)
    return [rule.finding(evidence, title=title, severity=severity, fix=fix)]


def _ms_per_batch(cpu: dict, used_key: str, batches_key: str) -> tuple[float, int] | None:
    """CPU milliseconds a batch from two of the capture's facts: CPU seconds (``used_key``) over the batches fetched
    (``batches_key``); None where the capture did not measure them or no batch was fetched."""
    used, batches = cpu.get(used_key), cpu.get(batches_key)
    if used is None or not batches:
        return None
    return 1000.0 * used / batches, int(batches)


def worker_ms_per_batch(cpu: dict) -> tuple[float, int] | None:
    """The CPU milliseconds the DataLoader workers spent on a batch over the capture's window, and the batches
    fetched in it (``loader_worker_cpu_s``, ``loader_batches``: skalpel run's hooks); None where unmeasured.

    The trace cannot see a worker's work, only the training process's wait; the workers' CPU time can. It holds
    the worker's side of the hand-over too (collate into shared memory, pickle), so a batch made in the training
    process costs no more. Both this and the wait are read while the profiler records (workers forked under it
    record too): a TensorDataset batch of 32 x 64 floats took 0.9 ms of a worker's CPU, 1.4-2.0 ms recorded.
    """
    return _ms_per_batch(cpu, "loader_worker_cpu_s", "loader_batches")


def unprofiled_fetch_cpu_ms_per_batch(cpu: dict) -> float | None:
    """The script thread's CPU milliseconds inside one fetch in the un-profiled steps before the window: what a
    batch costs on a core as the script runs without skalpel (the profiler inflates the Python that makes it ~2x);
    None where not measured."""
    measured = _ms_per_batch(cpu, "unprofiled_loader_fetch_cpu_s", "unprofiled_loader_batches")
    return measured[0] if measured else None


def fetch_cpu_ms_per_batch(cpu: dict) -> float | None:
    """The same over the capture's window (``loader_fetch_cpu_s`` over ``loader_batches``); None where not measured.
    With ``num_workers=0`` it is what making a batch costs on a core: two jobs on two cores stretch a 1 ms batch's
    wall time to 12 ms, not this."""
    measured = _ms_per_batch(cpu, "loader_fetch_cpu_s", "loader_batches")
    return measured[0] if measured else None


def fetch_cpu_share_pct(cpu: dict) -> float | None:
    """The share of the process's CPU time over the window that the script thread spent inside DataLoader fetches,
    with ``num_workers=0`` (making every batch in the process); None where not measured, or with workers (then the
    fetch only receives a batch).

    Under contention this is the share to judge the fetch by: the scheduler stretches the parts of a step unevenly,
    so their wall-time shares say where it preempted, not where the work is (beside busy loops, at load 12: a fetch of
    19% of the CPU held 6% of the wall time, 37 of 631 ms a step)."""
    if cpu.get("loader_workers") or not cpu.get("cpu_s") or cpu.get("loader_fetch_cpu_s") is None:
        return None
    return 100.0 * min(cpu["loader_fetch_cpu_s"] / cpu["cpu_s"], 1.0)


NO_WORKERS_MARGIN = 1.2  # the wait must pass the in-process cost by this much (a 15.5 ms batch waited 14.8 at load 4)


UNSTRETCHED_BATCH_MS = 2 * WORKER_HANDOFF_MS  # in_process_ms_per_batch: a batch about a hand-over's cost to make


def measured_waiting_pct(cpu: dict[str, Any] | None) -> float:
    """The share of the time the process's threads wanted a core that they waited for one (``waiting``); 0 where the
    facts cannot say."""
    waited = waiting(cpu) if cpu else None
    return waited[0] if waited is not None else 0.0


def in_process_ms_per_batch(measured: tuple[float, int], waiting_pct: float = 0.0) -> float:
    """The wall milliseconds the training process would take to make one batch itself: a worker's CPU a batch less its
    side of the hand-over (``cores.WORKER_SIDE_HANDOFF_MS``), stretched by the contention the capture measured
    (``waiting_pct``: a thread that waits for a core that share of the time runs a 16 ms batch in 16 / (1 - share)).

    Not stretched where a batch costs no more to make than two hand-overs (``UNSTRETCHED_BATCH_MS``): there the
    workers spend about as much CPU handing batches over as making them, and a starved process gets those cycles back
    by making the batch itself. The profiler and the contention inflate a worker's CPU too: a TensorDataset batch,
    free to make, read 1.3 ms of a worker's CPU on a quiet machine and 1.4-2.8 ms beside two busy loops.
    Measured on the look-alikes (chain 7, load 7.3): 4 workers for ~10 ms batches, 16.8 ms of a worker's CPU a batch
    against a 19.7 ms wait, the process waiting for a core 82% of the time: made in the process, ~89 ms of wall time.
    """
    made = max(measured[0] - WORKER_SIDE_HANDOFF_MS, 0.0)
    if made <= UNSTRETCHED_BATCH_MS:
        return made
    return made / max(1.0 - waiting_pct / 100.0, 0.05)


def cheap_batches(measured: tuple[float, int] | None, wait_ms_per_batch: float, waiting_pct: float = 0.0) -> str | None:
    """``num_workers=0`` with the measures that back it, where the step already waits longer for each batch from its
    workers than the training process would take to make one (``in_process_ms_per_batch``: a worker's CPU a batch
    less its side of the hand-over, stretched by the contention measured, ``waiting_pct``). Made in the process, a
    batch then costs no more than the wait, and the workers' cores go back to training. None where it does not, or
    unmeasured.

    The wait is wall time and a worker's cost CPU time: under contention the process would wait for a core while it
    makes the batch too, so the cost is compared in wall time (chain 7: a 16.1 ms batch against a 19.7 ms wait at 82%
    waiting advised 0 workers, for ~89 ms of wall time a batch).

    Measured (2 cores, 1 intra-op thread, 4 workers, makemore's step times printed, medians of 3 interleaved rounds
    at load 3-10): TensorDataset batches, 1.3 ms of a worker's CPU recorded against an 8.2 ms wait a batch (4 -> 0
    workers 4.3x faster); makemore's, 2.0-2.4 ms against 1.7-2.0 ms (4 -> 0 1.08x, 4 -> 1 0.65x); a costly Python
    ``__getitem__``, ~10 ms against a wait of a few ms (workers hide it: kept, fitted to the cores).
    """
    if measured is None:
        return None
    in_process = in_process_ms_per_batch(measured, waiting_pct)
    # a tie is no reason to move every batch into the step: under contention a starved worker's wait equals its cost
    if in_process * NO_WORKERS_MARGIN > wait_ms_per_batch:
        return None
    ms, batches = measured
    made = max(ms - WORKER_SIDE_HANDOFF_MS, 0.0)
    stretched = (f", ~{in_process:.2f} ms of wall time at the contention measured (the process waited for a core "
                 f"{waiting_pct:.0f}% of the time)") if in_process > made + 0.005 else ""  # fmt: skip
    return (f"num_workers=0: the step waits {wait_ms_per_batch:.2f} ms for each batch from its workers, more than "
            f"the ~{made:.2f} ms the training process would take to make one{stretched} (a worker spends {ms:.2f} ms "
            f"of CPU a batch, ~{WORKER_SIDE_HANDOFF_MS:g} ms of it its side of the hand-over; {batches} batches "
            "recorded)")


def workers_measured(ctx: Context, cpu: dict) -> tuple[dict[str, float], str | None]:
    """The workers' measures a batch over the window, as evidence (their CPU, the step's wait, the wall time the
    process would take to make one itself at the contention measured; empty where unmeasured), and the
    ``num_workers=0`` advice they back (``cheap_batches``) or None."""
    measured = worker_ms_per_batch(cpu)
    if measured is None:
        return {}, None
    wait_per_batch = loader_wait_ms_per_batch(ctx, cpu, measured)
    waited = measured_waiting_pct(cpu)
    evidence = {"worker_cpu_ms_per_batch": measured[0], "wait_ms_per_batch": wait_per_batch,
                "in_process_ms_per_batch": in_process_ms_per_batch(measured, waited)}
    return evidence, cheap_batches(measured, wait_per_batch, waited)


def loader_wait_ms_per_batch(ctx: Context, cpu: dict, measured: tuple[float, int] | None) -> float:
    """The main thread's mean wait for a batch over the recorded steps (the job's data wait a step, over the
    batches a step fetched); 0 where unknown."""
    job = job_data_wait_ms(ctx)
    if job is None or measured is None or not cpu.get("steps"):
        return 0.0
    return job[0] / max(measured[1] / cpu["steps"], 1e-9)


def _causes(asked: int, threads: int, processes: int, workers: int, cores: float, load: float | None,
            quota: float | None) -> list[str]:  # fmt: skip
    causes = []
    if asked > cores:
        parts = [f"{threads} intra-op thread(s)" + (f" x {processes} processes" if processes > 1 else "")]
        if workers:
            parts.append(f"{workers} DataLoader worker(s)")
        causes.append(f"{' + '.join(parts)} for {cores:g} core(s)")
    if load is not None and load > cores:
        causes.append(f"other processes: system load {load:.1f} on {cores:g} core(s)")
    if quota:
        causes.append(f"a cgroup quota of {quota:g} core(s)")
    return causes


def _fix(threads: int, processes: int, workers: int, cores: float, load: float | None, causes: list[str],
         no_workers: str | None = None) -> str:  # fmt: skip
    """A fix that fits the machine measured: never more threads, workers or processes than its cores;
    ``no_workers``: the workers' measured cost a batch says none pays best (``cheap_batches``)."""
    per_process = max(int(cores) // max(processes, 1) - (1 if workers else 0), 1)
    steps = []
    if threads > per_process:
        steps.append(f"torch.set_num_threads({per_process}) (or OMP_NUM_THREADS={per_process})")
    fit = workers_that_fit(workers, min(threads, per_process), max(int(cores) // max(processes, 1), 1))
    if no_workers is not None:
        steps.append(no_workers)
    elif fit is not None and fit[0] < workers:
        # the plan loader_oversubscribed names and tune times; never "or less": num_workers=0 puts the making of every
        # batch into the step (makemore, 4 -> 0 workers: 1.10-1.28x slower), which pays only for batches cheaper
        # than a worker's hand-over
        steps.append(f"fewer DataLoader workers: num_workers={fit[0]} (not 0 unless a batch takes less than "
                     f"~{WORKER_HANDOFF_MS:g} ms to make: num_workers=0 makes every batch inside the step)")
    if processes > cores:
        steps.append(f"at most {int(cores)} processes on this machine")
    if load is not None and load > cores:
        steps.append("stop the other loads on the machine (or capture where it is idle)")
    if not steps:  # the process asks no more than its cores: the others took them, in bursts the load average hides
        steps.append(
            f"nothing in the script ({threads} thread(s) x {processes} process(es) fit {cores:g} core(s)): other "
            "processes took the cores; measure again on an idle machine, or give the job cores of its own (taskset)"
        )
    cause = f" ({'; '.join(causes)})" if causes else ""
    return "; ".join(steps) + cause


CPU_CONTENTION = Rule(
    id="cpu_contention",
    family="measurement",  # the machine, not the code: every other number of the run is distorted by it
    severity="warning",
    title="CPU contention: the process waited for a core {waiting_pct:.0f}% of the time it wanted one",
    thresholds=thresholds.CPU_CONTENTION,
    check=_check_contention,
    scope="job",
    fix="torch.set_num_threads(N) or OMP_NUM_THREADS=N with N the cores per process; fewer DataLoader workers "
    "(the cores the intra-op threads leave free, at least one) or processes; stop other loads on the machine",
    docs=Docs(
        what="Over the recorded steps, the process's threads spent a large share of the time they wanted a CPU "
        "core waiting for one (the Linux run-queue delay of every thread, against their CPU time plus that delay). "
        "Where the delay is not reported: the CPU time the process got against the intra-op threads it runs "
        "(capped at its cores), when it asks for more than its cores or the machine is busier than its cores.",
        why="A starved process runs every op slower, and intra-op threads that wait for each other at every "
        "parallel region make it much slower still: a 2-core machine under load can turn a 43 ms step into "
        "a 759 ms one. Every other number of the profile (shares, overhead) is then distorted by the machine, "
        "not by the code.",
        evidence="The waiting share and wait ms per step (summed over threads), the cores the process used, what it "
        "asks for (intra-op threads x processes on this machine + DataLoader workers), the cores it may use "
        "(sched_getaffinity, cgroup cpu.max quota) and the 1-minute system load average; recorded by the capture.",
        fix="Match threads to cores: `torch.set_num_threads(N)` or `OMP_NUM_THREADS=N`, N = usable cores / processes "
        "(one less with DataLoader workers); fewer DataLoader workers (`cores.workers_that_fit`, the plan "
        "`loader_oversubscribed` names and `skalpel tune` times: the cores the threads leave free, at least one) "
        "or processes; stop competing loads. Never down to `num_workers=0` for batches that cost time to make: "
        "that moves their making into the step (makemore, 4 -> 0 workers on 2 cores: 1.10-1.28x slower); "
        "0 only where a batch takes less than a worker's hand-over (~1.5 ms). The fix given names numbers that "
        "fit the machine measured.",
        false_positives="A burst of other load during the few recorded steps (a backup, another user's job) makes "
        "one capture look starved; capture again. Stored traces carry no CPU facts and are not judged.",
    ),
)

RULES = (CPU_CONTENTION,)
