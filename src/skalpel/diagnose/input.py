"""Input pipeline findings: the step waits for its data, or copies it from pageable memory."""

from __future__ import annotations

from dataclasses import dataclass

from ..cores import WORKER_HANDOFF_MS, loader_workers, threads_beside_workers, workers_that_fit
from . import thresholds
from .common import job_data_wait_ms, pct, window_of
from .cpu import (cheap_batches, contended, fetch_cpu_ms_per_batch, fetch_cpu_share_pct, in_process_ms_per_batch,
                  measured_waiting_pct, unprofiled_fetch_cpu_ms_per_batch, usable_cores, worker_ms_per_batch,
                  workers_measured)
from .rule import Context, Docs, NotJudged, Outcome, Rule


def _check_dataloader(ctx: Context, rule: Rule) -> Outcome:
    """The host's wait for its batches, from the ledger: the main thread inside a DataLoader fetch, whatever the
    device did meanwhile (the part it idled, the most a fix saves there, is said beside)."""
    limits = rule.thresholds
    findings = []
    cpu = ctx.capture.cpu if ctx.capture is not None else None
    ranks = ctx.analyses.ledger.ranks if ctx.analyses.ledger is not None else {}
    # under contention the wall-time share says where the scheduler preempted: the fetch is judged on CPU time too,
    # where the capture measured it (its facts are the capturing process's: one rank)
    on_cpu = fetch_cpu_share_pct(cpu) if cpu and len(ranks) == 1 and contended(cpu) else None
    for rank, ledger in ranks.items():
        host, device = ledger.lane("host"), ledger.lane("device")
        if host is None:
            continue
        wall_share, ms = host.share_pct("data_wait", steady=True), host.ms_per_unit("data_wait")
        share = max(wall_share, on_cpu or 0.0)
        if share < limits.share_pct or ms < limits.floor:
            continue
        loader = ctx.analyses.loader_ranges.for_rank(rank)
        waits, single = loader.ranges, loader.single_process
        unit_ms = host.steady_ms_per_unit  # the steady unit: the share's
        # what a faster fetch can save: on a device, the part of the wait the device idled; on a CPU, all of it
        saving = device.ms_per_unit("data_wait") if device is not None else ms
        if share > wall_share:  # judged on CPU time: the fetch's part of the step is its share of the work
            saving = share / 100.0 * host.steady_ms_per_unit
        evidence = {
            "share_pct": share,
            "ms_per_step": ms,
            "mean_step_ms": unit_ms,
            **({"device_idle_ms_per_step": saving} if device is not None else {}),
            "judged_over": ledger.describe(),
            "worst_step_wait_ms": max(unit.ms.get("data_wait", 0.0) for unit in host.units),
            "iterator": ", ".join(loader.iterators),
        }
        if share > wall_share:
            evidence.update({"wall_share_pct": wall_share, "share_of": "CPU time (under contention)"})
        ratio = ctx.capture.unprofiled_ratio() if ctx.capture is not None else None
        batches = len(waits) / max(ledger.units, 1)  # gradient accumulation fetches several a step
        plan = loader_plan(cpu, wait_ms=saving, step_ms=unit_ms, single=single, device=ctx.analyses.has_device,
                           min_speedup=limits.param("min_speedup"), batches_per_step=batches,
                           unprofiled_ratio=ratio, worker_batch=worker_ms_per_batch(cpu) if cpu else None,
                           cpu_share_pct=share if share > wall_share else None)  # fmt: skip
        evidence.update(plan.evidence)
        fix = plan.fix
        if single:
            fix = "num_workers=0 loads every batch in the training process: " + fix
        locations = _unique(ctx.inner_locations(waits) + ctx.locations(waits))
        title = None if ledger.unit == "step" else (
            f"Waiting for data takes {share:.0f}% of {ledger.describe()} ({ms:.1f} ms of {unit_ms:.1f} ms a unit)"
        )  # fmt: skip
        if share > wall_share:
            title = (f"Making the batches takes {share:.0f}% of the process's CPU time ({ms:.1f} ms of the "
                     f"{unit_ms:.1f} ms mean step waits for data: {wall_share:.0f}% of the wall time, which the "
                     f"contention measured stretches unevenly)")  # fmt: skip
        if title is None and device is not None and saving < 0.8 * ms:  # the device ran queued work for part of it
            title = (f"The step waits for data {share:.0f}% of the time ({ms:.1f} ms of the {unit_ms:.1f} ms mean "
                     f"step; the device idles {saving:.1f} ms of it)")  # fmt: skip
        findings.append(
            rule.finding(evidence, locations=locations, severity=rule.severity_for(share), fix=fix, rank=rank, title=title)
        )
    return findings


