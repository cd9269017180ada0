"""Measurement findings: the profile itself cannot be trusted yet, and why.

These read the capture settings skalpel recorded (``CaptureInfo``) when there are any, and
the step times of the trace otherwise, so they also judge traces taken by hand.
"""

from __future__ import annotations

from ..analysis import numeric
from ..analysis.steps import first_step_holds_other_work
from . import thresholds
from .common import pct, windows
from .rule import Context, Docs, NotJudged, Outcome, Rule


def _check_no_warmup(ctx: Context, rule: Rule) -> Outcome:
    capture = ctx.capture
    limits = rule.thresholds
    slow = _slow_first_steps(ctx, limits)
    if capture is not None and capture.warmup_steps == 0:
        evidence = {"warmup_steps": 0, "active_steps": capture.active_steps, **(slow[0] if slow else {})}
        title = "Profiled without warm-up (warmup_steps=0): the first steps include one-time costs"
        if slow:
            title += f"; the first step took {slow[0]['first_step_ms']:.1f} ms vs {slow[0]['median_other_ms']:.1f} ms"
        return [rule.finding(evidence, title=title)]
    if not ctx.steps.marked:
        return NotJudged("no steps marked: cannot compare the first step with the others")
    findings = []
    for evidence in slow:
        rank = evidence.pop("rank")
        if capture is None:
            findings.append(rule.finding(evidence, rank=rank))
            continue
        # warm-up steps ran and the first recorded step is still slow: a one-time cost outlasted them, or a slow
        # step that comes back; more warm-up is the fix only for the first, and the medians already discount it
        evidence["warmup_steps"] = capture.warmup_steps
        title = (f"The first profiled step is {evidence['slower_pct']:.0f}% slower than the others "
                 f"({evidence['first_step_ms']:.1f} vs {evidence['median_other_ms']:.1f} ms) after "
                 f"{capture.warmup_steps} warm-up step{'s' if capture.warmup_steps != 1 else ''}")  # fmt: skip
        fix = (f"if it is a start-up cost that lasts longer (DataLoader workers filling their queues, autotuning, "
               f"lazy initialisation), record later: skalpel run --warmup {max(4 * capture.warmup_steps, 8)}; "
               "if the loop has slow steps every N steps (evaluation, checkpoints), they are its own")  # fmt: skip
        findings.append(rule.finding(evidence, severity="info", title=title, fix=fix, rank=rank))
    return findings


def _slow_first_steps(ctx: Context, limits) -> list[dict]:
    """Ranks whose first profiled step is much slower than the median of the others (3 steps or more)."""
    result = []
    for window in windows(ctx):
        if window.count < thresholds.NO_WARMUP_MIN_STEPS or not ctx.steps.marked:
            continue
        ordered = sorted(window.steps, key=lambda step: step.start_us)
        durations = [step.duration_ms for step in ordered]
        first, rest = durations[0], numeric.median(durations[1:])
        slower = pct(first - rest, rest)
        if slower < limits.share_pct or first - rest < limits.floor:
            continue
        # warm-up runs the step's own ops, slower: a first step with far more ops did other work (an RL rollout)
        if not first_step_holds_other_work(ordered):
            result.append({"first_step_ms": first, "median_other_ms": rest, "slower_pct": slower, "rank": window.rank})
    return result


