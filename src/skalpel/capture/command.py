"""What ``skalpel run`` and ``skalpel demo`` do once their arguments are parsed.

Run the target under the profiler, print the summary and every file written, then
show the script's own error (if any) and hand its exit status back to the CLI.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ..errors import SkalpelError
from .boundaries import SIGNALS as STEP_SIGNALS
from .settings import HISTORY_ENTRIES, CaptureSettings

if TYPE_CHECKING:  # the runner imports torch: only once a script really runs (`skalpel --help` stays torch-free)
    from ..result.report import Report
    from .conclude import RunResult
    from .target import Target

def add_capture_options(parser: argparse.ArgumentParser, *, repeat: int = 1) -> None:
    parser.add_argument("--out", metavar="DIR", help="run folder (default ./skalpel-runs/<time>-<name>)")
    parser.add_argument("--name", help="name in the run folder's name (default: the script's name)")
    parser.add_argument("--wait", type=int, default=1, metavar="N", help="un-profiled steps before each window (1)")
    parser.add_argument("--warmup", type=int, default=2, metavar="N", help="profiler warm-up steps, not recorded (2)")
    parser.add_argument("--active", type=int, default=5, metavar="N", help="recorded steps per window (5)")
    parser.add_argument(
        "--repeat", type=int, default=repeat, metavar="N",
        help=f"capture windows; with 2 or more the spread of their medians is reported as noise ({repeat})",
    )  # fmt: skip
    parser.add_argument(
        "--stop-after-capture", action="store_true", help="end the script once the steps are recorded"
    )
    parser.add_argument(
        "--step-on", choices=STEP_SIGNALS, default=None,
        help="what marks the end of one iteration (default: the first the script shows, in this order)",
    )  # fmt: skip
    parser.add_argument(
        "--step-timeout", type=float, default=30.0, metavar="S",
        help="say so when no step boundary comes for S seconds (30; 0: never)",
    )  # fmt: skip
    parser.add_argument(
        "--memory-history", action="store_true",
        help="on a CUDA run, record the caching allocator's history from the start and write a memory snapshot into "
        "the run folder at the end or at an out-of-memory error, read into the report",
    )  # fmt: skip
    parser.add_argument(
        "--memory-history-entries", type=_entries, default=HISTORY_ENTRIES, metavar="N",
        help=f"allocator actions --memory-history keeps, the latest ({HISTORY_ENTRIES:,})",
    )  # fmt: skip
    parser.add_argument(
        "--no-stack", action="store_true",
        help="record no Python stacks: a lighter profile for steps of very many ops (no user-code locations)",
    )  # fmt: skip


def execute(target: Target, args: argparse.Namespace, *,
            advise: Callable[[Report, Path | None], Report] | None = None) -> int:  # fmt: skip
    """Profile ``target`` with the options in ``args``; returns the exit status to use. ``advise`` may add to
    the printed report's advice (``skalpel run``: what ``skalpel tune`` measured, given by the CLI layer)."""
    from . import distributed
    from .runner import run
    from .signals import Terminated

    settings = CaptureSettings(wait=args.wait, warmup=args.warmup, active=args.active, repeat=args.repeat,
                               with_stack=not getattr(args, "no_stack", False))  # fmt: skip
    current = distributed.job()
    if current is None or (current.rank == 0 and not current.trace_only):  # once per job, not once per rank
        print(f"skalpel: profiling {target.name}: {settings.describe()}", file=sys.stderr)
    if getattr(args, "nproc", 1) > 1:
        return _execute_ranks(target, args)
    out = Path(args.out) if args.out else None
    history = args.memory_history_entries if getattr(args, "memory_history", False) else None
    try:
        result = run(target, settings, out=out, name=args.name, stop_after_capture=args.stop_after_capture,
                     step_on=args.step_on, step_timeout_s=args.step_timeout, memory_history=history,
                     shown=lambda result: _present(result, target, advise))  # fmt: skip
    except Terminated as stopped:  # SIGTERM or SIGHUP as `skalpel run` let go of its signal handlers
        print(f"skalpel: stopped by {stopped}", file=sys.stderr)
        return stopped.exit_status
    return _present(result, target, advise)


def _present(result: RunResult, target: Target, advise: Callable[[Report, Path | None], Report] | None) -> int:
    """Print the report, the files written and the script's own error; the exit status to use."""
    from ..report import terminal

    if result.forked_child:
        print(f"skalpel: process {os.getpid()}, forked by {target.name}, ended (exit status {result.exit_status}); "
              "it was not profiled, its parent writes the run", file=sys.stderr)  # fmt: skip
        return result.exit_status
    if result.report is not None:
        terminal.print_report(result.report if advise is None else advise(result.report, result.folder))
        terminal.print_written(result.written)
    if result.error is not None:
        _show_error(result)
    if result.report is None:
        for note in result.notes:
            print(f"skalpel: {note}", file=sys.stderr)
        if result.written:  # beside its notes (the memory split says why it was left out, for one)
            print(f"skalpel: wrote {result.written[0]} (rank 0 writes the merged report)", file=sys.stderr)
    return result.exit_status