_CHEAP_ITEMS = "make __getitem__ cheap (decode/augment once, cache, or move transforms to the device)"


@dataclass(frozen=True)
class LoaderPlan:
    """The loader fix that fits the machine, and the speed-up each part of it can bring."""

    fix: str
    evidence: dict


def loader_plan(cpu: dict | None, *, wait_ms: float, step_ms: float, single: bool, device: bool,
                min_speedup: float, batches_per_step: float = 1.0, unprofiled_ratio: float | None = None,
                worker_batch: tuple[float, int] | None = None, cpu_share_pct: float | None = None) -> LoaderPlan:  # fmt: skip
    """Lead with the fix that can pay: workers hide the fetch behind the step's compute and share it out.

    A step of ``step_ms`` waits ``wait_ms`` for its batch; the rest is compute. Worker processes
    make the batches beside the compute, so the step becomes about max(fetch per worker, compute):
    one worker cannot make them faster than the training process did. The workers are
    ``cores.loader_workers`` (one per usable core: the intra-op threads idle while the step waits);
    where the intra-op threads alone fill every core, ``torch.set_num_threads`` is lowered by one
    too (``cores.threads_beside_workers``), and the compute slows by up to threads / (threads - 1).
    ``skalpel tune``'s ``num_workers`` candidate tries the same numbers. A cheap ``__getitem__``
    removes the fetch itself: up to step / compute.

    Workers are not advised only where the measured numbers say they cannot pay: the main thread computes
    nearly the whole step (the most they gain is under ``min_speedup``), a single usable core, or a batch made
    faster than a worker can hand it over (``_why_no_workers``: ``cores.WORKER_HANDOFF_MS``; the fetch per batch
    is scaled by ``unprofiled_ratio``, un-profiled / profiled step, as the profiler inflates the Python that makes
    it); ``cpu_share_pct``: the fetch was judged on its share of the process's CPU time (``wait_ms`` is that share
    of the step), said so. With workers already, ``worker_batch`` (``cpu.worker_ms_per_batch``: their CPU a batch) may show the
    step waiting longer for a batch than the process would take to make it, at the contention measured: then none
    (``cpu.cheap_batches``). Other load is no veto: while the main thread waits for its batch its core is idle, and a worker gets a
    share of the cores of its own.
    """
    cores = usable_cores(cpu) if cpu else None
    if cores is None:  # a trace without the capture's CPU facts: the cores it ran on are unknown
        return LoaderPlan(worker_advice(cpu, device=device) + "; " + _CHEAP_ITEMS, {})
    compute = max(step_ms - wait_ms, 1e-3)
    cheap_speedup = step_ms / compute
    fetch = (f"the fetch is {wait_ms:.1f} ms of the {step_ms:.1f} ms mean step" if cpu_share_pct is None else
             f"the fetch is {cpu_share_pct:.0f}% of the process's CPU time, ~{wait_ms:.1f} ms of the {step_ms:.1f} ms "
             "mean step")  # fmt: skip
    cheap = f"{_CHEAP_ITEMS}: {fetch}, up to {cheap_speedup:.1f}x"
    evidence: dict = {"compute_ms_per_step": compute, "cheap_items_speedup_up_to": cheap_speedup}
    threads = int(cpu.get("intra_op_threads") or 1)
    workers_now = int(cpu.get("loader_workers") or 0)
    evidence.update({"intra_op_threads": threads, "loader_workers": workers_now, "usable_cores": cores})
    if not single and workers_now:
        waited = measured_waiting_pct(cpu)
        if worker_batch is not None:
            evidence["worker_cpu_ms_per_batch"] = worker_batch[0]
            evidence["in_process_ms_per_batch"] = in_process_ms_per_batch(worker_batch, waited)
        no_workers = cheap_batches(worker_batch, wait_ms / max(batches_per_step, 1e-9), waited)
        if no_workers is not None:
            return LoaderPlan(f"{no_workers}; {cheap}", evidence)
        busy = threads + workers_now > cores
        why = (f"its {workers_now} worker(s) and {threads} intra-op thread(s) already ask for more than the "
               f"{cores:g} usable cores" if busy else f"its {workers_now} worker(s) do not keep up")  # fmt: skip
        most = loader_workers(cores) or 0
        more = f"; or more workers, up to {most} (one per usable core)" if not busy and workers_now < most else ""
        return LoaderPlan(f"{cheap} ({why}){more}", evidence)
    workers, set_threads = _workers_for(cores, threads)
    if workers == 0:
        evidence["workers_speedup_up_to"] = 1.0
        return LoaderPlan(f"{cheap}; with {cores:g} usable core, worker processes would only compete with training",
                          evidence)  # fmt: skip
    best = step_ms / max(wait_ms / workers, compute)  # the workers on cores of their own
    # fewer intra-op threads: the compute slows by up to threads / set_threads (none where they did not scale)
    worst = step_ms / max(wait_ms / workers, compute * threads / set_threads) if set_threads else best
    # one key, as for the cheap items: the most the workers can bring; the fix gives the range where threads cost
    evidence["workers_speedup_up_to"] = best
    pin = "pin_memory=True, " if device else ""
    loader = f"DataLoader(num_workers={workers}, {pin}persistent_workers=True, prefetch_factor=2)"
    if set_threads:
        sized = (f"{loader} with torch.set_num_threads({set_threads}) (the {threads} intra-op thread(s) already use "
                 f"the {cores:g} usable cores): {worst:.2f}-{best:.2f}x, as the compute ({compute:.1f} ms) slows by "
                 f"up to {threads}/{set_threads} on fewer threads; time it")  # fmt: skip
    else:
        sized = (f"{loader} (one per usable core: the {threads} intra-op thread(s) idle while the step waits for "
                 f"data): about {best:.2f}x, it hides the fetch behind at most the {compute:.1f} ms of compute")  # fmt: skip
    if best < min_speedup:
        return LoaderPlan(f"{cheap}; not more workers: {sized}", evidence)
    why_not = _why_no_workers(cpu, evidence, wait_ms=wait_ms, compute_ms=compute, batches_per_step=batches_per_step,
                              unprofiled_ratio=unprofiled_ratio)  # fmt: skip
    if why_not:
        evidence["workers_speedup_up_to"] = 1.0
        return LoaderPlan(f"{cheap}; not more workers: {why_not}", evidence)
    if "cores_held_by_others" in evidence:  # contention measured: not a veto, but the gain is the free cores'
        ran = evidence.get("ran_share_of_wanted", 1.0)
        sized += (f" where a core is free: at the capture the process ran {100 * ran:.0f}% of the time it wanted a "
                  f"core (load {cpu['load_avg_1m']:.1f} on {cores:g}); while the others hold every core a worker only "
                  "shares the process's time, so time it")  # fmt: skip
    if worst >= cheap_speedup:  # even with the threads it costs, the workers gain the most
        return LoaderPlan(f"{sized}; {cheap}", evidence)
    return LoaderPlan(f"{cheap}; or {sized}", evidence)


