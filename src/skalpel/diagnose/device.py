"""Device findings: the device waits (gpu_idle), the host cannot feed it (launch_bound), attention is unfused."""

from __future__ import annotations

import dataclasses

import numpy as np

from ..analysis import numeric
from ..analysis.blame import UNTRACED
from ..analysis.ledger import DEVICE_IDLE
from . import thresholds
from .common import data_wait_ms, named_at
from .overhead import check_cpu_overhead, source_fix
from .rule import Context, Docs, NotJudged, Outcome, Rule
from .sdpa import check_sdpa


def _steps_on(ctx: Context, rank: int) -> int:
    return max(len(ctx.steps.for_rank(rank)), 1)


def _check_gpu_idle(ctx: Context, rule: Rule) -> Outcome:
    """Idle share of the marked steps; without markers, of HTA's device span (the window's edges are set-up)."""
    result, hta, gaps = ctx.analyses.step_device, ctx.analyses.gpu_time, ctx.analyses.idle_gaps
    if result is None or hta is None or gaps is None:
        return NotJudged("no device activity")
    limits = rule.thresholds
    findings = []
    for rank, device in result.ranks.items():
        gpu = hta.for_rank(rank)
        if device is None or gpu is None or gpu.span_us <= 0:
            continue
        steady = _steady_device(ctx, rank)
        if steady is not None:  # one-time work found: the units after it, as the ledger counts them
            idle_pct, idle_ms = steady.share_pct(*DEVICE_IDLE), steady.ms_per_unit(*DEVICE_IDLE)
            steps = len(steady.units)
            step_ms = numeric.median([unit.length_ms for unit in steady.units])
            consistent = _units_idle_at_least(steady, limits.share_pct)
            judged_over = _steady_words(ctx, rank, steps)
        elif result.marked:
            idle_pct, idle_ms, steps, step_ms = device.idle_pct, device.idle_ms_per_step, device.steps, device.median_step_ms
            consistent, judged_over = device.steps_idle_at_least(limits.share_pct), "marked steps"
            lane = _device_lane(ctx, rank)
            if lane is not None and lane.ms_per_unit("one_time") > 0:  # every step holds one-time work: taken out
                idle_pct, idle_ms = lane.share_pct(*DEVICE_IDLE, steady=True), lane.ms_per_unit(*DEVICE_IDLE)
                judged_over = "marked steps, one-time work taken out"
        else:
            idle_pct, idle_ms, steps, step_ms = gpu.idle_pct, gpu.idle_us / 1000.0, 1, gpu.span_us / 1000.0
            consistent, judged_over = 100.0, "the device's span (no ProfilerStep markers)"
        held = steps >= limits.param("min_steps") and consistent >= limits.param("consistent_steps_pct")
        if idle_pct < limits.share_pct or (idle_ms < limits.floor and not held):
            continue
        split = gpu.idle_breakdown_pct
        if steady is not None:  # the ledger's own account of the device idling while the host fetched
            idle_total = idle_ms * steps
            loader = min(100.0 * steady.total_ms["data_wait"] / idle_total, 100.0) if idle_total > 0 else 0.0
        else:
            loader = _idle_in_dataloader_pct(gaps.for_rank(rank), idle_ms * steps)
        evidence = {
            "idle_pct": idle_pct,
            "idle_ms_per_step": idle_ms,
            "step_ms": step_ms,
            "steps": steps,
            "steps_idle_pct": consistent,  # share of the steps idle at least share_pct
            "judged_over": judged_over,
            "host_wait_pct": split.get("host_wait", 0.0),
            "kernel_wait_pct": split.get("kernel_wait", 0.0),
            "other_wait_pct": split.get("other", 0.0),
            "idle_in_dataloader_pct": loader,
            "hta_idle_pct": gpu.idle_pct,  # HTA's span: first to last device event
            "hta_compute_pct": gpu.compute_pct,
        }
        blamed = _blame_of(ctx, rank)
        numbers = {unit.number for unit in steady.units} if steady is not None else None
        peer = late_peer(blamed.peers) if blamed is not None else None
        culprits = _culprits(ctx, blamed, steps, peer, steady=numbers is not None) if blamed is not None else []
        if blamed is not None:  # per step as judged here: the window's total without markers
            by_category = _blamed_ms(blamed, numbers)
            evidence["blame_ms_per_step"] = {key: value / steps for key, value in by_category.items() if value > 0}
            evidence["culprits"] = culprits
        title, fix, events = None, rule.fix, gaps.for_rank(rank).after_longest_gaps
        lead = _lead(ctx, blamed, limits.param("cause_pct"), numbers) if blamed is not None else None
        if loader >= limits.param("loader_idle_pct"):
            title = rule.title.format(**evidence) + f"; {loader:.0f}% of it inside DataLoader.__next__"
            fix = "the device waits for the next batch: " + DATALOADER_FIX
            events = ctx.analyses.loader_ranges.for_rank(rank).ranges
        elif lead is not None:  # one cause dominates: lead with it, its lines and its fix
            lead["waiting_for"] = peer if lead["category"] == "collective_wait" else None
            title = rule.title.format(**evidence) + f"; {lead['share_pct']:.0f}% of it {_cause_words(lead)}"
            title += f" ({_short(lead['label'])})" if lead["category"] != "unexplained" else ""
            fix = _cause_fix(lead, step_ms < limits.param("small_step_ms"))
            events = np.array(blamed.top(lead["category"])[0].events, dtype=np.int64)
            evidence["lead_cause"] = lead["category"]
        elif step_ms < limits.param("small_step_ms"):
            fix = SMALL_STEP_FIX
        elif culprits:
            events = np.array([event for item in blamed.contributors[:3] for event in item.events], dtype=np.int64)
        severity = rule.severity_for(idle_pct)
        findings.append(rule.finding(evidence, locations=ctx.locations(events), severity=severity, fix=fix, rank=rank, title=title))
    return findings


