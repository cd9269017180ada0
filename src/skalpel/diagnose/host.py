"""host_bound: on a CPU-only run, the main thread spends much of the step in host work outside torch ops.

A CPU-only trace has no device to go idle; the blame's compute there is the main thread's own
ops, and the step's time outside them is charged to what the thread did (``analysis.blame``):
Python between ops named by the user's function running it ("augment() in train.py:12"), a
``record_function`` range, an op around it. When that host work (``host_compute``) holds most
of the time outside the ops and the time outside is a large share of the step, the finding
names the largest pieces, each with its share and line. A fetch or a collective there is
``dataloader_bound``'s or ``communication_bound``'s; thousands of tiny ops are ``launch_bound``'s.
"""

from __future__ import annotations

from ..analysis.blame import UNTRACED
from . import thresholds
from .common import named_at
from .device import LAUNCH_BOUND
from .overhead import check_cpu_overhead
from .rule import Context, Docs, NotJudged, Outcome, Rule

HOST_WORK = ("python", "unrecorded")  # the ledger's causes that are the user's host work on the main thread

_FORWARD_FIX = ("it runs inside the model's forward (per-element indexing, .item(), Python loops over tokens or "
                "experts): express it as whole-tensor ops (masks, torch.where, gather/scatter, index_add), keep values "
                "as tensors instead of .item(), or torch.compile the module")  # fmt: skip

_FIX = ("take it off the training thread or out of the step: data built or augmented there goes to DataLoader "
        "workers (num_workers > 0) or is prepared once before training; per-item Python loops become numpy/torch "
        "ops on whole arrays; checkpoints, logging and metrics run every N steps (or in a background thread)")  # fmt: skip


def _check_host_bound(ctx: Context, rule: Rule) -> Outcome:
    if ctx.analyses.has_device:
        return NotJudged("a device run: the device's idle time is gpu_idle's", applies=False)
    result = ctx.analyses.blame
    if result is None or not result.ranks:
        return NotJudged("no steps with host ops")
    limits = rule.thresholds
    tiny_ops = check_cpu_overhead(ctx, LAUNCH_BOUND)  # thousands of tiny ops: the Python between them is theirs
    tiny_op_ranks = {finding.rank for finding in tiny_ops} if isinstance(tiny_ops, list) else set()
    findings = []
    for rank, blamed in result.ranks.items():
        ledger = ctx.analyses.ledger.for_rank(rank) if ctx.analyses.ledger is not None else None
        host = ledger.lane("host") if ledger is not None else None
        if rank in tiny_op_ranks or host is None:
            continue
        count = max(len(blamed.steps), 1)
        span_ms = sum(step.end_us - step.start_us for step in blamed.steps) / 1000.0
        # the host work is the ledger's: the user's Python between ops, and time nothing recorded covers; not a
        # fetch, a collective (another thread's included), the gaps between back-to-back ops, one-time work
        work_pct = host.share_pct(*HOST_WORK, steady=True)
        host_ms = host.ms_per_unit(*HOST_WORK) * count
        if span_ms <= 0 or blamed.idle_ms <= 0:
            continue
        outside_pct = 100.0 * blamed.idle_ms / span_ms
        if work_pct < limits.share_pct or host_ms / count < limits.floor:
            continue
        top = blamed.top("host_compute")
        culprits = []
        for item in top[:3]:
            share = 100.0 * item.ms / span_ms
            if share < 1.0:
                break
            where = ctx.user_lines(item.events, limit=1) if item.events else ()
            culprits.append({"label": item.label, "share_pct": share, "ms_per_step": item.ms / count,
                             "location": where[0] if where else None})  # fmt: skip
        if not culprits:
            continue
        lead = culprits[0]
        evidence = {
            "host_work_pct": work_pct,
            "host_work_ms_per_step": host_ms / count,
            "step_ms": span_ms / count,
            "judged_over": ledger.describe(),
            "outside_ops_pct": outside_pct,
            "culprits": culprits,
        }
        ratio = ctx.capture.unprofiled_ratio() if ctx.capture is not None else None
        saving = _saving_without_profiler(evidence, ratio) if ratio else None
        untraced = lead["label"] == UNTRACED
        what = "host time no op or function of the user's covers" if untraced else lead["label"]
        title = (f"The main thread spends {work_pct:.0f}% of the step in host work outside torch ops "
                 f"({host_ms / count:.1f} ms/step); {lead['share_pct']:.0f}% of the step "
                 + ("is covered by no op or function of the user's" if untraced else f"in {what}"))  # fmt: skip
        others = [f"{item['label']} {item['share_pct']:.0f}%" for item in culprits[1:]]
        title += f" ({', '.join(others)} next)" if others else ""
        fix = f"{named_at(what, lead['location'])} holds the step's ops back: " + (
            _FORWARD_FIX if _in_forward(lead["label"], lead["location"]) else _FIX)
        if saving:
            fix += f"; {saving}"
        events = top[0].events
        # time no op, range or user function covers may be a sleep, I/O or a lock as well as Python: an info note
        severity = "info" if untraced else rule.severity_for(work_pct)
        if untraced and not ctx.analyses.has_stacks:
            fix = "profile with Python stacks (with_stack=True; skalpel run records them) to name the host work"
        findings.append(rule.finding(evidence, locations=ctx.locations(events), rank=rank, title=title, fix=fix,
                                     severity=severity))  # fmt: skip
    return findings


