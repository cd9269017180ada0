"""A recorded ``ProfileRun`` becomes its Report and its run folder: the end of every capture.

``skalpel run`` (``conclude.py``), ``skalpel.profile()`` (``profile.py``) and ``skalpel watch``'s
captures all end here: the session stopped, its trace files go the one road to a Report
(``job.report_of``), with the noise note and the capture's own notes, and
``runfolder.write_outputs`` writes the folder. A rank of a job that leaves the report to rank 0
writes its capture facts beside its trace instead.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..errors import SkalpelError
from ..result.report import Report
from . import distributed, runfolder
from .session import ProfileRun, rank
from .settings import CaptureSettings
from .timing import with_noise_note


@dataclasses.dataclass(frozen=True)
class Outputs:
    """What a capture ended in: its Report (None on a rank that leaves the job's report to rank 0) and every file
    of the run."""

    report: Report | None
    written: list[Path]


def write_run(run: ProfileRun, *, write: bool = True) -> Outputs:
    """Stop ``run``, analyse its trace and write the run folder (``write=False``: the report only, beside the
    trace)."""
    from ..job.report_of import report_of  # the analysis: numpy and the analyses, imported once a run ends

    run.stop()
    if run.export_error is not None:
        raise SkalpelError(str(run.export_error))
    if not run.trace_paths:
        raise SkalpelError(nothing_recorded(run.steps_done, run.settings))
    if not distributed.writes_report():  # rank 0 (or the --nproc launcher) merges every rank's trace
        distributed.save_capture(run.folder, rank(), run.capture_info())
        return Outputs(None, list(run.trace_paths))
    assert run.folder is not None
    paths, missing = distributed.rank_traces(run.folder, run.trace_paths)
    analysis = report_of(paths, capture=run.capture_info(), notes=[missing] if missing else (), flame_files=write)
    report = with_noise_note(analysis.report)
    if run.notes:
        report = dataclasses.replace(report, warnings=report.warnings + tuple(run.notes))
    if not write:
        return Outputs(report, list(run.trace_paths))
    assert analysis.flame is not None
    return Outputs(report, runfolder.write_outputs(report, analysis.flame, run.folder, traces=paths))


def own_report(run: ProfileRun) -> Report:
    """The Report of this rank's trace alone (a rank that leaves the job's report to rank 0)."""
    from ..job.report_of import report_of

    return report_of(run.trace_paths, capture=run.capture_info()).report


def nothing_recorded(steps: int, settings: CaptureSettings) -> str:
    first = settings.wait + settings.warmup + 1
    if steps == 0:
        return "zero steps ran: run.step() was never called (call it once per training iteration)"
    return (
        f"no step was recorded: only {steps} step(s) ran, and recording starts at step {first} "
        f"(after {settings.wait} wait and {settings.warmup} warm-up steps); run more steps or lower them"
    )