def _device_lane(ctx: Context, rank: int):
    ledger = ctx.analyses.ledger.for_rank(rank) if ctx.analyses.ledger is not None else None
    return ledger.lane("device") if ledger is not None else None


def _steady_device(ctx: Context, rank: int):
    """The device lane over the units without one-time work (``RankLedger.steady_lane``), where one-time work was
    found and some unit is free of it: gpu_idle and launch_bound judge the steady state, as hot_op and
    dataloader_bound do, not a cold first iteration that cold_start already reports."""
    ledger = ctx.analyses.ledger.for_rank(rank) if ctx.analyses.ledger is not None else None
    return ledger.steady_lane("device") if ledger is not None and ledger.unit != "window" else None


def _steady_words(ctx: Context, rank: int, count: int) -> str:
    """'4 marked steps after one-time work' or '5 iterations found from the loop after one-time work (...)'."""
    ledger = ctx.analyses.ledger.for_rank(rank)
    if ledger.unit == "step":
        return f"{count} marked step{'s' if count != 1 else ''} after one-time work"
    return (f"{count} iteration{'s' if count != 1 else ''} found from the loop after one-time work (no ProfilerStep "
            "markers)")  # fmt: skip


def _units_idle_at_least(lane, share_pct: float) -> float:
    """Share of the lane's units (in %) whose own idle share reaches ``share_pct``."""
    shares = [100.0 * sum(unit.ms.get(cause, 0.0) for cause in DEVICE_IDLE) / unit.length_ms
              for unit in lane.units if unit.length_ms > 0]  # fmt: skip
    return 100.0 * sum(share >= share_pct for share in shares) / len(shares) if shares else 0.0