NO_WARMUP = Rule(
    id="no_warmup",
    family="measurement",
    severity="warning",
    title="The first profiled step is {slower_pct:.0f}% slower than the others ({first_step_ms:.1f} vs {median_other_ms:.1f} ms): warm-up was recorded",
    thresholds=thresholds.NO_WARMUP,
    check=_check_no_warmup,
    scope="job",
    fix="skip warm-up steps before recording: torch.profiler.schedule(wait=1, warmup=2, active=5), "
    "or skalpel run --warmup 2 (the default)",
    docs=Docs(
        what="The profile includes the first iterations of the loop: skalpel captured with `warmup_steps=0`, or "
        "the first profiled step is much slower than the median of the others.",
        why="First iterations pay one-time costs (CUDA context and cuDNN autotuning, allocator growth, "
        "torch.compile, lazy module initialisation, the profiler starting up) that the steady state never pays; "
        "they distort every share and the step time.",
        evidence="The capture's warm-up and active step counts, the first step's time against the median of the "
        "others, and how much slower it is.",
        fix="Use a schedule with warm-up (`torch.profiler.schedule(wait=1, warmup=2, active=5)`) or "
        "`skalpel run --warmup 2`; drop the first steps before reading numbers.",
        false_positives="A first step that is slow for a real reason that repeats (an evaluation or checkpoint "
        "every N steps) looks the same; check the step times. When the capture had warm-up steps and the first "
        "recorded step is still slow, the finding is an info note: warm-up was not missing, a one-time cost "
        "lasted longer (or the slow step repeats), and the step figures are medians, which discount one step.",
    ),
)


def _check_too_few_steps(ctx: Context, rule: Rule) -> Outcome:
    minimum = int(rule.thresholds.floor)
    capture = ctx.capture
    if not ctx.steps.marked:
        return NotJudged("no steps marked: the whole trace is one pseudo-step")
    counts = [window.count for window in windows(ctx)]
    steps = min(counts) if counts else 0
    if capture is not None and capture.active_steps < minimum:
        steps = min(steps, capture.active_steps) if counts else capture.active_steps
    if steps >= minimum:
        return []
    evidence: dict = {"steps": steps, "minimum": minimum}
    if capture is None or capture.active_steps < minimum:
        return [rule.finding(evidence)]
    # enough steps were asked for: "--active 5" would change nothing; say where they went
    evidence["active_steps"] = capture.active_steps
    fix = (
        f"{capture.active_steps} active steps were asked for and {steps} analysed ({_steps_lost(ctx)}): record more, "
        f"e.g. skalpel run --active {2 * capture.active_steps}, or remove what cut them"
    )
    return [rule.finding(evidence, fix=fix)]


def _steps_lost(ctx: Context) -> str:
    """Why fewer steps were analysed than recorded, as the step segmentation knows it."""
    segmentation = ctx.steps
    reasons = []
    if segmentation.unequal:
        reasons.append(f"{len(segmentation.unequal)} left out as unequal (an epoch boundary, an evaluation)")
    if segmentation.defective:
        reasons.append(f"{segmentation.defective} left out as measurement defects")
    if segmentation.dropped_tail:
        reasons.append(f"{segmentation.dropped_tail} trailing without their device work")
    return "; ".join(reasons) or "the recording stopped before the window ended, or the script did: see the notes"


TOO_FEW_STEPS = Rule(
    id="too_few_steps",
    family="measurement",
    severity="warning",
    title="Only {steps} profiled step(s): at least {minimum} are needed to judge step time and its spread",
    thresholds=thresholds.TOO_FEW_STEPS,
    check=_check_too_few_steps,
    scope="job",
    fix="record more active steps: torch.profiler.schedule(active=5) or skalpel run --active 5",
    docs=Docs(
        what="Fewer profiled steps than the minimum on some rank (or in the capture settings).",
        why="With one or two steps there is no median, no spread and no growth per step: one slow step or one "
        "garbage collection decides the whole diagnosis, and memory growth cannot be seen at all.",
        evidence="The number of profiled steps (the smallest over ranks) and the minimum.",
        fix="Record five or more active steps (`schedule(active=5)`, `skalpel run --active 5`).",
        false_positives="Very long steps (minutes each) may justify fewer steps; the numbers then carry more noise.",
    ),
)


def _check_noise(ctx: Context, rule: Rule) -> Outcome:
    limits = rule.thresholds
    capture = ctx.capture
    if capture is not None and capture.noise_pct is not None and len(capture.window_medians_ms) >= 2:
        noise = capture.noise_pct
        spread_ms = max(capture.window_medians_ms) - min(capture.window_medians_ms)
        source = "capture windows"
    else:
        durations = ctx.steps.durations_ms
        if not ctx.steps.marked or len(durations) < limits.param("min_steps"):
            return []
        noise = 100.0 * float(durations.std() / durations.mean()) if durations.mean() > 0 else 0.0
        spread_ms = float(durations.std())
        source = "step times (cv)"
    if noise < limits.share_pct or spread_ms < limits.floor:
        return []
    severity = "warning" if noise >= limits.param("warning_pct") else "info"
    evidence = {"noise_pct": noise, "spread_ms": spread_ms, "source": source}
    return [rule.finding(evidence, severity=severity)]


