"""After the script of ``skalpel run``: write the trace whole, analyse it, say what the run folder holds.

The analysis and the run folder are ``outputs.py``'s, as for every capture; a script's own
``skalpel.profile()`` may have written them already, at the end of its block.

A signal while the trace is written waits for the file (``signals.deferred``), then skips
the analysis; one during the analysis leaves the trace; either way the message lists what
the folder holds and how to get the report from it. A full disk is said as such. A run
that recorded nothing removes the folder skalpel made for it, and says why nothing was.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ..errors import SkalpelError
from . import compile_log, distributed, runclock, runfolder, signals
from .memory_history import MemoryHistory, snapshot_note
from .oom import is_out_of_memory, out_of_memory_note, process_memory
from .outputs import write_run
from .profile import Profile
from .runledger import run_ledger
from .script_error import let_go, script_traceback
from .session import ProfileRun
from .target import Target

if TYPE_CHECKING:
    from ..result.report import Report


class _Aside(Protocol):
    where: str | None  # the script's line that started its own torch.profiler, if it did


class Capture(Protocol):
    """What the end of a run reads of ``skalpel run``'s capture (the runner's)."""

    @property
    def result_run(self) -> ProfileRun:
        """The session whose trace is the run's: the script's own skalpel.profile(), else skalpel's."""

    @property
    def aside(self) -> _Aside: ...

    def notes(self, guard: signals.Guard, error: BaseException | None) -> list[str]:
        """What the report should say about how this run went, beyond the numbers."""

    def why_nothing(self, target: Target, *, failed: bool = False) -> str:
        """Why no step was recorded, in one line."""


@dataclass
class RunResult:
    exit_status: int
    report: Report | None
    written: list[Path] = field(default_factory=list)
    error: BaseException | None = None  # the script's own exception, to show to the user
    folder: Path | None = None
    notes: list[str] = field(default_factory=list)  # what happened to the run, one line each, for stderr
    forked_child: bool = False  # a child the script forked ended here; its parent writes the run
    error_text: str | None = None  # the error's traceback, taken before its frames were let go (out of memory)


def conclude(capture: Capture, guard: signals.Guard, target: Target, status: int, error: BaseException | None,
             folder: Path, *, removable: bool, history: MemoryHistory | None = None) -> RunResult:  # fmt: skip
    """After the script: write the trace whole, analyse it, and say what the run folder holds. ``history``
    (``--memory-history``) is dumped first: at an out-of-memory error, while the script's tensors are still held."""
    error_text = held = None
    _dump_history(history, capture.result_run.folder or folder)  # before the script's tensors are let go
    if is_out_of_memory(error):  # the script's tensors go before skalpel writes and analyses the trace in their room
        error_text, held = script_traceback(error), process_memory()
        let_go(error)
    result = _conclude(capture, guard, target, status, error, folder, removable=removable, held=held,
                       history=history)  # fmt: skip
    result.error_text = error_text
    return result


def _dump_history(history: MemoryHistory | None, folder: Path) -> None:
    """The memory snapshot of ``--memory-history`` written into the run folder (once; nothing if not recording)."""
    if history is not None and history.recording:
        current = distributed.job()
        history.dump(folder, current.rank if current is not None else None)


def _history_note(history: MemoryHistory | None, error: BaseException | None) -> str | None:
    """The snapshot read into one note for the report, or why it was not written; None when none was recorded."""
    if history is None:
        return None
    if history.written is not None:
        return snapshot_note(history.written, at_error=is_out_of_memory(error))
    return history.failed