def _blamed_ms(blamed, numbers: set[int] | None) -> dict[str, float]:
    """Blame's idle time by cause, over the steady units when ``numbers`` names them, else over every unit."""
    if numbers is None:
        return blamed.by_category_ms
    total: dict[str, float] = {key: 0.0 for key in blamed.by_category_ms}
    for step in blamed.steps:
        if step.number in numbers:
            for key, value in step.by_category_ms.items():
                total[key] = total.get(key, 0.0) + value
    return total


def _blame_of(ctx: Context, rank: int):
    result = ctx.analyses.blame
    found = result.for_rank(rank) if result is not None and result.applies else None
    return found if found is not None and found.idle_ms > 0 else None


def _culprits(ctx: Context, blamed, steps: int, peer: str | None, count: int = 3, *,
              steady: bool = False) -> list[dict]:  # fmt: skip
    """The largest causes of the idle time, each with its share, its time per step and its user-code line; a
    collective wait also with the late peer rank it waited for (``late_peer``). ``steady``: one-time set-up left
    out (judged after it)."""
    culprits = []
    contributors = [item for item in blamed.contributors if not (steady and item.category == "one_time_init")]
    for item in contributors[:count]:
        share = 100.0 * item.ms / blamed.idle_ms
        if share < 1.0:
            break
        culprit = {"category": item.category, "label": item.label, "share_pct": share,
                   "ms_per_step": item.ms / steps, "location": _line(ctx, item.events)}  # fmt: skip
        if item.category == "collective_wait" and peer is not None:
            culprit["waiting_for"] = peer
        culprits.append(culprit)
    return culprits


def late_peer(peers) -> str | None:
    """"rank K" when most of a rank's collective wait was spent before peer K arrived (``analysis.blame_peers``,
    the split the report's ``collective_wait_by_peer`` shows); None for one rank, or a wait that is mostly the
    transfer or in no matched collective."""
    mostly = peers.mostly if peers is not None else None
    return mostly if mostly is not None and mostly.startswith("rank ") else None


def _lead(ctx: Context, blamed, cause_pct: float, numbers: set[int] | None = None) -> dict | None:
    """The cause category holding ``cause_pct`` or more of the idle time (of the steady units' when ``numbers``
    names them), with its largest contributor."""
    by_category = _blamed_ms(blamed, numbers)
    idle = sum(by_category.values())
    category = max(by_category, key=lambda key: by_category[key]) if idle > 0 else None
    share = 100.0 * by_category[category] / idle if category is not None else 0.0
    if category is None or share < cause_pct or not blamed.top(category):
        return None
    top = blamed.top(category)[0]
    return {"category": category, "label": top.label, "share_pct": share,
            "location": _line(ctx, top.events), "python": top.python, "source": top.source}  # fmt: skip


def _line(ctx: Context, events) -> str | None:
    """The user's line of these events; None without Python stacks (the finding's locations say how to get them)."""
    where = ctx.user_lines(events, limit=1) if len(events) else ()
    return where[0] if where else None


def _short(label: str, limit: int = 60) -> str:
    """A range or kernel name short enough for a title (C++ templates and graph hashes run to hundreds)."""
    return label if len(label) <= limit else label[: limit - 3] + "..."


def with_late_peer(finding, peers):
    """A gpu_idle finding of one rank, judged before the job's ranks were compared (``job.join``), with the late
    peer it waited for in collectives named as a whole trace names it; any other finding as it is."""
    peer = late_peer(peers)
    culprits = finding.evidence.get("culprits") or []
    if finding.id != GPU_IDLE.id or peer is None or not any(c["category"] == "collective_wait" for c in culprits):
        return finding
    culprits = [{**c, "waiting_for": peer} if c["category"] == "collective_wait" else c for c in culprits]
    evidence, title, fix = {**finding.evidence, "culprits": culprits}, finding.title, finding.fix
    if evidence.get("lead_cause") == "collective_wait":
        lead = {**next(c for c in culprits if c["category"] == "collective_wait"), "waiting_for": peer}
        title = title.replace(f"of it {_CAUSE_WORDS['collective_wait']}", f"of it {_cause_words(lead)}")
        fix = _cause_fix(lead, small_steps=False)  # small steps change only the launch-overhead fix
    return dataclasses.replace(finding, evidence=evidence, title=title, fix=fix)


