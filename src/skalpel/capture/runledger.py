"""The run's ledger from its clock (``runclock.py``): where the script's wall time went, and its one-time costs.

With boundaries b1..bn, the script's start t0 and end tE, and the typical step m (the median of b[i+1] - b[i],
skalpel's own work left out):

* start-up: b1 - t0 - m (the first boundary ends the first iteration, whose own step work is one typical step),
  less the loop's kind of work the clock timed before it (no_grad, evaluation, torch.save: a PPO's first rollout),
  which is between steps;
* between steps: for each step LONG_STEP_RATIO times m or more, its time beyond m (a rollout, an evaluation,
  a checkpoint between two updates); in the first FIRST_STEPS steps that excess is one-time work instead
  (the first-steps extra: a backward compiled lazily, a recompile, allocator growth);
* in steps: the rest between b1 and bn, plus the first iteration's typical step;
* after the last step: tE - bn.

The five (with the first-steps extra) add up to tE - t0. A step well under LONG_STEP_RATIO times the median stays
whole in the steps: step times that vary by noise alone put nothing between the steps. What the between-steps time
was is named where the clock timed it in those steps (no_grad work, evaluation, torch.save, compilation), scaled to
fit the excess.

skalpel's own work at the boundaries (the profiler's start, the trace written when the window closes: seconds) is
the script's time no more: it is taken out of the step it fell in and of the run, and said apart (``skalpel_s``).
"""

from __future__ import annotations

import statistics

from ..result.sections import RunLedger
from .runclock import Counters, RunClock

LONG_STEP_RATIO = 3.0  # a step this many times the typical one holds work between steps
FIRST_STEPS = 2  # the excess of a long step among the first ones is one-time work


def run_ledger(clock: RunClock, compilations: list[dict] | tuple = ()) -> RunLedger | None:
    """The ledger of a run whose clock saw two step boundaries or more; None otherwise."""
    marks, ended = clock.marks, clock.ended
    if ended is None or len(marks) < 2:
        return None
    t0 = clock.started
    own = [counters.skalpel_s for counters in clock.at_marks]  # skalpel's own work, left out of the script's time
    durations = [later - earlier - (own[i + 1] - own[i]) for i, (earlier, later) in enumerate(zip(marks, marks[1:]))]
    typical = statistics.median(durations)
    compile_spans = _compile_spans(clock, compilations)
    before_first = marks[0] - t0 - own[0]
    startup = max(before_first - typical, 0.0)
    first_extra = 0.0
    # the loop's kind of work before its first step (a first rollout, an evaluation, a checkpoint) is between steps
    named = _spent(Counters(), clock.at_marks[0])
    scale = min(1.0, startup / sum(named.values())) if sum(named.values()) > 0 else 0.0
    named = {name: seconds * scale for name, seconds in named.items()}
    before = sum(named.values())
    startup -= before
    between = before
    named["compile"] = 0.0
    long_steps = 0
    for index, duration in enumerate(durations):
        if duration < LONG_STEP_RATIO * typical:
            continue
        excess = duration - typical
        if index < FIRST_STEPS:
            first_extra += excess
            continue
        long_steps += 1
        between += excess
        spent = _spent(clock.at_marks[index], clock.at_marks[index + 1])
        spent["compile"] = _overlap(compile_spans, marks[index], marks[index + 1])
        scale = min(1.0, excess / sum(spent.values())) if sum(spent.values()) > 0 else 0.0
        for name, seconds in spent.items():
            named[name] += seconds * scale
    in_steps = sum(durations) - (between - before) - first_extra + min(typical, before_first)
    own_total = clock.counters.skalpel_s
    compile_total = sum(end - start for start, end in compile_spans)
    return RunLedger(
        run_s=round(ended - t0 - own_total, 4),
        steps=len(marks),
        step_s=round(typical, 6),
        startup_s=round(startup, 4),
        in_steps_s=round(in_steps, 4),
        between_steps_s=round(between, 4),
        after_last_step_s=round(max(ended - marks[-1] - (own_total - own[-1]), 0.0), 4),
        first_steps_extra_s=round(first_extra, 4),
        compile_s=round(compile_total, 4),
        compile_startup_s=round(_overlap(compile_spans, t0, marks[0]), 4),
        between_no_grad_s=round(named["no_grad"], 4),
        between_eval_s=round(named["eval"], 4),
        between_save_s=round(named["save"], 4),
        between_compile_s=round(named["compile"], 4),
        skalpel_s=round(own_total, 4),
        long_steps=long_steps,
        steps_to_end=clock.stopped_marking is None,
        long_step_ratio=LONG_STEP_RATIO,
    )


def _spent(before: Counters, after: Counters) -> dict[str, float]:
    return {"no_grad": after.no_grad_s - before.no_grad_s, "eval": after.eval_s - before.eval_s,
            "save": after.save_s - before.save_s}  # fmt: skip


def _compile_spans(clock: RunClock, compilations: list[dict] | tuple) -> list[tuple[float, float]]:
    """The compilations as disjoint (start, end) on the clock's perf_counter scale (the log stamps epoch
    microseconds), within the run: a frame compiled again after a graph break runs inside its caller's compilation,
    and is counted once."""
    spans = []
    for item in compilations:
        start_us, duration_ms = item.get("start_us"), item.get("duration_ms")
        if start_us is None or duration_ms is None:
            continue
        start = clock.started + (float(start_us) / 1e6 - clock.epoch_started)
        end = min(start + float(duration_ms) / 1000.0, clock.ended if clock.ended is not None else float("inf"))
        if end > max(start, clock.started):
            spans.append((max(start, clock.started), end))
    merged: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _overlap(spans: list[tuple[float, float]], start: float, end: float) -> float:
    return sum(max(0.0, min(end, high) - max(start, low)) for low, high in spans)