def _in_forward(label: str, location: str | None) -> bool:
    """Whether the host work is the model's own Python: a forward range (``record_function("model_forward")``), a
    module's frame (``nn.Module: Router``), or a line inside a ``forward`` method. Moving it to DataLoader workers or
    doing it every N steps cannot help there; vectorising or compiling it can."""
    return ("forward" in label.lower() or label.startswith("nn.Module:")
            or (location is not None and location.rstrip().endswith(" in forward")))  # fmt: skip


def _saving_without_profiler(evidence: dict, ratio: float) -> str:
    """The most taking the host work off the thread saves, on the un-profiled step: adds it to ``evidence``.

    The profiler's Python tracer inflates the host work most (every Python call is recorded), so the time it adds
    to the step (profiled - un-profiled, ``ratio`` = un-profiled / profiled) is taken off the host work, not
    spread over the step. On the host_preprocessing scenario (2 cores) the host work held 92-95% of the profiled
    step; without the profiler, removing all of it saved 87% of the CPU a step (5.56 -> 0.72 ms) and the fix's
    "prepared once, numpy on whole arrays" 59% (2.30 ms); this claims 82% (tests/test_host_bound_claim.py).
    Each culprit's ms shrinks in proportion.
    """
    step_ms, host_ms = evidence["step_ms"], evidence["host_work_ms_per_step"]
    unprofiled_step = step_ms * ratio
    unprofiled_host = max(host_ms - (step_ms - unprofiled_step), 0.0)
    saves_pct = 100.0 * unprofiled_host / unprofiled_step if unprofiled_step > 0 else 0.0
    evidence.update({"unprofiled_ratio": ratio, "unprofiled_step_ms": unprofiled_step,
                     "unprofiled_host_work_ms_per_step": unprofiled_host, "saves_up_to_pct": saves_pct})  # fmt: skip
    for culprit in evidence["culprits"]:
        culprit["unprofiled_ms_per_step"] = culprit["ms_per_step"] * (unprofiled_host / host_ms if host_ms else 0.0)
    return (f"without the profiler (its steps {1 / ratio:.2f}x longer, the inflation taken off the host work) the "
            f"host work is about {unprofiled_host:.1f} ms of the {unprofiled_step:.1f} ms step: taking it off the "
            f"thread saves up to {saves_pct:.0f}%")  # fmt: skip


HOST_BOUND = Rule(
    id="host_bound",
    family="device",
    severity="warning",
    title="The main thread spends {host_work_pct:.0f}% of the step in host work outside torch ops",
    thresholds=thresholds.HOST_BOUND,
    check=_check_host_bound,
    fix=_FIX,
    docs=Docs(
        what="A CPU-only run whose main thread spends a large share of each step outside torch ops, in host work: "
        "Python of the user's (numpy augmentation, tokenizing, a metric over a list), a record_function range, or "
        "an op that wraps Python. The largest pieces are named by the user's innermost function running them "
        "(\"augment() in train.py:12\") with their share of the step and their line.",
        why="On a CPU the ops are the compute; every millisecond the training thread spends elsewhere is a "
        "millisecond the model does not train, and it adds to every step.",
        evidence="`host_work_pct` and ms per step of the main thread in host work: the ledger's `python` and "
        "`unrecorded` time (skalpel explain ledger), with one-time work taken out; a DataLoader fetch, a "
        "collective (another thread's too: gloo's, DDP's reducer), the short gaps between back-to-back ops and the "
        "profiler's own frames are not host work. Beside it, `outside_ops_pct` (the main thread outside its ops, "
        "see `skalpel explain blame`) and `culprits`: up to three "
        "pieces of host work with their share of the step, ms per step and the user's line (the statement most "
        "sampled inside them where the capture sampled lines). Where the capture measured the profiler's overhead "
        "(`unprofiled_ratio`, un-profiled / profiled step), what removing the host work saves on the un-profiled "
        "step: `unprofiled_step_ms`, `unprofiled_host_work_ms_per_step` (the profiler's added time taken off the "
        "host work, which its Python tracer inflates most), `saves_up_to_pct`, and each culprit's "
        "`unprofiled_ms_per_step`; the fix quotes them.",
        fix="Build and augment batches in DataLoader workers (num_workers > 0) or once before training; replace "
        "per-item Python loops with numpy or torch ops on whole arrays; save checkpoints, log and compute "
        "Python-side metrics every N steps or in a background thread.",
        false_positives="Host work that must stay on the training thread (an environment step in reinforcement "
        "learning) is the workload, not overhead. Time that no op, range or user function covers (without Python "
        "stacks, all of it) may be a sleep, I/O or a lock as well as Python: led by it, the finding is an info note.",
    ),
)

RULES = (HOST_BOUND,)