def _cause_words(lead: dict) -> str:
    if lead.get("waiting_for"):
        return f"waiting in collectives for {lead['waiting_for']}"
    return _CAUSE_WORDS[lead["category"]]


_CAUSE_WORDS = {
    "data_loading": "waiting for data",
    "host_compute": "host work before the next launch",
    "compile": "in torch.compile compilation",
    "sync": "after syncs that drained the queue",
    "launch_overhead": "in launch overhead",
    "collective_wait": "waiting on collectives",
    "one_time_init": "in one-time set-up",
    "other_stream": "waiting on another stream or event",
    "unexplained": "unexplained (the trace does not link it to a cause)",
}


# what to do with host work the device waits for, whether a recorded op covers it or not
_OFF_THE_PATH = ("move it off the step's critical path (precompute it once, run it every N steps, or overlap it "
                 "with device work), or make it cheaper")  # fmt: skip
# host work by what it is: the fix follows the cause, not the symptom (a cudaFree is not Python to move to workers)
_HOST_WORK_FIXES = {
    "op": "the host dispatches {what} while the device waits: the ops are too small for the device to hide "
    "their launch; fewer, larger ops (torch.compile, a bigger batch) or CUDA graphs (mode='reduce-overhead')",
    "runtime": "the host is in {what} while the device waits: a runtime call inside the step; keep it out of the "
    "loop",
    "allocator": "{what} runs inside the step: the caching allocator goes to the driver (torch.cuda.empty_cache() "
    "in the loop, or fragmentation); drop empty_cache, set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
    "collective": "the host waits in {what} while the device idles: see communication_bound and straggler_rank; "
    "issue collectives with async_op=True and overlap them with compute",
    "sync": "{what} blocks the host until the device drains, then the device waits for the next launch: keep "
    "values on the device, read them every N steps, use non_blocking copies",
}


def _cause_fix(lead: dict, small_steps: bool) -> str:
    """The fix for the cause that holds most of the idle time, naming it and its line."""
    category = lead["category"]
    between_ops = lead["label"] == UNTRACED or lead.get("python")  # Python between ops, named or not
    if small_steps and category != "data_loading" and (category == "launch_overhead" or between_ops):
        return SMALL_STEP_FIX  # the fixed cost of each short step, not one piece of host work
    if category == "host_compute" and lead["label"] == UNTRACED:
        before = f" (up to {lead['location']})" if lead.get("location") else ""
        return f"the host runs Python that no recorded op covers{before} while the device waits: {_OFF_THE_PATH}"
    if category == "host_compute" and lead.get("source") in _HOST_WORK_FIXES:
        return _HOST_WORK_FIXES[lead["source"]].format(what=named_at(_short(lead["label"]), lead.get("location")))
    if category == "collective_wait" and lead.get("waiting_for"):
        category = "collective_wait_for_peer"
    template = _CAUSE_FIXES.get(category, _UNLINKED_FIX)
    return template.format(what=named_at(_short(lead["label"]), lead.get("location")), late=lead.get("waiting_for"))


DATALOADER_FIX = "DataLoader(num_workers=4 or more, pin_memory=True, persistent_workers=True, prefetch_factor=2)"

