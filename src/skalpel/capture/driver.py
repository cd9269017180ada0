"""One driver of a ``ProfileRun`` from the step boundaries, for ``skalpel run`` and ``skalpel watch`` alike.

At each boundary on the script's thread (``boundary()``), the run given (``run``) starts, then
steps; ``boundary()`` says when its windows are recorded and the baseline after them timed.
Before that, a takeover (``policy.restart``: a stronger signal replaced the one that marked
the steps) drops what was recorded and records again on the new signal, in the same folder.
While a run profiles, a memory budget of its own watches the process; past it, the recording
ends at the end of the step under way, which is kept whole. Past ``FINISH_CEILING`` budgets
it ends at the next hook (``TorchHooks.on_stop_request``), leaving that step out, or, in the
window's first recorded step, starts again without memory, stacks and shapes at once
(``budget.lightest``); if even that step does not fit, ``gave_up`` says why. A script that starts torch.profiler itself
stops the run there, keeping what was recorded (``aside.py``: two profilers at once crash),
and no run starts after it.

The caller keeps what is its own: which run to drive and when (``skalpel run``: one from the
first boundary; ``skalpel watch``: one per anomaly), and what to do once it is recorded.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Callable

from . import signals
from .aside import ProfilerWatch
from .boundaries import LABELS, Takeover
from .budget import ENV_BUDGET, OverBudget, RecordingBudget, lightest
from .budget import words as budget_words
from .session import ProfileRun
from .settings import CaptureSettings
from .steps import StepDetector


class Driver:
    """Drives ``run`` from ``detector``'s boundaries; ``say`` prints one line on stderr.

    ``on_takeover`` is told of a takeover once the run was replaced (the caller may drop the new one:
    ``run = None``); ``on_aside`` once the script started torch.profiler itself and the run stopped.
    ``steps`` numbers the script's steps in what the driver says (default: the boundaries it met).
    """

    def __init__(self, detector: StepDetector, say: Callable[[str], None], *, run: ProfileRun | None = None,
                 on_takeover: Callable[[Takeover], None] | None = None, on_aside: Callable[[], None] | None = None,
                 steps: Callable[[], int] | None = None) -> None:  # fmt: skip
        self.detector = detector
        self.say = say
        self.run = run
        self.on_takeover = on_takeover
        self.on_aside = on_aside
        self.thread = threading.get_ident()  # the thread that runs the script: the only one that drives the profiler
        self.boundaries = 0  # boundaries met on that thread
        self.steps = steps or (lambda: self.boundaries)
        self.aside = ProfilerWatch(self._step_aside)
        self.budget: RecordingBudget | None = None  # the running run's
        self.dropped: list[str] = []  # what the budget made the recording leave out
        self.gave_up: str | None = None  # no whole step fits the budget: why nothing was recorded
        detector.hooks.on_stop_request = self._end_recording_early

    def install(self) -> None:
        self.aside.__enter__()

    def uninstall(self) -> None:
        if self.budget is not None:
            self.budget.stop()
        self.aside.__exit__()

    @property
    def on_script_thread(self) -> bool:
        return threading.get_ident() == self.thread and signals.is_owner()

    @property
    def stood_aside(self) -> bool:
        """The script started torch.profiler itself: no run may start from here on."""
        return self.aside.where is not None

    def boundary(self) -> bool:
        """A boundary: a takeover records again, then the run starts or steps. True once every window is recorded
        and the un-profiled steps after them timed (the overhead's baseline)."""
        if not self.on_script_thread:
            return False  # the detector marks in the script's thread only, and a forked child is not profiled
        self.boundaries += 1
        if self.detector.policy.restart:
            self._record_again()
        run = self.run
        if run is None:
            return False
        run.step_signal = LABELS.get(self.detector.policy.signal or "")
        if not run.started:
            if not self.stood_aside:
                self._start(run)
            return False
        ending = self._budget_ends_window(run)
        if ending is not None:
            self._end_at_step(run, ending)  # the step that ends here ran to its end: kept whole
        else:
            run.step()
        run.loader_workers = self.detector.hooks.loader_workers
        return run.baseline_complete

    def take(self) -> ProfileRun | None:
        """The run, once the caller is done with it; nothing is driven until it gives another."""
        run, self.run = self.run, None
        if self.budget is not None:
            self.budget.stop()
            self.budget = None
        return run

    def _start(self, run: ProfileRun) -> None:
        if self.budget is not None:
            self.budget.stop()
        self.budget = RecordingBudget(lambda: run.profiling, lambda: run.recording, self._over_budget,
                                      past_ceiling=self._past_ceiling)  # fmt: skip
        self.budget.start()  # before the profiler: its first reading is the memory held before it
        hooks = self.detector.hooks
        run.batches_seen = lambda: (hooks.batches, hooks.loader_cpu_s)  # the CPU window weighs the batches made
        run.start()

    def _record_again(self) -> None:
        """A stronger signal took over from a fallback: what was recorded is not the training iteration."""
        policy = self.detector.policy
        policy.restart = False
        takeover = policy.takeovers[-1]
        note = takeover.note()
        old = self.run
        if old is not None:
            if old.started:
                old.discard()
            self.run = successor(old, old.settings)
            self.run.said.add(note)  # the run's notes list it at the end: for the report, not for stderr again
        self.say(note)
        if self.on_takeover is not None:
            self.on_takeover(takeover)

    def _over_budget(self, tripped: OverBudget) -> None:
        """The budget's thread: the recording ends at the next boundary (``boundary`` reads ``budget.tripped``)."""

    def _past_ceiling(self, tripped: OverBudget) -> None:
        """The budget's thread: the step under way may not run to its end; the next hook on the script's thread ends
        the recording."""
        self.detector.hooks.stop_requested = True

    def _budget_ends_window(self, run: ProfileRun) -> OverBudget | None:
        """At a boundary of the recording: the budget was passed, or the next step would pass its ceiling, so the
        recording ends at the end of this step; None to record on."""
        budget = self.budget
        if budget is None or not run.recording:
            return None
        if budget.tripped is not None:
            return budget.tripped
        ending = run.recorded_steps + 1  # the step that ends now
        if run.windows_done or ending >= run.settings.active:
            return None  # the window closes here anyway
        return budget.next_step_past_ceiling(ending)

    def _end_at_step(self, run: ProfileRun, tripped: OverBudget) -> None:
        run.step(last=True)  # the profiler stops instead of stepping: the steps so far are whole
        note = tripped.kept_note(run.recorded_steps, run.settings.active, stacks=run.settings.with_stack)
        run.notes.append(note)
        run.said.add(note)
        self.say(note)

    def _end_recording_early(self) -> None:
        if not self.on_script_thread:
            self.detector.hooks.stop_requested = True  # only the script's thread may drive the profiler: it will
            return
        run, tripped = self.run, self.budget.hard if self.budget is not None else None
        if run is None or not run.profiling or tripped is None:
            return
        if run.windows_done == 0 and run.recorded_steps == 0:
            if self._record_lighter(run, tripped):
                return
            self.gave_up = tripped.gave_up_note(run.script or "the script", self.dropped)
            run.discard()  # no whole step to keep: the run ends with why, not with an empty trace
            self.say(self.gave_up)
            return
        run.cut_inside_step = True  # the step under way is left out of the trace
        run.stop()  # writes what was recorded; the script runs on
        note = tripped.note(run.recorded_steps, partial=run.partial[0] if run.partial else None,
                            stacks=run.settings.with_stack)  # fmt: skip
        run.notes.append(note)
        run.said.add(note)
        self.say(note)

    def _record_lighter(self, old: ProfileRun, tripped: OverBudget) -> bool:
        """The window's first recorded step cannot be recorded whole: record the window again without memory
        profiling, Python stacks and input shapes, all at once, from the next step on; False when none is left.

        torch.profiler builds its recorder when a window's warm-up starts (``prepare_trace``): what it records
        cannot change inside a window, so the window is left out and starts again (no wait: the script is warm;
        one warm-up step, whose high-water mark the budget leaves out).
        """
        lighter_settings = lightest(old.settings)
        if lighter_settings is None:
            return False
        settings, dropped = lighter_settings
        self.dropped.extend(dropped)
        old.discard()
        run = successor(old, dataclasses.replace(settings, wait=0, warmup=min(settings.warmup, 1)))
        note = tripped.dropped_note(dropped, self.steps() + 1)  # the steps passed: the cut step is the next
        run.notes.append(note)
        run.said.add(note)
        self.say(note)
        self.run = run  # it starts at the next boundary, with a budget of its own
        if self.budget is not None:
            self.budget.stop()
            self.budget = None
        return True

    def why_nothing(self, script: str) -> str | None:
        """Why no step was recorded, when the memory budget is the reason; None when it is not."""
        if self.gave_up is not None:
            return self.gave_up
        if self.dropped:
            return (
                f"no step was recorded: {script}'s first recorded step did not fit the memory budget (said above), "
                f"and the script ended before the window recorded again without {budget_words(self.dropped)} held a "
                f"whole step; run more steps, or raise the budget (${ENV_BUDGET}=MiB) if the machine has the memory"
            )
        return None

    def _step_aside(self) -> None:
        """The script starts torch.profiler itself: stop the run, keeping what was recorded."""
        run = self.run
        if run is not None and run.started and self.on_script_thread:
            run.stop()
        if self.on_aside is not None:
            self.on_aside()


def successor(old: ProfileRun, settings: CaptureSettings) -> ProfileRun:
    """A new run in ``old``'s place: its folder, name and script; the run's notes so far still hold."""
    run = ProfileRun(settings, out=old.folder, name=old.name)
    run.script = old.script
    run.notes.extend(old.notes)
    run.said.update(old.said)
    return run