def _conclude(capture: Capture, guard: signals.Guard, target: Target, status: int, error: BaseException | None,
              folder: Path, *, removable: bool, held: str | None,
              history: MemoryHistory | None) -> RunResult:  # fmt: skip
    chosen = capture.result_run
    chosen.script = target.name
    chosen.exit_status = status
    clock = runclock.active() or runclock.last()
    if clock is not None:  # first: the notes read it
        chosen.run_ledger = run_ledger(clock, compile_log.compilations())
    chosen.notes.extend(capture.notes(guard, error))
    late = _stop_whole(chosen) or guard.late
    compile_log.uninstall()
    if is_out_of_memory(error) and chosen.trace_paths:  # after the stop: the window's split is made then
        chosen.notes.append(out_of_memory_note(error, chosen, held=held))
    snapshot = _history_note(history, error)  # after the OOM note, which it completes
    if snapshot is not None:
        chosen.notes.append(snapshot)
    notes = [note for note in chosen.notes if note not in chosen.said]  # for stderr: those not said as they happened
    if late is not None:  # interrupted after the script, before the analysis: the file is whole, the analysis skipped
        notes.append(f"{signals.name(late)} while the trace was written: {holding(chosen)}")
        return RunResult(status or 128 + late, None, list(chosen.trace_paths), error, chosen.folder, notes)
    if chosen.export_error is not None:
        held = "part of" if chosen.export_error.kept is not None else "none of"
        notes.append(f"{chosen.export_error}; it holds {held} the {chosen.recorded_steps} recorded step(s)")
        return RunResult(status or 2, None, list(chosen.trace_paths), error, chosen.folder, notes)
    if not chosen.trace_paths:
        return _nothing_recorded(capture, target, status, error, folder, removable=removable)
    try:
        guard.interrupting()
        ended = chosen.outputs() if isinstance(chosen, Profile) else write_run(chosen)
    except (KeyboardInterrupt, signals.Terminated) as stopped:
        code = stopped.exit_status if isinstance(stopped, signals.Terminated) else 130
        notes.append(f"interrupted during the analysis: {holding(chosen)}")
        return RunResult(status or code, None, list(chosen.trace_paths), error, chosen.folder, notes)
    except SkalpelError as failed:
        if status == 0:
            raise
        notes.append(f"the analysis failed ({failed}): {holding(chosen)}")  # the script's failure is the news
        return RunResult(status, None, list(chosen.trace_paths), error, chosen.folder, notes)
    if guard.late is not None:  # came just as the analysis started, and was noted, not raised: the run is whole
        status = status or 128 + guard.late
    if not distributed.writes_report():  # rank 0 (or the --nproc launcher) writes the merged report
        return RunResult(status, None, ended.written, error=error, folder=chosen.folder, notes=notes)
    return RunResult(status, ended.report, ended.written, error=error, folder=chosen.folder, notes=notes)


def _stop_whole(chosen: ProfileRun) -> int | None:
    """Stop the profiler and write the window in progress; the signal that came meanwhile, if any."""
    late: int | None = None
    with signals.deferred() as held:
        try:
            chosen.stop()
        except KeyboardInterrupt:
            late = signal.SIGINT
        except signals.Terminated as stopped:
            late = stopped.signum
    return late if late is not None else held.signum


def holding(chosen: ProfileRun) -> str:
    """What the run folder holds, and how to get the report from it."""
    folder = chosen.folder
    if folder is None or not chosen.trace_paths:
        return "no trace was written"
    return (
        f"{folder} holds {runfolder.holdings(folder)}, with the {chosen.recorded_steps} step(s) recorded; "
        f"`skalpel analyze {folder}` gives the report"
    )


def _nothing_recorded(capture: Capture, target: Target, status: int, error: BaseException | None, folder: Path,
                      *, removable: bool) -> RunResult:  # fmt: skip
    """No trace: remove the run folder skalpel made for it (a job's shared folder stays), then say why."""
    stopped = error is not None or status != 0
    interrupted = isinstance(error, (KeyboardInterrupt, signals.Terminated))
    why = capture.why_nothing(target, failed=stopped and not interrupted)
    notes = [f"{target.name} stopped (exit status {status}) before any step was recorded; {why}" if stopped else why]
    if removable and distributed.job() is None and runfolder.remove_if_empty(folder):
        notes.append(f"nothing was recorded; removed the empty run folder {folder}")
    if error is None and status == 0 and capture.aside.where is None:
        raise SkalpelError("; ".join(notes))
    return RunResult(status, None, error=error, folder=None, notes=notes)