# the fix per cause category: {what} is the largest contributor and its line, {late} the peer rank waited for
_CAUSE_FIXES = {
    "data_loading": "the device waits for the next batch: " + DATALOADER_FIX,
    "host_compute": "the host runs {what} while the device waits: " + _OFF_THE_PATH,
    "sync": "{what} drains the device's queue and the device then idles until the host launches again: keep values "
    "on the device, read them every N steps, use non_blocking copies",
    "compile": "torch.compile compiles inside the measured steps ({what}): warm the compiled model up before "
    "profiling, and avoid recompilations (torch._dynamo.mark_dynamic for varying shapes)",
    "one_time_init": "one-time set-up inside the recorded window ({what}): profile after warm-up steps "
    "(schedule(wait=1, warmup=2, active=N)); it is not a steady-state cost",
    "launch_overhead": "the host cannot launch fast enough: fewer, bigger kernels (torch.compile), CUDA graphs "
    "(mode='reduce-overhead')",
    "collective_wait": "the device waits on collectives ({what}): look for a straggler rank (see the rank findings), "
    "overlap communication with compute",
    "collective_wait_for_peer": "the device waits in collectives ({what}) for {late}, which arrives last: find what "
    "{late} does before the collective that the others do not (its own findings, the rank comparison), balance the "
    "work across ranks, overlap communication with compute",
    "other_stream": "work queued in time waits on another stream or an event ({what}): check the dependencies "
    "between streams (wait_stream, events) and overlap the work they wait for",
}
_UNLINKED_FIX = "the trace does not link the idle time to its cause (no correlation between launches and device work)"


SMALL_STEP_FIX = (
    "short steps: the host's fixed cost per step (Python, launches, syncs) leaves the device idle; replay the step "
    "as a CUDA graph (torch.compile(model, mode='reduce-overhead') or torch.cuda.graphs), use larger batches, "
    "and move host-side ops (logging, .item(), per-sample Python) out of the step"
)


def _idle_in_dataloader_pct(gaps, idle_ms: float) -> float:
    """Share of the rank's device idle time (``idle_ms`` in all) that falls inside DataLoader ranges."""
    if idle_ms <= 0:
        return 0.0
    return min(100.0 * gaps.idle_in_loader_us / 1000.0 / idle_ms, 100.0)


GPU_IDLE = Rule(
    id="gpu_idle",
    family="device",
    severity="warning",
    title="The GPU is idle {idle_pct:.0f}% of {judged_over} ({idle_ms_per_step:.2f} ms per step, median step {step_ms:.2f} ms; host wait {host_wait_pct:.0f}% of it)",
    thresholds=thresholds.GPU_IDLE,
    check=_check_gpu_idle,
    needs_device=True,
    fix="find what the host does while the device waits (data loading, syncs, Python overhead); "
    "overlap it with device work or move it off the critical path",
    docs=Docs(
        what="The share of the marked steps (streams merged) when no kernel, copy or memset runs; without "
        "ProfilerStep markers, of the device's span from the first to the last device event, as HTA measures it "
        "(the host-only edges of such a window are set-up, not steady state; the evidence says which). Where the "
        "ledger found one-time work and units free of it (marked steps, or the loop's iterations without markers), "
        "those units are judged: the steady state, as hot_op and dataloader_bound judge it; cold_start reports the "
        "rest. "
        "The idle time is split as Holistic Trace Analysis does into host wait (the next work was launched after "
        "the device went idle), kernel wait (short gaps between back-to-back kernels) and other. HTA's own idle "
        "share spans the first to the last device event (a step whose only kernel runs 11 us reads as busy "
        "there); it is kept in the evidence as `hta_idle_pct`. Below the per-step floor the rule still fires when "
        "the idle share holds in `consistent_steps_pct` of `min_steps` or more steps: a 1 ms step that idles "
        "80% every time is the pattern that matters most when it repeats a million times.",
        why="An idle accelerator is the most expensive resource in the job doing nothing; the step cannot get "
        "faster than the work the host hands it.",
        evidence="`idle_pct` of the steps, idle ms per step (the mean, so the blame's categories add up to it), "
        "`step_ms` (the median step, the statistic the report's footer and HTML quote), the share of steps that idle that much "
        "(`steps_idle_pct`), what it was judged over, the host-wait / kernel-wait / other split, the share of the "
        "idle time inside `DataLoader.__next__` (from `loader_idle_pct` on, the finding names the loader and "
        "locates its calls), and HTA's idle and compute shares. The blame analysis charges every idle interval to "
        "its cause (`blame_ms_per_step` by category, see `skalpel explain blame`), and `culprits` names the largest "
        "with their share, time per step and line; when one holds `cause_pct` or more of the idle time the title "
        "and fix lead with it and the locations are its. Otherwise the locations are the launch sites of "
        "the work that ended the longest gaps.",
        fix="Host wait: remove what stalls the host (data loading, `.item()` syncs, Python overhead; see the other "
        "findings), use CUDA graphs or torch.compile for launch overhead. Kernel wait: fuse small kernels. Short "
        "steps (under `small_step_ms`): CUDA graphs (`torch.compile(mode='reduce-overhead')`), larger batches, "
        "fewer host-side ops per step.",
        false_positives="Inference with small batches and traces that include set-up or warm-up are idle by design; "
        "a trace cut mid-step shows idle time at its edges.",
    ),
)