def _execute_ranks(target: Target, args: argparse.Namespace) -> int:
    """``--nproc N``: every rank through torch.distributed.run, then one merged report."""
    from ..report import terminal

    status, report, written = launch_and_merge(target, args)
    if report is None:
        print(f"skalpel: no rank of {target.name} recorded a step (exit status {status}); nothing to analyse",
              file=sys.stderr)  # fmt: skip
        return status or 1
    terminal.print_report(report)
    terminal.print_written(written)
    return status


def _show_error(result: RunResult) -> None:
    from .script_error import script_traceback
    from .signals import Terminated, name

    error = result.error
    assert error is not None
    if isinstance(error, Terminated):
        print(f"skalpel: the script was stopped by {name(error.signum)} "
              f"(exit status {result.exit_status})", file=sys.stderr)  # fmt: skip
        return
    print(f"skalpel: the script stopped with {type(error).__name__} (exit status {result.exit_status}):",
          file=sys.stderr)  # fmt: skip
    sys.stderr.write(result.error_text or script_traceback(error))


def script_target(args: argparse.Namespace) -> Target:
    from .target import Target

    if not args.target:
        raise SkalpelError("give a script to run (skalpel run train.py [ARGS]) or a module (skalpel run -m MODULE)")
    return Target(args.target, tuple(args.args), module=args.module)


def launch_and_merge(target: Target, args: argparse.Namespace) -> tuple[int, Report | None, list[Path]]:
    """``skalpel run --nproc N``: run N ranks through torch.distributed.run, then merge their traces.

    Returns (exit status, report or None, files written).
    """
    from ..job.report_of import report_of
    from ..result.report import CaptureInfo
    from . import distributed, runfolder
    from .target import check_target

    if distributed.job() is not None:
        raise SkalpelError("--nproc launches the ranks itself: under torchrun (or another launcher) leave it out")
    check_target(target)
    label = args.name or target.label
    folder = runfolder.prepare(Path(args.out)) if args.out else runfolder.prepare_new(runfolder.default_folder(label))
    script = (["-m"] if target.module else []) + [target.name, *target.args]
    status = distributed.launch(args.nproc, forwarded_options(args) + script, folder)
    traces = sorted(folder.glob("trace-rank*.json.gz"))
    if not traces:
        if not args.out:
            runfolder.remove_if_empty(folder)  # a run that recorded nothing leaves no folder
        return status, None, []
    missing = [str(rank) for rank in range(args.nproc) if folder / runfolder.trace_file_name(rank) not in traces]
    notes = []
    if missing:
        notes.append(f"rank(s) {', '.join(missing)} wrote no trace (exit status {status}); the report covers the others")
    capture = distributed.load_capture(folder) or CaptureInfo(
        warmup_steps=args.wait + args.warmup, wait_steps=args.wait, active_steps=args.active, repeats=args.repeat,
    )  # fmt: skip
    capture = dataclasses.replace(capture, script=target.name, exit_status=status)
    analysis = report_of(traces, capture=capture, notes=notes, flame_files=True)
    assert analysis.flame is not None
    return status, analysis.report, runfolder.write_outputs(analysis.report, analysis.flame, folder, traces=traces)


def forwarded_options(args: argparse.Namespace) -> list[str]:
    """The capture options of ``skalpel run`` as the ranks get them (everything but --nproc and --out)."""
    options = ["--wait", str(args.wait), "--warmup", str(args.warmup), "--active", str(args.active),
               "--repeat", str(args.repeat)]  # fmt: skip
    if args.name:
        options += ["--name", args.name]
    if args.stop_after_capture:
        options.append("--stop-after-capture")
    if getattr(args, "step_on", None):
        options += ["--step-on", args.step_on]
    if getattr(args, "step_timeout", None) is not None:
        options += ["--step-timeout", str(args.step_timeout)]
    if getattr(args, "no_stack", False):
        options.append("--no-stack")
    if getattr(args, "memory_history", False):
        options += ["--memory-history", "--memory-history-entries", str(args.memory_history_entries)]
    return options


def _entries(text: str) -> int:
    """--memory-history-entries: a whole number of at least 1, else argparse's one-line error."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a whole number of allocator actions, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"at least 1 allocator action (got {value})")
    return value