NOISY_MEASUREMENT = Rule(
    id="noisy_measurement",
    family="measurement",
    severity="info",
    title="Step time varies {noise_pct:.0f}% between {source} ({spread_ms:.1f} ms): compare numbers with care",
    thresholds=thresholds.NOISY_MEASUREMENT,
    check=_check_noise,
    scope="job",
    fix="fix the seed and input sizes, torch.set_num_threads(N) explicitly, stop other loads on the machine, "
    "record more steps",
    docs=Docs(
        what="Repeated capture windows disagree (skalpel's `--repeat` measures their spread) or, for stored "
        "traces, step times vary a lot (coefficient of variation over five or more steps).",
        why="Differences smaller than the noise are not real: a before/after comparison or a share of a few "
        "percent cannot be trusted. Warning from `warning_pct` on, info below.",
        evidence="The spread in percent and in ms, and whether it comes from capture windows or from the steps.",
        fix="Fix the random seed and input shapes, set `torch.set_num_threads` explicitly, stop other work on the "
        "machine, record more steps and repeat the capture.",
        false_positives="Workloads whose steps really differ (variable sequence lengths, periodic evaluation) are "
        "noisy by nature; bucket the steps before comparing.",
    ),
)


def _check_overhead(ctx: Context, rule: Rule) -> Outcome:
    capture = ctx.capture
    if capture is None or capture.overhead_pct is None:
        return []  # only a capture measures the un-profiled step
    limits = rule.thresholds
    extra_ms = None
    if capture.profiled_step_ms is not None and capture.unprofiled_step_ms is not None:
        extra_ms = capture.profiled_step_ms - capture.unprofiled_step_ms
    overhead = capture.overhead_pct
    if overhead < limits.share_pct or (extra_ms is not None and extra_ms < limits.floor):
        return []
    if capture.overhead_noise_pct is not None and overhead <= capture.overhead_noise_pct:
        return []  # inside the noise of the two medians: not a measured overhead
    evidence = {
        "overhead_pct": overhead,
        "extra_ms_per_step": extra_ms if extra_ms is not None else float("nan"),
        "profiled_step_ms": capture.profiled_step_ms,
        "unprofiled_step_ms": capture.unprofiled_step_ms,
    }
    severity = "warning" if overhead >= limits.param("warning_pct") else "info"
    return [rule.finding(evidence, severity=severity)]


PROFILER_OVERHEAD = Rule(
    id="profiler_overhead",
    family="measurement",
    severity="info",
    title="The profiler slows each step by {overhead_pct:.0f}%: host-side shares are inflated",
    thresholds=thresholds.PROFILER_OVERHEAD,
    check=_check_overhead,
    scope="job",
    fix="profile with fewer options for timing (with_stack=False, record_shapes=False, profile_memory=False) "
    "and keep the full profile for locating",
    docs=Docs(
        what="The median profiled step against the median un-profiled steady-state step of the same run (steps "
        "timed after the recorded window), when the difference stands out of the noise of both medians.",
        why="The profiler adds a fixed cost per op (more with Python stacks and shapes), so host-bound and "
        "tiny-op workloads look more host-bound than they are. Warning from `warning_pct` on, info below.",
        evidence="The overhead in percent and ms per step, and both medians.",
        fix="Take a second, lighter profile for timing (`with_stack=False`, `record_shapes=False`, "
        "`profile_memory=False`); trust locations from the full one.",
        false_positives="Warm-up steps that are slower for their own reasons (compilation, allocator growth) make "
        "the overhead look smaller, or negative.",
    ),
)

RULES = (NO_WARMUP, TOO_FEW_STEPS, NOISY_MEASUREMENT, PROFILER_OVERHEAD)