def _check_launch_bound(ctx: Context, rule: Rule) -> Outcome:
    if not ctx.analyses.has_device:
        return check_cpu_overhead(ctx, rule)
    result, idle, launchers = ctx.analyses.launches, ctx.analyses.gpu_time, ctx.analyses.kernel_launchers
    if result is None or launchers is None:
        return NotJudged("no device work with a known launch call")
    limits = rule.thresholds
    findings = []
    for rank, stats in result.ranks.items():
        kernels = launchers.for_rank(rank)
        if stats is None or kernels.graph_launched_pct >= limits.param("graph_launched_pct"):
            continue  # kernels replayed from a CUDA graph do not pay a launch each
        per_step = stats.kernels_per_step if stats.steps else float(stats.kernels)
        ledger = ctx.analyses.ledger.for_rank(rank) if ctx.analyses.ledger is not None else None
        if not ctx.steps.marked and ledger is not None and ledger.unit == "iteration":
            per_step = stats.kernels / max(ledger.units, 1)  # the loop's iterations, not the whole window
        idle_pct = _idle_not_waiting_for_data(ctx, idle, rank)
        if stats.tiny_kernel_pct < limits.share_pct or per_step < limits.floor or idle_pct < limits.param("min_idle_pct"):
            continue
        evidence = {
            "tiny_kernel_pct": stats.tiny_kernel_pct,
            "kernels_per_step": per_step,
            "kernel_median_us": stats.kernel_median_us,
            "launch_call_median_us": stats.launch_call_median_us,
            "gpu_idle_pct": idle_pct,  # idle share of the step, the waits taken out
        }
        evidence["tiny_ops_by_source_pct"] = {source.name: source.share_pct for source in kernels.sources}
        fix, events = source_fix(kernels.sources, rule.fix, limits.param("also_named_pct"))
        locations = ctx.locations(events) if len(events) and fix != rule.fix else ctx.locations(kernels.kernels)
        findings.append(rule.finding(evidence, locations=locations, rank=rank, fix=fix))
    return findings


# idle time spent waiting is not the host's per-op cost, whatever the kernels' size. Compiling and one-time work
# stay in where no unit is free of them: cold_start and compile_overhead judge them, and a window they dominate still
# shows its kernels' size. Where the ledger finds units after the one-time work, those (the steady state) are judged.
_NOT_OVERHEAD = ("data_loading", "sync", "collective_wait", "other_stream")
_LEDGER_WAITS = ("data_wait", "sync_wait", "collective_wait", "other_stream")  # the same waits, in the ledger's causes