def _why_no_workers(cpu: dict, evidence: dict, *, wait_ms: float, compute_ms: float, batches_per_step: float,
                    unprofiled_ratio: float | None) -> str | None:  # fmt: skip
    """Why workers would not pay on the batches measured, in words with the numbers; None if they may.

    Adds what it weighed to ``evidence``. Other load on the machine is no reason: a worker runs beside the main
    thread, on the core the main thread leaves idle while it waits for its batch (mnist_rnn on a loaded 2-core
    machine: num_workers 0 -> 1 2.8x faster). Where the capture measured contention, the cores the others hold and
    the fetch's time on a core are recorded, and the fix says its gain needs a free core (a scheduler that shares
    the CPU between sessions or cgroups gives the workers no time of their own while others hold every core).
    The one veto here: a batch made faster than a worker hands it over (``WORKER_HANDOFF_MS``).
    """
    batches = max(batches_per_step, 1.0)
    queued = cpu.get("run_queue_wait_s")
    ran = cpu["cpu_s"] / (cpu["cpu_s"] + queued) if queued and cpu.get("cpu_s") else 1.0
    per_batch, measured_as = _batch_cost(cpu, wait_ms / batches, ran, unprofiled_ratio)
    evidence.update({"batches_per_step": batches, "fetch_ms_per_batch": per_batch})
    if measured_as is not None:
        evidence["fetch_measured_as"] = measured_as
    if ran < 1.0:
        evidence["ran_share_of_wanted"] = ran
    if unprofiled_ratio:
        evidence["unprofiled_ratio"] = unprofiled_ratio
    load, steps = cpu.get("load_avg_1m"), cpu.get("steps")
    if load is not None and steps and cpu.get("wall_s") and contended(cpu):
        busy_ms = 1000.0 * (cpu["cpu_s"] + (cpu.get("run_queue_wait_s") or 0.0)) / steps
        cores = usable_cores(cpu) or 1.0
        evidence.update({"cores_held_by_others": min(max(load - cpu["cpu_s"] / cpu["wall_s"], 0.0), cores),
                         "fetch_on_core_ms_per_step": min(max(busy_ms - compute_ms, 0.0), wait_ms)})  # fmt: skip
    if per_batch < WORKER_HANDOFF_MS:
        scaled = " without the profiler" if measured_as == _UNPROFILED or unprofiled_ratio else ""
        if measured_as is not None:
            on_core = "; its CPU time in the fetch, which other load does not stretch"
        else:
            on_core = f"; on a core: the process ran {100 * ran:.0f}% of the time it wanted one" if ran < 0.9 else ""
        return (f"a batch takes about {per_batch:.1f} ms to make{scaled} ({batches:.0f} a step{on_core}), less than "
                f"the ~{WORKER_HANDOFF_MS:g} ms a worker takes to hand one over (collate into shared memory, pickle, "
                "queue)")  # fmt: skip
    return None


