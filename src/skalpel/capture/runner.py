"""``skalpel run``: run an unchanged script in-process, as ``python SCRIPT`` would, and profile it.

Step boundaries are found without the user's help (``capture/steps.py``; ``step_on``
picks the signal); a script that opens its own ``skalpel.profile()`` keeps its own
steps. While steps are awaited, a watchdog says when none came for ``step_timeout_s``. Once every window is
recorded the profiler is gone and the script runs on to its end, unless
``stop_after_capture``. Whatever happens to the script (an exception, Ctrl-C, SIGTERM,
SIGHUP, ``sys.exit``, ``os._exit``), the trace recorded so far is kept, analysed, and the
exit status is kept; an interruption while the trace is written waits for the file to be
whole, and one during the analysis leaves the trace and says so. A run that recorded
nothing leaves no folder behind. Threads the script leaves running do not crash the
process's end (``exits.py``).

``driver.py`` turns the boundaries into the session's start and steps (a takeover, the memory
budget), as for ``skalpel watch``'s captures. Scripts that would break the capture: one that starts
``torch.profiler`` itself makes skalpel stop its own session there (``aside.py``); steps are marked in the thread that
runs the script only (a profiler driven from two threads crashes); a forked child runs
unprofiled and leaves the run folder to its parent.
"""

from __future__ import annotations

import runpy
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from ..errors import SkalpelError
from ..result.sections import RunLedger
from . import compile_log, distributed, exits, profile, runclock, signals
from .aside import ProfilerWatch
from .boundaries import Takeover, why_no_boundary
from .children import Children
from .conclude import RunResult, conclude, holding
from .driver import Driver
from .kineto_noise import filtered_stderr
from .memory_history import MemoryHistory
from .session import ProfileRun
from .settings import CaptureSettings
from .steps import StepDetector, Watchdog
from .target import Target, as_main, check_target, exit_status


class CaptureComplete(BaseException):
    """Raised at a step boundary to stop the script once capture is done (--stop-after-capture).

    A BaseException, so that a script's ``except Exception`` does not swallow it.
    """


def run(target: Target, settings: CaptureSettings, *, out: Path | None = None, name: str | None = None,
        stop_after_capture: bool = False, step_on: str | None = None, step_timeout_s: float = 30.0,
        shown: Callable[[RunResult], int] | None = None, memory_history: int | None = None) -> RunResult:  # fmt: skip
    """Run ``target`` under the profiler; the report is None when nothing was recorded (``notes`` say why).

    ``shown`` presents a result and returns the exit status: it is called here, before the process ends, when
    the script calls ``os._exit`` (which never returns). ``memory_history``: record the CUDA allocator's history
    (that many actions) from the script's start and dump it as a snapshot into the run folder (``memory_history.py``).
    """
    code_path = check_target(target)
    label = name or target.label
    reused = out is not None and Path(out).exists()
    folder = distributed.run_folder(out, label)  # absolute: the script may change directory
    own = ProfileRun(settings, out=folder, name=label)
    capture = _Capture(own, stop_after_capture, step_on=step_on, step_timeout_s=step_timeout_s)
    signals.set_owner()
    guard = signals.Guard()
    compile_log.install()  # before the script: its first compilation comes before the first step
    exits.ran_script()
    filtering, installed = filtered_stderr(), capture.installed()
    history = _start_history(memory_history)

    def concluded_at_exit(status: int) -> int:
        """The script calls os._exit(status): the run is written and shown first, as at the script's end."""
        guard.hold()
        runclock.uninstall()
        installed.__exit__()
        capture.result_run.notes.append(
            f"the script ended its process with os._exit({status}): skalpel wrote the run first; the rest of the "
            "script, its finally blocks and its exit handlers did not run, as os._exit does"
        )
        try:
            result = conclude(capture, guard, target, status, None, folder, removable=not reused, history=history)
        except SkalpelError as error:
            _say(f"error: {error}")
            return error.exit_code
        finally:
            filtering.__exit__()
            guard.__exit__()
        return shown(result) if shown is not None else result.exit_status

    with guard, filtering:  # until the trace is written and analysed
        ending = exits.os_exit_concludes(concluded_at_exit, owner=signals.is_owner,
                                         holding=lambda: holding(capture.result_run))  # fmt: skip
        with installed, as_main(target, code_path), ending:
            runclock.install()  # last: the script's start
            status, error = run_script(target, code_path, guard)
            runclock.uninstall()  # first: the script's end
        if not signals.is_owner():  # a child the script forked came back here
            return RunResult(status, None, error=error, forked_child=True)
        return conclude(capture, guard, target, status, error, folder, removable=not reused, history=history)


def _start_history(max_entries: int | None) -> MemoryHistory | None:
    """``--memory-history``: record from here (the script's start); without CUDA, one line and the run goes on."""
    if max_entries is None:
        return None
    history = MemoryHistory(max_entries)
    line = history.start()
    if line is not None:
        _say(line)
        return None
    return history