def _idle_not_waiting_for_data(ctx: Context, idle, rank: int) -> float:
    """Device idle share of the step, less the idle time blame charges to waiting (for data, a sync, a collective,
    another stream); without blame, less the time the step waited for data.

    Of the steady units when the ledger found one-time work and units free of it (``_steady_device``); else of
    the marked steps when there are markers, else of HTA's device span.
    """
    steady = _steady_device(ctx, rank)
    if steady is not None:
        waiting = sum(steady.total_ms[cause] for cause in _LEDGER_WAITS)
        idle = sum(steady.total_ms[cause] for cause in DEVICE_IDLE)
        return 100.0 * max(idle - waiting, 0.0) / (steady.length_ms - waiting) if steady.length_ms > waiting else 0.0
    blamed = _blame_of(ctx, rank)
    data_ms = data_wait_ms(ctx, rank, "device")  # the device's idle time while the host waited for a batch
    waiting_share = 0.0
    if blamed is not None:
        waiting_share = sum(blamed.by_category_ms[key] for key in _NOT_OVERHEAD) / blamed.idle_ms
    in_steps = ctx.analyses.step_device
    device = in_steps.for_rank(rank) if in_steps is not None and ctx.steps.marked else None
    if device is not None and device.mean_step_ms > 0:  # the marked steps, as gpu_idle judges them
        if blamed is None:
            return 100.0 * max(device.idle_ms_per_step - data_ms, 0.0) / device.mean_step_ms
        return _share_left(device.idle_ms_per_step, device.mean_step_ms, waiting_share)
    gpu = idle.for_rank(rank) if idle is not None else None
    if gpu is None or gpu.span_us <= 0:
        return 0.0
    if blamed is not None:
        return _share_left(gpu.idle_us, gpu.span_us, waiting_share)
    steps = _steps_on(ctx, rank)
    idle_ms = max(gpu.idle_us / 1000.0 / steps - data_ms, 0.0)
    return 100.0 * idle_ms / (gpu.span_us / 1000.0 / steps)


def _share_left(idle: float, span: float, waiting_share: float) -> float:
    """Idle share of the time left when the waits are taken out of both: a cold start that holds most of a window
    does not hide that the steady state after it idles for the host."""
    waiting = waiting_share * idle
    return 100.0 * max(idle - waiting, 0.0) / (span - waiting) if span - waiting > 0 else 0.0


LAUNCH_BOUND = Rule(
    id="launch_bound",
    family="device",
    severity="warning",
    title="Launch bound: {tiny_kernel_pct:.0f}% of {kernels_per_step:.0f} kernels/step run shorter than their launch",
    thresholds=thresholds.LAUNCH_BOUND,
    check=_check_launch_bound,
    fix="fewer, bigger operations: torch.compile (fuses elementwise ops), CUDA graphs (mode='reduce-overhead'), "
    "vectorise Python loops over tensors, bigger batches",
    docs=Docs(
        what="Many tiny operations: on a device, most kernels run for less time than the host call that launched "
        "them, thousands per step, while the device sits idle; on a CPU-only trace, thousands of host ops per step "
        "that each take microseconds, so framework dispatch and Python dominate the step.",
        why="Each op pays a fixed cost (Python, dispatcher, kernel launch of ~5-10 us) however little it computes. "
        "When ops are tiny that fixed cost is the step time, and a faster device does not help.",
        evidence="Device: share of tiny kernels, kernels per step, median kernel and launch-call durations, GPU idle "
        "share once the idle time the blame analysis charges to waiting (for data, a sync, a collective, another stream) is taken out of the idle time and of the step (at least `min_idle_pct`), "
        "over the units free of one-time work where the ledger found some (as gpu_idle), and kernels per iteration "
        "without markers. CPU: ops per step, share of ops shorter than `tiny_us`, median op time, share of the step not "
        "spent in substantial ops nor blocked in a collective (`collective_ms_per_step`; the fix then names no CUDA "
        "graphs: there is no device to replay them on). Both: the tiny ops by source (`tiny_ops_by_source_pct`: data loading inside "
        "DataLoader.__next__, the optimizer step inside Optimizer.step#..., the model and the rest); the fix leads "
        "with the largest source's, then names each other source with 20% of the tiny ops or more "
        "(`also_named_pct`); the locations follow the largest source. Locations: the user code issuing the ops.",
        fix="Fuse: `torch.compile(model)`; replay with CUDA graphs (`mode='reduce-overhead'`); replace Python loops "
        "over elements or small tensors by batched tensor ops; increase the batch size. When the data loading makes "
        "most tiny ops (a Dataset indexed one sample at a time, then collated): fetch whole batches. When the "
        "optimizer does: `foreach=True` or `fused=True`.",
        false_positives="Decode-time inference is launch bound by nature (use CUDA graphs there). A trace whose "
        "kernels are replayed by one graph launch is not counted as launch bound.",
    ),
)