_UNPROFILED = "thread CPU, un-profiled steps"


def _batch_cost(cpu: dict, wait_ms_per_batch: float, ran: float,
                unprofiled_ratio: float | None) -> tuple[float, str | None]:  # fmt: skip
    """What making one batch costs on a core as the script runs without skalpel, in ms, and how it was measured
    (None: from the wall wait). On a loaded machine a fetch's wall time is stretched by its waits for a core, so the
    measures go from the one load cannot touch to the one it can:

    1. the script thread's CPU in the fetches of the un-profiled steps before the window (skalpel run's hooks);
    2. its CPU in the window's fetches, scaled by the profiler's measured overhead (``unprofiled_ratio``, None
       under load, where it drowns in the noise: a 0.9 ms batch then read 1.9 ms);
    3. the wall wait a batch times ``ran``, the share of the time the process wanted a core that it ran (an
       average over the window that a burst of load escapes), scaled as in 2.
    """
    unprofiled = unprofiled_fetch_cpu_ms_per_batch(cpu)
    if unprofiled is not None:
        return unprofiled, _UNPROFILED
    in_window = fetch_cpu_ms_per_batch(cpu)
    if in_window is not None:
        return in_window * (unprofiled_ratio or 1.0), "thread CPU"
    return wait_ms_per_batch * ran * (unprofiled_ratio or 1.0), None


