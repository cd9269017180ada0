"""One driver of a ``ProfileRun`` from the step boundaries, for ``skalpel run`` and ``skalpel watch`` alike.

At each boundary on the script's thread (``boundary()``), the run given (``run``) starts, then
steps; ``boundary()`` says when its windows are recorded and the baseline after them timed.
Before that, a takeover (``policy.restart``: a stronger signal replaced the one that marked
the steps) drops what was recorded and records again on the new signal, in the same folder.
While a run profiles, a memory budget of its own watches the process; past it, the recording
ends at the next hook (``TorchHooks.on_stop_request``), or, in the window's first recorded
step, starts again lighter (``budget.lighter``). A script that starts torch.profiler itself
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
from .budget import OverBudget, RecordingBudget, lighter
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
        self.budget = RecordingBudget(lambda: run.profiling, lambda: run.recording, self._over_budget)
        self.budget.start()  # before the profiler: its first reading is the memory held before it
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
        """The budget's thread: the next hook on the script's thread ends the recording."""
        self.detector.hooks.stop_requested = True

    def _end_recording_early(self) -> None:
        if not self.on_script_thread:
            self.detector.hooks.stop_requested = True  # only the script's thread may drive the profiler: it will
            return
        run, tripped = self.run, self.budget.tripped if self.budget is not None else None
        if run is None or not run.profiling or tripped is None:
            return
        if run.windows_done == 0 and run.recorded_steps == 0 and self._record_lighter(run, tripped):
            return
        run.cut_inside_step = True  # the step under way is left out of the trace
        run.stop()  # writes what was recorded; the script runs on
        note = tripped.note(run.recorded_steps, partial=run.partial[0] if run.partial else None)
        run.notes.append(note)
        run.said.add(note)
        self.say(note)

    def _record_lighter(self, old: ProfileRun, tripped: OverBudget) -> bool:
        """The window's first recorded step tripped the budget: record the window again without memory profiling
        (then without stacks), from the next step on; False when nothing is left to drop.

        torch.profiler builds its recorder when a window's warm-up starts (``prepare_trace``): what it records
        cannot change inside a window, so the window is left out and starts again (no wait: the script is warm).
        """
        lighter_settings = lighter(old.settings)
        if lighter_settings is None:
            return False
        settings, dropped = lighter_settings
        old.discard()
        run = successor(old, dataclasses.replace(settings, wait=0))
        note = tripped.dropped_note(dropped, self.steps() + 1)  # the steps passed: the cut step is the next
        run.notes.append(note)
        run.said.add(note)
        self.say(note)
        self.run = run  # it starts at the next boundary, with a budget of its own
        if self.budget is not None:
            self.budget.stop()
            self.budget = None
        return True

    def _step_aside(self) -> None:
        """The script starts torch.profiler itself: stop the run, keeping what was recorded."""
        run = self.run
        if run is not None and run.started and self.on_script_thread:
            run.stop()
        if self.on_aside is not None:
            self.on_aside()


def successor(old: ProfileRun, settings: CaptureSettings) -> ProfileRun:
    """A new run in ``old``'s place: its folder, name and script; the run's notes so far (the malloc threshold
    held...) still hold."""
    run = ProfileRun(settings, out=old.folder, name=old.name)
    run.script = old.script
    run.notes.extend(old.notes)
    run.said.update(old.said)
    return run