def _check_attention(ctx: Context, rule: Rule) -> Outcome:
    findings = []
    for rank in ctx.analyses.attention.ranks:
        steps = _steps_on(ctx, rank.rank)
        if rank.sdpa is not None:  # its math path runs bmm + softmax inside: judged as SDPA, with the backend it used
            findings.extend(check_sdpa(ctx, rule, rank, steps))
            continue
        eager = rank.eager
        if eager is None:
            continue  # no softmax between batched matmuls: not the eager attention pattern
        share = 100.0 * (eager.softmax_ms + eager.matmul_ms) / rank.device_ms if rank.device_ms > 0 else 0.0
        ms = (eager.softmax_ms + eager.matmul_ms) / steps
        if share < rule.thresholds.share_pct or ms < rule.thresholds.floor:
            continue
        evidence = {
            "share_pct": share,
            "ms_per_step": ms,
            "bmm_ms": eager.matmul_ms / steps,
            "softmax_ms": eager.softmax_ms / steps,
            "bmm_calls": eager.matmul_calls,
            "softmax_calls": eager.softmax_calls,
            "fused_attention_seen": eager.fused_seen,
        }
        findings.append(rule.finding(evidence, locations=ctx.locations(eager.softmax_events), rank=rank.rank))
    return findings


ATTENTION_HOTSPOT = Rule(
    id="attention_hotspot",
    family="device",
    severity="warning",
    title="Unfused attention (bmm + softmax) takes {share_pct:.0f}% of device time ({ms_per_step:.1f} ms/step)",
    thresholds=thresholds.ATTENTION_HOTSPOT,
    check=_check_attention,
    needs_device=True,
    fix="use torch.nn.functional.scaled_dot_product_attention (flash / memory-efficient kernels), "
    "e.g. attn_implementation='sdpa' in Hugging Face models",
    docs=Docs(
        what="Attention computed eagerly as batched matmuls around a softmax (`aten::bmm` / `baddbmm` + "
        "`aten::softmax`), taking a large share of device time, instead of a fused attention kernel; or "
        "`scaled_dot_product_attention` landing in its math fallback (a warning) or its memory-efficient kernel "
        "(an info note), named with the backend it actually ran and the device time of the kernels it launched.",
        why="Eager attention writes the full sequence x sequence score matrix to memory and reads it back several "
        "times; fused kernels (FlashAttention, memory-efficient attention) keep it on chip, running several times "
        "faster and using far less memory at long sequence lengths.",
        evidence="Device time share and ms per step of the bmm + softmax ops, their call counts, and whether any "
        "fused attention op or kernel appears elsewhere in the trace. Locations: the code calling softmax. For "
        "SDPA: the backend, its share and ms per step (forward kernels), the calls, the query's head dim and "
        "whether an explicit mask was passed (from the recorded shapes), and the usual reasons flash was not "
        "chosen (an explicit mask, head dim, fp32 inputs, dropout before torch 2.1).",
        fix="Call `torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=..., is_causal=...)`; in "
        "Hugging Face models pass `attn_implementation='sdpa'` (or 'flash_attention_2').",
        false_positives="Models that use bmm and softmax for something other than attention (mixture-of-experts "
        "routing, classification heads with batched matmuls) match the same pattern.",
    ),
)

RULES = (GPU_IDLE, LAUNCH_BOUND, ATTENTION_HOTSPOT)