def _workers_for(cores: float, threads: int) -> tuple[int, int | None]:
    """(workers, intra-op threads to set or None): ``cores.loader_workers`` and ``cores.threads_beside_workers``,
    the sizing ``skalpel tune`` tries; (0, None) with a single core."""
    workers = loader_workers(cores)
    return (0, None) if workers is None else (workers, threads_beside_workers(cores, threads))


def worker_advice(cpu: dict | None, *, device: bool = True) -> str:
    """How many DataLoader workers to use: never more than the cores the capture saw (one stays for training).

    ``pin_memory`` only with a device: pinned pages speed host-to-device copies, and a CPU-only run makes none.
    """
    pin = "pin_memory=True, " if device else ""
    cores = usable_cores(cpu) if cpu else None
    if cores is None:
        return f"DataLoader(num_workers=N up to the cores the machine has, {pin}persistent_workers=True)"
    if cores < 2:
        return f"with {cores:g} usable core, worker processes would only compete with training"
    workers = loader_workers(cores)
    return (f"DataLoader(num_workers={workers}, {pin}persistent_workers=True, prefetch_factor=2) "
            f"({cores:g} usable cores)")  # fmt: skip


def _unique(locations: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(location for location in locations if location))


DATALOADER_BOUND = Rule(
    id="dataloader_bound",
    family="input",
    severity="warning",
    title="The step waits for data {share_pct:.0f}% of the time ({ms_per_step:.1f} ms of the {mean_step_ms:.1f} ms mean step)",
    thresholds=thresholds.DATALOADER_BOUND,
    check=_check_dataloader,
    fix="DataLoader(num_workers=N, one per usable core, at most 4; pin_memory=True, "
    "persistent_workers=True, prefetch_factor=2); make __getitem__ cheap (decode/augment once, cache, or move "
    "transforms to the device)",
    docs=Docs(
        what="The training loop waits for the next batch: the main thread's time inside a DataLoader fetch "
        "(`enumerate(DataLoader)#...__next__`, or the loader's start), the ledger's `data_wait` on the host "
        "(skalpel explain ledger), with one-time work taken out. The part the device idled meanwhile, what a "
        "faster fetch saves there, is said beside it (`device_idle_ms_per_step`): the PyTorch Profiler "
        "TensorBoard plugin's DataLoader category counts only that part.",
        why="While the loop waits for data the device and the host compute nothing. That time is pure loss, "
        "and it grows with a faster model or device.",
        evidence="`share_pct` of the mean unit and `ms_per_step` (both from the ledger; under measured CPU "
        "contention with `num_workers=0`, `share_pct` is the fetch's share of the process's CPU time where it is the "
        "larger, `wall_share_pct` beside it: the scheduler stretches the parts of a step unevenly), the mean step "
        "(`mean_step_ms`: the title quotes it, so that its figures agree), on a device the part of the wait it "
        "idled (`device_idle_ms_per_step`; the title says it where the device ran queued work for a fifth of the "
        "wait or more), what it was judged over (`judged_over`: the marked steps; without markers the loop's "
        "iterations, or the whole window), "
        "the worst step's wait, and the DataLoader iterator type (`_SingleProcessDataLoaderIter` means num_workers=0). "
        "With the capture's CPU facts, what the fix weighed: the compute per step, the most a cheap `__getitem__` "
        "and the workers can gain (`workers_speedup_up_to` 1.0 where workers are not advised), the batches per "
        "step and the fetch per batch (`fetch_ms_per_batch`, scaled by `unprofiled_ratio` where the profiler's "
        "overhead was measured), and under contention the cores the other processes hold (`cores_held_by_others`) "
        "and the fetch's time on a core. "
        "The locations are the user code the wait is busy with (a Dataset's `__getitem__`), then the user "
        "function that iterates the loader.",
        fix="Load batches in worker processes (`num_workers` > 0, `persistent_workers=True`, `prefetch_factor`), "
        "pin host memory (`pin_memory=True`) and copy with `non_blocking=True`; make `__getitem__` cheap "
        "(pre-decode, cache, vectorise transforms or run them on the device). Workers are not advised where they "
        "cannot pay: the compute fills nearly the whole step, one usable core, or a batch takes less to make than a "
        "worker takes to hand one over (`cores.WORKER_HANDOFF_MS`, ~1.5 ms); the fix then says so with its "
        "numbers. Other load on the machine is no veto: while the main thread waits for its batch its core is "
        "idle, and a worker gets its own share of the cores (mnist_rnn on a loaded 2-core machine: "
        "num_workers 0 -> 1 2.8x faster).",
        false_positives="The first steps after a DataLoader is created (workers starting up) wait longer; profile "
        "after warm-up. An iterable that is not a DataLoader is not seen at all (its time shows as CPU Exec).",
    ),
)