def run_script(target: Target, code_path: Path, guard: signals.Guard) -> tuple[int, BaseException | None]:
    """Run the script to its end; its exit status and its own exception, if any."""
    try:
        try:
            if target.module:
                runpy.run_module(target.name, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(str(code_path), run_name="__main__")
        finally:
            guard.hold()  # at once: a signal from here on must not land in skalpel's own code
    except CaptureComplete:
        pass
    except SystemExit as exit_:
        return exit_status(exit_), None
    except KeyboardInterrupt as interrupt:
        return 130, interrupt
    except signals.Terminated as stopped:
        return stopped.exit_status, stopped
    except BaseException as raised:  # noqa: BLE001 - the script's error is shown, not ours to judge
        return 1, raised
    return 0, None


RUNS_ON_S = 10.0  # a script still running this long after the capture is told how to end it


def runs_on_note(run: ProfileRun, seconds: float) -> str:
    """One line for a script that runs on after its steps were recorded (a loop until solved, a dummy dataset)."""
    return (
        f"the {run.recorded_steps} step(s) are recorded and the script has run on for {seconds:.0f} s since: the "
        "report comes when it ends. Press Ctrl-C to end it now (the trace is kept and analysed), or rerun with "
        "--stop-after-capture to end it once the steps are recorded"
    )


def between_words(ledger: RunLedger | None) -> str | None:
    """What the run's clock measured between the steps, for the note on work held before the first step; None when
    it saw none."""
    if ledger is None or ledger.long_steps == 0:
        return None
    named = ledger.between_no_grad_s + ledger.between_eval_s
    return (
        f"skalpel's clock measured it: {ledger.pct(ledger.between_steps_s):.0f}% of the run ({ledger.between_steps_s:.1f} "
        f"of {ledger.run_s:.1f} s) went between the steps, in {ledger.long_steps} step(s) far longer than the typical "
        f"{ledger.step_s * 1000:.1f} ms, {named:.1f} s of it under no_grad (an RL rollout, an evaluation); each "
        "recorded step is one optimizer step, not the iteration"
    )


class _Capture:
    """Drives skalpel's own session from detected boundaries (``driver.py``), until a user's session takes over."""

    def __init__(self, own: ProfileRun, stop_after_capture: bool, *, step_on: str | None = None,
                 step_timeout_s: float = 30.0) -> None:  # fmt: skip
        self.user: profile.Profile | None = None
        self.stop_after_capture = stop_after_capture
        self.detector = StepDetector(self._boundary, only=step_on)
        self.driver = Driver(self.detector, _say, run=own, on_takeover=self._taken_over, on_aside=self._step_aside)
        self.watchdog = Watchdog(self.detector.policy, step_timeout_s, _say,
                                 done=lambda: self.user is not None or self.own.capture_complete)  # fmt: skip
        self.children = Children()  # processes the script starts: training there is said, not recorded
        self.detector.on_child_boundary = self.children.boundary
        self.runs_on: threading.Timer | None = None  # says how to end a script that runs on after the capture

    @property
    def own(self) -> ProfileRun:
        """skalpel's own session (a new one after a takeover, or when the budget records lighter)."""
        assert self.driver.run is not None
        return self.driver.run

    @property
    def aside(self) -> ProfilerWatch:
        return self.driver.aside

    @property
    def result_run(self) -> ProfileRun:
        return self.user or self.own

    def _boundary(self) -> None:
        clock = runclock.active()
        if clock is not None and self.driver.on_script_thread:
            clock.mark()
        if not self.driver.boundary():
            return
        # recorded, and un-profiled steps timed after it for the overhead baseline's check
        self.detector.settle()  # a stronger signal may still show the real iteration, and take over
        if clock is not None and not self.detector.hooks.installed:
            clock.continue_marking(self.detector.policy.marking)
        if self.stop_after_capture:
            raise CaptureComplete
        self._time_runs_on()

    def _time_runs_on(self) -> None:
        """Once: if the script is still running RUNS_ON_S after the capture, say how to end it (rank 0 only)."""
        current = distributed.job()
        if self.runs_on is not None or (current is not None and current.rank != 0):
            return
        run = self.own
        self.runs_on = threading.Timer(RUNS_ON_S, lambda: _say(runs_on_note(run, RUNS_ON_S)))
        self.runs_on.daemon = True
        self.runs_on.name = f"{exits.OWN_THREAD_PREFIX}runs-on"  # skalpel's: never keeps the process's end waiting
        self.runs_on.start()

    def _taken_over(self, takeover: Takeover) -> None:
        if self.runs_on is not None:  # the replaced capture's: the new one is not recorded yet
            self.runs_on.cancel()
            self.runs_on = None

    def _step_aside(self) -> None:
        """The script starts torch.profiler itself: stop marking steps; the driver stopped our session, keeping what
        was recorded, and a script's own skalpel.profile() stops too."""
        self.detector.uninstall()
        if self.user is not None and self.user.started and self.driver.on_script_thread:
            self.user.stop()

    def notes(self, guard: signals.Guard, error: BaseException | None) -> list[str]:
        """What the report should say about how this run went, beyond the numbers."""
        run = self.result_run
        notes = []
        if self.aside.where is not None and run.trace_paths:
            notes.append(
                f"the script starts torch.profiler itself ({self.aside.where}): skalpel stopped its own capture "
                f"there (two profilers at once crash), after {run.recorded_steps} recorded step(s)"
            )
        notes.extend(takeover.note() for takeover in self.detector.policy.takeovers)
        held = self.detector.policy.held_note(measured=between_words(run.run_ledger))
        for note in (held, self.detector.policy.skipped_note()):
            if note is not None:
                notes.append(note)
        children = self.children.note(run.step_signal if run.steps_done else None)
        if children is not None:
            notes.append(children)
        for name, count in self.detector.policy.other_threads.items():
            notes.append(
                f"{count} optimizer.step() call(s) came from thread {name!r}: skalpel marks steps in the main thread "
                "only, which runs the script (a profiler driven from two threads crashes); the steps profiled are the "
                "main thread's, and that thread's ops are in the trace only where they ran during them"
            )
        for signum in guard.arrived:
            handler = "the script's own handler" if signum in guard.script_handlers else "skalpel"
            notes.append(
                f"{signals.name(signum)} arrived after {self.steps_ran()} step(s) and was handled by {handler}; "
                f"the trace holds the {run.recorded_steps} step(s) recorded before it"
            )
        if isinstance(error, KeyboardInterrupt):
            notes.append(f"interrupted (Ctrl-C) after {self.steps_ran()} step(s); the trace holds the "
                         f"{run.recorded_steps} step(s) recorded before it")  # fmt: skip
        return notes

    def steps_ran(self) -> str:
        """How many steps the script ran, in words: the run's clock counted them to the end where it could (the
        session's own count stops with the capture), else the boundaries, and "at least" where counting stopped."""
        ledger = self.result_run.run_ledger
        counted = self.detector.policy.steps_ran
        if ledger is None:
            return str(counted)
        return str(max(counted, ledger.steps)) if ledger.steps_to_end else f"at least {max(counted, ledger.steps)}"

    def _adopt(self, user: profile.Profile) -> Path | None:
        """A script's own skalpel.profile() session: it keeps its steps, we stand down."""
        if not signals.is_owner():  # a forked child profiling its own training: a folder of its own
            self.children.own_session()
            return None
        self.detector.uninstall()
        if self.own.started:
            self.own.discard()  # the driver's budget sees it stopped
        self.user = user
        return self.own.folder

    def why_nothing(self, target: Target, *, failed: bool = False) -> str:
        if self.aside.where is not None:
            return (
                f"{target.name} starts torch.profiler itself ({self.aside.where}) before skalpel recorded a step: "
                "skalpel stepped aside (two profilers at once crash); `skalpel analyze` reads the trace it writes"
            )
        if self.user is not None:
            return f"{target.name} opened skalpel.profile() but recorded no step (call run.step() once per iteration)"
        budget = self.driver.why_nothing(target.name)  # a step too large for the memory budget, not --warmup
        if budget is not None:
            return budget
        policy = self.detector.policy
        why = why_no_boundary(policy, target.name, batches=self.detector.hooks.batches, failed=failed,
                              children=self.children.note(None))  # fmt: skip
        if why is not None:
            return why
        count = policy.steps_ran
        settings = self.own.settings
        return (
            f"no step was recorded: {target.name} ran {count} step(s), and recording starts at step "
            f"{settings.wait + settings.warmup + 2} (after {settings.wait + settings.warmup + 1} un-profiled steps); "
            "run more steps or lower --warmup"
        )

    def installed(self) -> _Installed:
        return _Installed(self)


class _Installed:
    def __init__(self, capture: _Capture) -> None:
        self.capture = capture

    def __enter__(self) -> None:
        self.capture.detector.install()
        self.capture.children.install()
        self.capture.driver.install()
        self.capture.watchdog.start()
        profile.set_listener(self.capture._adopt)

    def __exit__(self, *exc: object) -> None:
        profile.set_listener(None)
        if self.capture.runs_on is not None:
            self.capture.runs_on.cancel()  # the script ended: the report follows
        self.capture.watchdog.stop()
        self.capture.driver.uninstall()
        self.capture.detector.uninstall()
        self.capture.children.uninstall()


def _say(message: str) -> None:
    print(f"skalpel: {message}", file=sys.stderr, flush=True)
