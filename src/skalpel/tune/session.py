"""The tune session: which candidates, in which order, within which budget, and what to recommend.

1. Findings: a short profiled run of the script (``skalpel run --stop-after-capture``), or a
   report given with ``--from``.
2. A first baseline run: the script unchanged; it also records the facts (loaders, optimizers,
   model, threads, device) the candidates are chosen from. If it fails, tune stops with its error.
3. Rounds: every candidate once, then a baseline run; the next round in reverse order (so drift
   over the session weighs on both sides alike, and the baseline's runs measure it). A run that
   fails makes its candidate ``error`` and the others go on; a first run clearly slower ends its
   candidate early.
4. Undecided candidates (their interval straddles the line, ``stats.compare``) get more rounds,
   each with its baseline run, up to ``--extra-runs`` (``MAX_EXTRA_RUNS``) and within the budget; tune says so.
5. The winners (``faster``) combined in one more candidate, measured the same way.
6. Recommended: the winners measured together, when that is at least as fast as the best alone;
   else the best one alone. Nothing that was not measured ``faster`` is ever recommended, nor anything
   whose whole run is slower: each run's one-time cost (start-up, set-up, a compile: its time to the last
   step less its steps at their steady pace) plus the run's steps at its step time, the steps being
   ``--run-steps`` or what the first baseline run reached (it follows the script to its end, for at most
   ``FOLLOW_CAP_S``).

Ctrl-C returns what was measured so far, marked ``interrupted``.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..cores import usable_cores
from ..diagnose.thresholds import TUNE_MIN_EFFECT_PCT
from . import candidates as catalogue
from . import stats
from .findings import findings_for
from .measure import RunOutcome, Window, run_once
from .result import Baseline, CandidateResult, LossCheck, TuneFailed, TuneResult

LOSS_TOLERANCE_PCT = 0.1
COMPILE_ALLOWANCE_S = 120.0  # a cold torch.compile takes tens of seconds before the first step
MIN_RUN_TIMEOUT_S = 60.0
MAX_EXTRA_RUNS = 3  # more runs for a candidate whose interval straddles the line
ONE_TIME_FLOOR_S = 0.5  # one-time costs closer than this (or the baseline's own spread) count as the same
FOLLOW_CAP_S = 30.0  # the first baseline run follows the script to its end for at most this long (or a tenth of
# the budget): how many steps the whole run has, over which one-time costs (a compile) are weighed


@dataclass(frozen=True)
class TuneOptions:
    window: Window = field(default_factory=Window)
    repeats: int = 2  # runs per candidate
    extra_runs: int = MAX_EXTRA_RUNS  # at most this many more runs for an undecided candidate (0: none)
    budget_s: float = 300.0
    forced: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()  # --skip: left out whatever the findings
    findings_from: str | None = None  # a run folder, report.json or trace: skip the profiled run
    profile: bool = True  # False: no profiled run, candidates from the device and --try only
    run_steps: int | None = None  # --run-steps: the real run's steps (one-time costs weighed over them)


def tune(script: str, args: tuple[str, ...], options: TuneOptions, *,
         say: Callable[[str], None] = lambda line: print(line, file=sys.stderr)) -> TuneResult:  # fmt: skip
    session = _Session(script, args, options, say)
    try:
        session.run()
    except KeyboardInterrupt:
        session.result.interrupted = True
        say("tune: interrupted; the results so far follow")
    return session.finish()


class _Session:
    def __init__(self, script: str, args: tuple[str, ...], options: TuneOptions, say: Callable[[str], None]) -> None:
        self.script, self.args, self.options, self.say = script, args, options, say
        self.started = time.monotonic()
        self.cores = usable_cores()
        self.baseline_runs: list[RunOutcome] = []
        self.runs: dict[str, list[RunOutcome]] = {}
        self.sequence = 0  # runs so far: pairs each candidate run with the baseline run nearest in time
        self.result = TuneResult(script, list(args), options.window.warmup, options.window.steps, options.repeats,
                                 self.cores, None, [], "", Baseline(), [], [], [], options.budget_s,
                                 min_effect_pct=TUNE_MIN_EFFECT_PCT)  # fmt: skip

    def run(self) -> None:
        from ..capture.target import Target, check_target  # a missing script or a syntax error: one line, now

        check_target(Target(self.script, self.args))
        self.result.script_path = str(Path(self.script).resolve())
        findings, source = self._findings()
        self.result.findings, self.result.findings_source = sorted(findings), source
        first = self._baseline_run()
        facts = first.facts
        self.result.device = facts.get("device")
        selection = catalogue.select(facts, findings, self.cores, self.options.forced, self.options.skipped)
        chosen = selection.chosen
        self.result.not_run.extend(selection.skipped)
        self.result.not_applicable = selection.not_applicable
        self.result.candidates = [self._entry(choice, facts) for choice in chosen]
        if not chosen:
            self.result.notes.append("no candidate applies: no finding with a mechanical fix, and none asked for "
                                     "with --try (skalpel tune --list shows them all)")  # fmt: skip
        for round_index in range(self.options.repeats):
            order = self.result.candidates if round_index % 2 == 0 else self.result.candidates[::-1]
            if not [entry for entry in order if self._measure(entry)]:
                break  # nothing left to measure (errors, early stops, the budget): no baseline run either
            self._baseline_run()
        self._settle_undecided()
        self._combine_winners()

    def finish(self) -> TuneResult:
        result = self.result
        for entry in result.candidates:  # judged again against every baseline run of the session
            if self.runs.get(entry.name):
                self._judge(entry)
        self._undecided_notes()
        unmeasured = [entry for entry in result.candidates if not entry.runs]
        result.not_run.extend({"name": entry.name, "why": entry.stopped_early or "interrupted before a run of it finished"}
                              for entry in unmeasured)  # fmt: skip
        result.candidates = [entry for entry in result.candidates if entry.runs]
        result.recommended = recommend(result.candidates)
        result.elapsed_s = round(time.monotonic() - self.started, 2)
        return result

    # -- findings and baseline -------------------------------------------------------------

    def _findings(self) -> tuple[set[str], str]:
        if self.options.profile and not self.options.findings_from:
            self.say(f"tune: profiling {self.script} once for its findings")
        found = findings_for(self.script, self.args, source=self.options.findings_from, profile=self.options.profile,
                             timeout_s=max(self._left(), MIN_RUN_TIMEOUT_S))  # fmt: skip
        self.result.run_folder = None if found.folder is None else str(found.folder)
        return found.ids, found.source

    def _baseline_run(self) -> RunOutcome:
        first = not self.baseline_runs
        follow = None if not first or self.options.run_steps else min(FOLLOW_CAP_S, self.options.budget_s / 10)
        outcome = run_once(self.script, self.args, {}, self.options.window, max_seconds=None, follow_s=follow,
                           timeout_s=max(self._left(), MIN_RUN_TIMEOUT_S) if first else self._timeout({}))  # fmt: skip
        outcome.seq = self._next()
        if outcome.failed:
            if first:
                raise TuneFailed(f"{self.script} failed on the baseline run, unchanged: {_last_line(outcome)}",
                                 outcome.error or outcome.log_tail)  # fmt: skip
            self.result.notes.append(f"a later baseline run failed ({_last_line(outcome)}); it is left out")
            return outcome
        timed = outcome.timed(self.options.window)
        if not timed:
            raise TuneFailed(f"no step found in {self.script}: skalpel looks for optimizer.step() calls and DataLoader "
                             "iterations, and needs at least two steps")  # fmt: skip
        self.baseline_runs.append(outcome)
        self._update_baseline()
        self.say(f"tune: baseline run {len(self.baseline_runs)}: {_mean(timed):.2f} ms/step ({len(timed)} steps, "
                 f"{outcome.wall_s:.1f} s)")  # fmt: skip
        if first:
            self.result.notes.extend(steady_notes(outcome, self.options.window))
            self._run_length(outcome)
            self._update_baseline()
        return outcome

    def _next(self) -> int:
        self.sequence += 1
        return self.sequence

    def _run_length(self, first: RunOutcome) -> None:
        """The whole run's steps, over which one-time costs are weighed: --run-steps, else as many as the first
        baseline run reached (to the script's end, or as far as it was followed: then at least that many)."""
        if self.options.run_steps:
            self.result.run_steps, self.result.run_steps_from = self.options.run_steps, "--run-steps"
            return
        # a step's boundary is taken where the next one starts: a script that ended ran one step past its last
        self.result.run_steps = max(first.steps_seen, len(first.steps_ms) + 1) + (1 if first.ran_to_end else 0)
        if first.ran_to_end:
            self.result.run_steps_from = "the script's end"
            return
        self.result.run_steps_from = "followed"
        self.result.notes.append(f"the script was followed for {self.result.run_steps} steps, not to its end: "
                                 "one-time costs (a compile) are weighed over that many; if the real run is longer, "
                                 "say so with --run-steps N")  # fmt: skip

    def _update_baseline(self) -> None:
        runs = [run.timed(self.options.window) for run in self.baseline_runs]
        timing = stats.timing(runs)
        base = self.result.baseline
        if timing is not None:
            base.median_ms, base.noise_pct, base.run_ms, base.steps = timing.median_ms, timing.noise_pct, list(timing.run_ms), timing.steps
        base.one_time_s = _median_one_time(self.baseline_runs, self.options.window)
        base.whole_run_s = _whole_run_s(base.one_time_s, base.median_ms, self.result.run_steps)
        base.runs = len(self.baseline_runs)
        base.loss, base.loss_step = self.baseline_runs[0].loss, self.baseline_runs[0].loss_step

    # -- candidates ---------------------------------------------------------------------------

    def _entry(self, choice: catalogue.Choice, facts: dict) -> CandidateResult:
        candidate = choice.candidate
        return CandidateResult(candidate.name, candidate.what, choice.reason, candidate.fix(facts, self.cores),
                               candidate.changes(facts, self.cores))  # fmt: skip

    def _measure(self, entry: CandidateResult) -> bool:
        """One more run of ``entry``, unless it is done with; True when the script ran."""
        if entry.verdict == "error" or entry.stopped_early:
            return False
        needed = self._estimate(entry.fix)
        if self._left() < needed:
            entry.stopped_early = f"the budget: {max(0.0, self._left()):.0f} s left, a run needs about {needed:.0f} s"
            return False
        outcome = run_once(self.script, self.args, entry.fix, self.options.window,
                           max_seconds=self._max_window_s(), timeout_s=self._timeout(entry.fix))  # fmt: skip
        outcome.seq = self._next()
        self.runs.setdefault(entry.name, []).append(outcome)
        if outcome.failed:
            entry.verdict, entry.error = "error", outcome.error or outcome.log_tail or f"exit status {outcome.exit_status}"
            entry.runs += 1
            self.say(f"tune: {entry.name}: error: {_last_line(outcome)}")
            return True
        missing = sorted(set(entry.fix) - set(outcome.facts.get("applied", ())))
        if missing and entry.runs == 0:
            self.result.notes.append(f"{entry.name}: the run found nothing to apply {', '.join(missing)} to")
        self._judge(entry)
        timed = outcome.timed(self.options.window)
        self.say(f"tune: {entry.name} run {entry.runs}: {_mean(timed):.2f} ms/step ({len(timed)} steps, "
                 f"{outcome.wall_s:.1f} s): {entry.verdict}")  # fmt: skip
        if outcome.end == "time_limit" or (entry.runs == 1 and stats.clearly_worse(self._comparison(entry))):
            entry.stopped_early = "clearly slower than the baseline after its first run"
        return True

    def _comparison(self, entry: CandidateResult) -> stats.Comparison | None:
        window = self.options.window
        good = [run for run in self.runs.get(entry.name, []) if not run.failed]
        base = self.baseline_runs
        pairs = [min(range(len(base)), key=lambda j: (abs(base[j].seq - run.seq), -j)) for run in good]  # its round's
        return stats.compare([run.timed(window) for run in base], [run.timed(window) for run in good], pairs=pairs)

    def _judge(self, entry: CandidateResult) -> None:
        runs = [run for run in self.runs.get(entry.name, []) if not run.failed]
        entry.runs = len(self.runs.get(entry.name, []))
        if entry.verdict == "error":
            return
        timing = stats.timing([run.timed(self.options.window) for run in runs])
        comparison = self._comparison(entry)
        if timing is None or comparison is None:
            entry.verdict, entry.error = "error", "the run timed no step"
            return
        entry.median_ms, entry.noise_pct, entry.run_ms, entry.steps = timing.median_ms, timing.noise_pct, list(timing.run_ms), timing.steps
        entry.verdict, entry.speedup, entry.change_pct = comparison.verdict, comparison.speedup, comparison.change_pct
        entry.band_pct, entry.ci_low_pct, entry.ci_high_pct = comparison.band_pct, comparison.ci_low_pct, comparison.ci_high_pct
        entry.speedup_low, entry.speedup_high, entry.undecided = comparison.speedup_low, comparison.speedup_high, comparison.undecided
        entry.loss = loss_check(self.baseline_runs, runs[-1])
        entry.ratios = list(comparison.ratios)
        self._weigh_one_time(entry, runs)

    def _weigh_one_time(self, entry: CandidateResult, runs: list[RunOutcome]) -> None:
        """The candidate's whole run against the baseline's: one-time cost + the run's steps x the step time."""
        base, steps = self.result.baseline, self.result.run_steps
        entry.one_time_s = _median_one_time(runs, self.options.window)
        one_time = entry.one_time_s
        if one_time is not None and base.one_time_s is not None:
            # start-up (python, import torch) jitters by seconds on a loaded machine: a difference within the
            # baseline's own spread of one-time costs is no difference
            if abs(one_time - base.one_time_s) <= self._one_time_noise_s():
                one_time = base.one_time_s
        # the step time the paired rounds measured (the baseline's over the speed-up), not the unpaired median:
        # the whole run and the break-even agree with the speed-up shown
        step_ms = base.median_ms / entry.speedup if base.median_ms and entry.speedup else entry.median_ms
        entry.whole_run_s = _whole_run_s(one_time, step_ms, steps)
        if entry.whole_run_s and base.whole_run_s:
            entry.whole_run_speedup = round(base.whole_run_s / entry.whole_run_s, 3)
            line = 1 + self.result.min_effect_pct / 100
            entry.whole_run_verdict = ("faster" if entry.whole_run_speedup > line else
                                       "slower" if entry.whole_run_speedup < 1 / line else "no_gain")  # fmt: skip
        saved_ms = (base.median_ms or 0.0) - (step_ms or 0.0)
        extra_s = (one_time or 0.0) - (base.one_time_s or 0.0)
        entry.break_even_steps = round(extra_s / saved_ms * 1000, 1) if saved_ms > 0 and extra_s > 0 else None

    def _one_time_noise_s(self) -> float:
        """How much the baseline's one-time cost varies between its runs (twice 1.4826 x its MAD), at least
        ``ONE_TIME_FLOOR_S``."""
        costs = [cost for cost in (run.one_time_s(self.options.window) for run in self.baseline_runs) if cost is not None]
        if len(costs) < 2:
            return ONE_TIME_FLOOR_S
        centre = statistics.median(costs)
        return max(ONE_TIME_FLOOR_S, 2 * 1.4826 * statistics.median(abs(cost - centre) for cost in costs))

    def _settle_undecided(self) -> None:
        """More runs, each round with its baseline run, for the candidates whose interval straddles the line."""
        for _ in range(self.options.extra_runs):
            undecided = [entry for entry in self.result.candidates
                         if entry.undecided and entry.verdict == "no_gain" and not entry.stopped_early]  # fmt: skip
            if not undecided:
                break
            for entry in undecided:
                self.say(f"tune: {entry.name}: its interval ({entry.ci_low_pct:+.1f}% to {entry.ci_high_pct:+.1f}%) "
                         f"straddles the line (-{entry.band_pct:.1f}%): one more run")  # fmt: skip
            measured = [entry for entry in undecided if self._measure(entry)]
            for entry in measured:
                entry.extra_runs += 1
            if not measured:
                break
            self._baseline_run()

    def _undecided_notes(self) -> None:
        """After the last judgement: which candidates got more runs, and which stayed undecided."""
        for entry in self.result.candidates:
            if entry.extra_runs:
                settled = "undecided still: no_gain" if entry.undecided else f"then {entry.verdict}"
                self.result.notes.append(f"{entry.name}: its interval straddled the line; {entry.extra_runs} more "
                                         f"run{'s' if entry.extra_runs != 1 else ''}, {settled}")  # fmt: skip
            elif entry.undecided:
                self.result.notes.append(f"{entry.name}: its interval straddles the line: no_gain until more runs "
                                         "settle it (a larger --budget or --repeats)")  # fmt: skip

    def _combine_winners(self) -> None:
        winners = sorted((c for c in self.result.candidates if pays(c)), key=lambda c: -(c.speedup or 0))
        if len(winners) < 2:
            return
        combined = CandidateResult("combined", "the faster candidates together", "the winners combined",
                                   catalogue.combine([w.fix for w in winners]),
                                   [change for w in winners for change in w.change], members=[w.name for w in winners])  # fmt: skip
        self.result.candidates.append(combined)
        for _ in range(self.options.repeats):
            if not self._measure(combined):
                break
            self._baseline_run()

    # -- time ------------------------------------------------------------------------------------

    def _left(self) -> float:
        return self.options.budget_s - (time.monotonic() - self.started)

    def _estimate(self, fix: dict) -> float:
        walls = [run.window_wall_s for run in self.baseline_runs]
        base = max(walls) if walls else 10.0
        return base * 1.2 + (COMPILE_ALLOWANCE_S / 4 if fix.get("compile") else 0.0)

    def _timeout(self, fix: dict) -> float:
        walls = [run.window_wall_s for run in self.baseline_runs] or [10.0]
        allowance = COMPILE_ALLOWANCE_S if fix.get("compile") else 0.0
        return max(MIN_RUN_TIMEOUT_S, 4 * max(walls) + allowance)

    def _max_window_s(self) -> float | None:
        """A candidate's timed steps may take this long: three times the baseline's window."""
        median = self.result.baseline.median_ms
        return None if median is None else max(5.0, 3 * median * self.options.window.steps / 1000)


def loss_check(baseline_runs: list[RunOutcome], run: RunOutcome) -> LossCheck | None:
    """The candidate's loss against the baseline's after the same step; the tolerance grows with the baseline's own spread."""
    same = [b.loss for b in baseline_runs if b.loss is not None and b.loss_step == run.loss_step]
    if run.loss is None or run.loss_step is None or not same:
        return None
    reference = same[0]
    scale = abs(reference) or 1.0
    spread = (max(same) - min(same)) / scale * 100
    tolerance = max(LOSS_TOLERANCE_PCT, 2 * spread)
    change = (run.loss - reference) / scale * 100
    finite = change == change and abs(change) != float("inf")
    return LossCheck(run.loss_step, reference, run.loss, round(change, 4) if finite else change, round(tolerance, 4),
                     finite and abs(change) <= tolerance)  # fmt: skip


def steady_notes(outcome: RunOutcome, window: Window) -> list[str]:
    """What the reader must know when the script ran fewer steps than the window: the warm-up judged, steady state."""
    judged = outcome.steady(window)
    if not judged.judged:
        return []
    ran = len(outcome.steps_ms)
    notes = [f"the script ended after {ran} measured steps, fewer than the window's {window.warmup} warm-up + "
             f"{window.steps}: warm-up judged from its steps ({judged.warmup} left out), {len(judged.steps)} timed "
             "steps per run"]  # fmt: skip
    if not judged.reached:
        notes.append(f"steady state was never reached: the step time still changed {stats.trend_pct(judged.steps):.0f}% "
                     f"between the halves of the {len(judged.steps)} steps kept; the figures include warm-up, so a "
                     "longer run (more steps) measures the steady state")  # fmt: skip
    return notes


def pays(entry: CandidateResult) -> bool:
    """Measured ``faster`` per step, and its whole run (one-time costs included) not longer than the baseline's."""
    return entry.verdict == "faster" and entry.whole_run_verdict != "slower"


def recommend(entries: list[CandidateResult]) -> list[str]:
    """Names to recommend: only candidates measured ``faster`` whose whole run is not slower (see the module
    docstring)."""
    # best first by the interval's conservative end: two rounds that disagree (1.1x and 3x) rank below two that agree
    singles = sorted((c for c in entries if pays(c) and not c.members), key=lambda c: -(c.speedup_low or c.speedup or 0))
    if not singles:
        return []
    combined = next((c for c in entries if c.members), None)
    if combined is not None and pays(combined) and (combined.speedup or 0) >= (singles[0].speedup or 0):
        return list(combined.members)
    return [singles[0].name] if combined is not None else [c.name for c in singles]


def _median_one_time(runs: list[RunOutcome], window: Window) -> float | None:
    costs = sorted(cost for cost in (run.one_time_s(window) for run in runs if not run.failed) if cost is not None)
    return round(float(statistics.median(costs)), 3) if costs else None


def _whole_run_s(one_time_s: float | None, step_ms: float | None, steps: int | None) -> float | None:
    if one_time_s is None or step_ms is None or not steps:
        return None
    return round(one_time_s + steps * step_ms / 1000.0, 3)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _last_line(outcome: RunOutcome) -> str:
    text = (outcome.error or outcome.log_tail or f"exit status {outcome.exit_status}").strip()
    return text.splitlines()[-1] if text else f"exit status {outcome.exit_status}"