def _check_oversubscribed(ctx: Context, rule: Rule) -> Outcome:
    cpu = ctx.capture.cpu if ctx.capture is not None else None
    if not cpu or not cpu.get("loader_workers"):
        return NotJudged("no DataLoader workers recorded: a capture by skalpel run records them", applies=False)
    cores = usable_cores(cpu) or 1.0
    threads = int(cpu.get("intra_op_threads") or 1)
    processes = int(cpu.get("processes") or 1)
    workers = int(cpu["loader_workers"])
    asked = threads * processes + workers
    if 100.0 * asked / cores < rule.thresholds.share_pct or asked - cores < rule.thresholds.floor:
        return []
    wait, step = job_data_wait_ms(ctx) or (0.0, 0.0)
    compute = max(step - wait, 0.0)
    evidence = {
        "loader_workers": workers, "intra_op_threads": threads, "processes": processes, "usable_cores": cores,
        "threads_asked": asked, "asked_pct_of_cores": 100.0 * asked / cores, "wait_ms_per_step": wait, "compute_ms_per_step": compute,
    }  # fmt: skip
    per_process = max(int(cores) // processes, 1)
    fit_workers, fit_threads = workers_that_fit(workers, threads, per_process) or (workers, None)  # what tune times
    if fit_threads is None:
        costly = f"num_workers={fit_workers}, the cores the {threads} intra-op thread(s) leave free"
    else:
        costly = f"num_workers={fit_workers} with torch.set_num_threads({fit_threads})"
    measures, no_workers = workers_measured(ctx, cpu)
    evidence.update(measures)
    if no_workers is not None:  # the workers' own CPU time says a batch costs less than handing it over
        return [rule.finding(evidence, fix=f"{no_workers} (workers that fit the cores, {costly}, would still pay "
                                           "the hand-over on every batch)")]  # fmt: skip
    # workers hide the making of a batch behind the compute when it takes less than the compute: keep them, fitted
    # to the cores; none only where a worker's hand-over (start-up, IPC) costs more than the fetch it takes away
    fix = (f"{costly} (workers that fit the cores hide the making of a batch behind the {compute:.1f} ms of compute "
           "per step, when a batch takes less than that to make); num_workers=0 only where a batch takes less to "
           f"make than a worker takes to hand one over (~{WORKER_HANDOFF_MS:g} ms: start-up, collate, pickle, "
           "queue), so that the workers cost more than the fetch they take away (time both)")  # fmt: skip
    return [rule.finding(evidence, fix=fix)]


LOADER_OVERSUBSCRIBED = Rule(
    id="loader_oversubscribed",
    family="input",
    severity="info",
    title="{loader_workers} DataLoader worker(s) beside {intra_op_threads} intra-op thread(s) on {usable_cores:g} "
    "usable core(s): the workers compete with training for the cores",
    thresholds=thresholds.LOADER_OVERSUBSCRIBED,
    check=_check_oversubscribed,
    scope="job",
    fix="workers and intra-op threads that together fit the usable cores; num_workers=0 only for batches cheaper "
    "to make than a worker's hand-over (start-up, IPC)",
    docs=Docs(
        what="The script asked for more DataLoader worker processes than the cores its intra-op threads leave "
        "free: workers + intra-op threads x processes exceed the usable cores (affinity, cgroup quota) by at "
        "least the floor. Read from the CPU facts the capture recorded.",
        why="Each worker is a process that wants a core while it makes a batch; on cores the intra-op threads "
        "already fill, workers and threads take turns, and every batch is also copied between processes. For "
        "batches that are cheap to make, `num_workers=0` is faster: 4 workers on 2 cores for a TensorDataset "
        "ran 1.15-1.2x slower than none.",
        evidence="The workers, intra-op threads and processes, the usable cores, the threads asked, and the "
        "step's wait for data and its compute (ms per step, from the ledger).",
        fix="Workers on the cores the intra-op threads leave free, or fewer intra-op threads "
        "(`torch.set_num_threads`): workers hide the making of a batch behind the step's compute when a batch "
        "takes less to make than that compute. `num_workers=0` wins only where a batch takes less to make than a "
        "worker takes to hand one over (`cores.WORKER_HANDOFF_MS`, ~1.5 ms: start-up, collate, pickle, queue): "
        "there the workers cost more than the fetch they take away (time both).",
        false_positives="Workers that mostly sleep (a prefetch queue kept full by cheap batches) cost little; "
        "the finding is an info note, and `cpu_contention` says when the cores were really short.",
    ),
)


def _check_pageable(ctx: Context, rule: Rule) -> Outcome:
    result = ctx.analyses.syncs
    limits = rule.thresholds
    findings = []
    for rank_id, rank in result.ranks.items():  # every rank of the trace, in its order
        window = window_of(ctx, rank_id)
        if not window.count:
            continue
        copies = rank.pageable_htod if rank is not None else None
        if copies is None or copies.count == 0:
            continue
        ms = copies.device_ms / window.count  # per judged unit, as the step it is a share of
        bytes_per_step = copies.total_bytes / window.count
        share = pct(ms, window.mean_step_ms)
        if share < limits.share_pct or ms < limits.floor or bytes_per_step < limits.param("min_bytes_per_step"):
            continue
        evidence = {
            "share_pct": share,
            "ms_per_step": ms,
            "copies_per_step": copies.count / window.count,
            "mib_per_step": bytes_per_step / 2**20,
            "gb_per_s": copies.total_bytes / 1e9 / (copies.device_ms / 1000.0) if copies.device_ms > 0 else 0.0,
            "events": list(copies.worst_events),
        }
        severity = "warning" if share >= limits.param("warning_pct") else "info"
        locations = ctx.locations(list(copies.worst_events))
        findings.append(rule.finding(evidence, locations=locations, severity=severity, rank=window.rank))
    return findings


PAGEABLE_MEMCPY = Rule(
    id="pageable_memcpy",
    family="input",
    severity="warning",
    title="{mib_per_step:.1f} MiB/step copied to the device from pageable memory ({ms_per_step:.2f} ms/step, {share_pct:.1f}% of the step)",
    thresholds=thresholds.PAGEABLE_MEMCPY,
    check=_check_pageable,
    needs_device=True,
    fix="pin host memory: DataLoader(pin_memory=True) or tensor.pin_memory(), then .to(device, non_blocking=True)",
    docs=Docs(
        what="Host-to-device copies whose source is pageable (not pinned) host memory: copies named "
        "`Memcpy HtoD (Pageable -> Device)`.",
        why="A pageable copy is staged through a driver buffer at lower bandwidth, and the host thread blocks "
        "until it is done, so it can neither overlap with compute nor let the host run ahead.",
        evidence="Pageable copy time per step and its share of the step, copies and MiB per step, the achieved "
        "bandwidth, and the longest copy events' indices; an info note below `warning_pct` of the step. The location is the user code that issued the copy.",
        fix="Pin the source: `DataLoader(pin_memory=True)` or `tensor.pin_memory()`; then copy with "
        "`.to(device, non_blocking=True)` so the copy overlaps with compute.",
        false_positives="One-off copies of a few bytes (a scalar, a shape) are pageable by nature and harmless; "
        "the floors (MiB and ms per step) leave them out.",
    ),
)

RULES = (DATALOADER_BOUND, LOADER_OVERSUBSCRIBED, PAGEABLE_MEMCPY)
