"""``skalpel.profile()``: a torch.profiler session with the expert defaults, stepped by the user's loop.

::

    with skalpel.profile() as run:
        for batch in loader:
            train_step(batch)
            run.step()
    print(run.report().steps)

The session and its step clock are ``ProfileRun``'s (``session.py``); what is the user's own is
here: Kineto's chatter filtered and the memory budget watched while it records (``skalpel run``
does both for the whole script), and at the block's end the run folder written
(``outputs.py``): ``run.report()`` and ``run.written``. Under ``skalpel run`` the session takes
the steps over from skalpel's own (the listener).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

from ..errors import SkalpelError
from ..result.report import Report, show_inline_with
from .budget import OverBudget, RecordingBudget
from .kineto_noise import filtered_stderr
from .outputs import Outputs, own_report, write_run
from .session import ProfileRun
from .settings import CaptureSettings

# Set by `skalpel run` while a script runs: a user's own skalpel.profile() session takes over
# the step boundaries; the listener is told and returns the run folder the session should use.
_listener: Callable[[Profile], Path | None] | None = None


def set_listener(listener: Callable[[Profile], Path | None] | None) -> None:
    """Set (or, with None, clear) the listener told of each skalpel.profile() session the script starts."""
    global _listener
    _listener = listener


def profile(
    *,
    wait: int = 1,
    warmup: int = 2,
    active: int = 5,
    repeat: int = 1,
    out: str | Path | None = None,
    name: str | None = None,
    record_shapes: bool = True,
    profile_memory: bool = True,
    with_stack: bool = True,
    with_flops: bool | None = None,
    with_modules: bool = False,
    cuda: bool | None = None,
    write: bool = True,
) -> Profile:
    """Profile a loop: call ``run.step()`` once per iteration inside ``with skalpel.profile() as run``.

    ``out`` is the run folder (default ``./skalpel-runs/<time>-<name>``); ``write=False``
    keeps everything but the trace out of it. Every torch.profiler setting can be overridden.
    """
    settings = CaptureSettings(
        wait=wait, warmup=warmup, active=active, repeat=repeat, record_shapes=record_shapes,
        profile_memory=profile_memory, with_stack=with_stack, with_flops=with_flops,
        with_modules=with_modules, cuda=cuda,
    )  # fmt: skip
    return Profile(settings, out=Path(out) if out is not None else None, name=name, write=write)


class Profile(ProfileRun):
    """What ``skalpel.profile()`` gives: the session, stepped by ``run.step()``, and its report and files."""

    def __init__(self, settings: CaptureSettings, *, out: Path | None = None, name: str | None = None,
                 write: bool = True) -> None:  # fmt: skip
        super().__init__(settings, out=out, name=name)
        self.write = write
        self.step_signal = "run.step()"
        self._outputs: Outputs | None = None
        self._report: Report | None = None
        self._stderr: filtered_stderr | None = None  # Kineto's chatter filtered while it records
        self._budget: RecordingBudget | None = None
        self._over_budget: OverBudget | None = None  # set by the budget's thread, acted on at the next run.step()

    def start(self) -> Profile:
        if self.started:
            raise SkalpelError("this skalpel.profile() session was already started")
        if _listener is not None:
            given = _listener(self)
            self.folder = self.folder or given
        self._stderr = filtered_stderr()
        self._stderr.__enter__()
        self._budget = RecordingBudget(lambda: self.profiling, lambda: self.recording, self._note_over_budget)
        self._budget.start()
        super().start()
        return self

    def step(self) -> None:
        """Mark the end of one iteration."""
        tripped = self._over_budget
        if tripped is None or not self.profiling:
            return super().step()
        self._over_budget = None
        super().step(last=True)  # the recording ends at this boundary: the steps so far are whole
        note = tripped.note(self.recorded_steps, cut=False)
        self.notes.append(note)
        print(f"skalpel: {note}", file=sys.stderr, flush=True)

    def _note_over_budget(self, tripped: OverBudget) -> None:
        self._over_budget = tripped  # from the budget's thread: only the loop's thread drives the profiler

    def _stop_profiler(self) -> None:
        super()._stop_profiler()
        if self._stderr is not None:
            self._stderr.__exit__(None, None, None)
            self._stderr = None
        if self._budget is not None:
            self._budget.stop()

    def __enter__(self) -> Profile:
        return self.start()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.stop()
        if self.write and self.trace_paths and self._outputs is None:
            try:
                self.outputs()
            except SkalpelError:
                if exc_type is None:
                    raise

    def outputs(self) -> Outputs:
        """The run's Report and files: the trace analysed and the run folder written, once (on first use)."""
        if self._outputs is None:
            self._outputs = write_run(self, write=self.write)
        return self._outputs

    @property
    def written(self) -> list[Path]:
        """Every file of the run, once written."""
        return self._outputs.written if self._outputs is not None else []

    def _repr_html_(self) -> str | None:
        """In a notebook, the session shows as its HTML report once it ended (the run folder's page, flame graph
        included, when written); before, as its text repr."""
        if self.profiling or not self.trace_paths:
            return None
        from ..report.inline import framed, report_inline

        report = self.report()  # the run folder is written first (when it is)
        page = next((path for path in self.written if path.suffix == ".html"), None)  # the run folder's page
        if page is not None and page.is_file():
            return framed(page.read_text(encoding="utf-8"))
        return report_inline(report)

    def report(self) -> Report:
        """The skalpel Report of the recorded steps (analysed once, on first use)."""
        if self._report is None:
            from ..report.inline import report_inline

            show_inline_with(report_inline)  # in a notebook, the Report shows as the HTML report
            # a rank that leaves the merged report to rank 0: its own trace only
            self._report = self.outputs().report or own_report(self)
        return self._report
