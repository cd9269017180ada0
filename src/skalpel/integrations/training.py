"""One ``skalpel.profile()`` session driven by a framework's training loop: what the Lightning and Hugging Face
callbacks share.

The framework tells when an optimizer step ends (a step is an optimizer step, whatever the gradient accumulation)
and when an evaluation begins and ends. Evaluation is never profiled as training: when it comes during the wait or
warm-up steps, the session is thrown away and a fresh one starts after it; during the recorded window, the
recording ends there and the steps recorded so far are kept whole (the step under way is left out of the trace);
after the window, the time it took is left out of the overhead's check. At the end of training the run folder is
written as ``skalpel run`` writes it, and one line says what was found and where the report is.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ..capture import distributed
from ..capture.profile import Profile, profile
from ..capture.settings import CaptureSettings
from ..errors import SkalpelError
from ..result.report import Report, sorted_findings


class TrainingCapture:
    """The session of one training run, stepped at optimizer steps; ``finish()`` writes the run folder."""

    def __init__(self, signal: str, *, out: str | Path | None = None, name: str | None = None,
                 **settings: Any) -> None:  # fmt: skip
        self.signal = signal  # what marks the steps, for the report (``Lightning optimizer steps``)
        self.out = Path(out) if out is not None else None
        self.name = name
        self.settings = settings  # skalpel.profile()'s own arguments (wait, warmup, active, ...)
        self.run: Profile | None = None
        self.restarts = 0  # sessions thrown away because an evaluation came before their window
        self.steps = 0  # optimizer steps of the whole training
        self.gaps: list[int] = []  # optimizer steps between one evaluation (or the start) and the next
        self._since_evaluation = 0
        self._window: CaptureSettings | None = None  # the settings of a session an evaluation threw away
        self.report: Report | None = None
        self.folder: Path | None = None
        self.error: str | None = None  # why no report was made
        self._finished = False

    def begin(self) -> None:
        """Training starts: the session starts (its first step begins now)."""
        if self.run is None and not self._finished:
            self.run = profile(out=self.out, name=self.name, **self.settings)
            self.run.step_signal = self.signal
            if self.out is None:  # every rank of a job (the callback runs on each at once): rank 0's folder
                self.out = self.run.folder = distributed.folder_by_group(self.run.name)
            self.run.start()

    def optimizer_step(self) -> None:
        """One optimizer step ended: a step boundary, until the overhead's check has its steps."""
        self.steps += 1
        self._since_evaluation += 1
        run = self.run
        if run is None:
            self.begin()  # after an evaluation that threw the last session away
        elif not run.baseline_complete:
            run.step()

    def evaluation_begins(self) -> None:
        if self._since_evaluation:
            self.gaps.append(self._since_evaluation)
        self._since_evaluation = 0
        run = self.run
        if run is None or not run.profiling:
            return
        if run.recording and run.recorded_steps > 0:
            run.notes.append(f"the recording ended after {run.recorded_steps} step(s): an evaluation began "
                             "(evaluation is not profiled as training)")  # fmt: skip
            run.cut_inside_step = True  # the step under way holds the evaluation: left out of the trace
            run.stop()
        else:  # before the window, or at its very start: a fresh session after the evaluation
            self._window = run.settings
            run.discard()
            self.run = None
            self.restarts += 1

    def evaluation_ends(self) -> None:
        if self.run is not None:
            self.run.not_a_step()  # the evaluation's time is no step's

    def finish(self) -> Report | None:
        """Training ended: stop, analyse, write the run folder and say it in one line on stderr (once)."""
        if self._finished:
            return self.report
        self._finished = True
        run = self.run
        if run is None and self._window is not None:  # the last evaluation threw the last session away
            self.error = self._why_nothing(self._window, recorded=0)
        elif run is None:
            self.error = "no training step was profiled: training ended before the session started"
        else:
            try:
                outputs = run.outputs()
                self.report, self.folder = outputs.report, run.folder
            except SkalpelError as error:
                self.error = self._why_nothing(run.settings, run.recorded_steps) or str(error)
        print(self.summary_line(), file=sys.stderr, flush=True)
        return self.report

    def _why_nothing(self, settings: CaptureSettings, recorded: int) -> str | None:
        """Why no step was recorded, in the callback's terms (its steps are optimizer steps it counts, never a
        ``run.step()`` the user forgot); None when the session's own reason holds."""
        if recorded > 0:
            return None
        window = settings.wait + settings.warmup + settings.active
        shape = (f"{window} optimizer steps ({settings.wait} wait, {settings.warmup} warm-up, "
                 f"{settings.active} recorded)")  # fmt: skip
        if self.restarts == 0:
            return (f"no step was recorded: training took {self.steps} optimizer step(s), fewer than skalpel's window "
                    f"of {shape}; train longer, or ask for a shorter window (wait=0, warmup=1, active=1)")  # fmt: skip
        longest = max([*self.gaps, self._since_evaluation])
        # after an evaluation the session starts at the next optimizer step: one warm-up step, then the recording
        shorter = (f"or ask for a window that fits: wait=0, warmup=1, active={longest - 2}" if longest >= 3
                   else "no window fits between them")  # fmt: skip
        return (f"no step was recorded: an evaluation or a checkpoint save came at most {longest} optimizer step(s) "
                f"apart ({self.restarts} restart(s) of the session after one), never leaving room for skalpel's "
                f"window of {shape}; evaluate and save less often while profiling, {shorter}")  # fmt: skip

    def summary_line(self) -> str:
        if self.report is None:
            return f"skalpel: no report: {self.error or 'this rank leaves the report to rank 0'}"
        steps = self.report.steps
        findings = sorted_findings(self.report.findings)
        serious = [f"{f.id} ({f.severity})" for f in findings if f.severity != "info"]
        said = "; ".join(serious) if serious else "no bottleneck found"
        where = self.folder / "report.html" if self.folder is not None else "(not written)"
        ranks = len(self.report.ranks)
        each, unequal = divmod(steps.count, max(ranks, 1))
        counted = f"{steps.count} optimizer steps"
        if ranks > 1 and not unequal:  # the count pools every rank's steps
            counted = f"{each} optimizer steps on each of {ranks} ranks"
        head = f"skalpel: {counted} profiled, median {steps.median_ms:.2f} ms"
        return f"{head}: {said}; report: {where}"
