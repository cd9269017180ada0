"""``skalpel tune``'s arguments and what it does once they are parsed (``cli.py`` only registers it)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from ..errors import SkalpelError

if TYPE_CHECKING:
    from .result import TuneResult


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "tune",
        help="rerun a script with each applicable fix, measure the gain, recommend only what helped",
        description="Profile SCRIPT once for its findings, then rerun it unchanged (the baseline) and with each "
        "fix that applies (DataLoader workers, threads, torch.compile, ...), applied by skalpel without editing "
        "the file, timing steady-state steps without the profiler, interleaved with baseline runs. Recommends "
        "only what was measured faster, with the change to make at the line of your code. Options go before "
        "SCRIPT; everything after it is the script's.",
    )
    parser.add_argument("--list", action="store_true", help="list the candidates and when each is tried")
    parser.add_argument("--try", dest="forced", action="append", default=[], metavar="NAME",
                        help="run this candidate whatever the findings (repeatable; see --list)")  # fmt: skip
    parser.add_argument("--skip", dest="skipped", action="append", default=[], metavar="NAME",
                        help="leave this candidate out whatever the findings (repeatable; see --list)")  # fmt: skip
    parser.add_argument("--budget", type=float, default=300.0, metavar="SECONDS",
                        help="total time for the whole session (300); candidates that do not fit are not run")  # fmt: skip
    parser.add_argument("--warmup", type=int, default=3, metavar="N", help="steps run before timing, per run (3)")
    parser.add_argument("--steps", type=int, default=10, metavar="N", help="steps timed per run (10)")
    parser.add_argument("--repeats", type=int, default=2, metavar="N", help="runs per candidate (2)")
    parser.add_argument("--extra-runs", type=int, default=3, metavar="N",
                        help="more runs, at most, for a candidate whose interval straddles the line (3; 0: none)")  # fmt: skip
    parser.add_argument("--run-steps", type=int, default=None, metavar="N",
                        help="the real run has N steps: one-time costs (a compile) are weighed over them (default: "
                        "the steps the script ran to its end, as far as tune followed it)")  # fmt: skip
    parser.add_argument("--from", dest="findings_from", metavar="PATH",
                        help="take the findings from this run folder, report.json or trace instead of profiling")  # fmt: skip
    parser.add_argument("--no-profile", dest="profile", action="store_false",
                        help="skip the profiled run: candidates from the device and --try only")  # fmt: skip
    parser.add_argument("--json", nargs="?", const="-", metavar="FILE", help="write skalpel.tune/1 JSON to FILE (or stdout)")
    parser.add_argument("--html", metavar="FILE", help="write the result as a self-contained HTML page")
    parser.add_argument("--out", metavar="FILE",
                        help="write the result to FILE in the format its extension names: .json, .html or .txt")  # fmt: skip
    parser.add_argument("target", nargs="?", metavar="SCRIPT", help="the training script")
    parser.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="the script's arguments")
    parser.set_defaults(handler=execute)


def check(args: argparse.Namespace) -> None:
    from .candidates import BY_NAME  # here: `skalpel --help` builds tune's options from this module

    unknown = [name for name in (*args.forced, *args.skipped) if name not in BY_NAME]
    if unknown:
        raise SkalpelError(f"unknown candidate {unknown[0]!r}; skalpel tune --list shows them: {', '.join(BY_NAME)}")
    if not 0 < args.budget < float("inf"):
        raise SkalpelError(f"--budget must be a positive number of seconds, not {args.budget}")
    for name, value, low in (("--steps", args.steps, 1), ("--repeats", args.repeats, 1), ("--warmup", args.warmup, 0),
                             ("--extra-runs", args.extra_runs, 0),
                             ("--run-steps", args.run_steps if args.run_steps is not None else 1, 1)):  # fmt: skip
        if value < low:
            raise SkalpelError(f"{name} must be at least {low}, not {value}")
    if not args.target and args.findings_from:
        args.target = script_of_run(args.findings_from)
    if not args.target:
        raise SkalpelError("give a script to tune: skalpel tune train.py [ARGS] (or skalpel tune --list)")


def script_of_run(source: str) -> str:
    """``skalpel tune --from RUN`` with no SCRIPT: the script that run profiled, when it is still there."""
    from pathlib import Path

    from ..api import load_report

    capture = load_report(source, which="--from").capture
    script = capture.script if capture is not None else None
    if not script or not Path(script).is_file():
        named = f"it names {script}, which is not a file here" if script else "it names no script"
        raise SkalpelError(f"--from {source}: give the script to tune after the options ({named})")
    print(f"skalpel: tuning {script}, the script {source} profiled (with no arguments: give SCRIPT ARGS to pass some)",
          file=sys.stderr)  # fmt: skip
    return script


def execute(args: argparse.Namespace) -> int:
    from rich.console import Console

    from . import render

    if args.list:
        Console().print(render.catalogue_table())
        return 0
    check(args)
    from ..report.base import named, requested, write
    from .measure import Window
    from .renderers import TUNE_RENDERERS
    from .result import TuneFailed
    from .session import TuneOptions, tune

    files = requested(TUNE_RENDERERS, json=args.json, html=args.html, out=args.out)  # a bad --out fails before the runs
    options = TuneOptions(window=Window(args.warmup, args.steps), repeats=args.repeats, budget_s=args.budget,
                          extra_runs=args.extra_runs,
                          forced=tuple(dict.fromkeys(args.forced)), skipped=tuple(dict.fromkeys(args.skipped)),
                          findings_from=args.findings_from,
                          profile=args.profile, run_steps=args.run_steps)  # fmt: skip
    try:
        result = tune(args.target, tuple(args.args), options)
    except TuneFailed as failed:
        if failed.output:
            print(failed.output.rstrip(), file=sys.stderr)
        raise
    if args.json == "-":
        write(result, files)
        sys.stdout.buffer.write(named("json", TUNE_RENDERERS)().render(result) + b"\n")
    else:
        render.print_result(result)
        write(result, files)
    _keep_in_run_folder(result)
    return 130 if result.interrupted else 0


def _keep_in_run_folder(result: TuneResult) -> None:
    """tune.json beside the run's report, so that ``skalpel run`` of the script cites it (``advice.py``)."""
    from pathlib import Path

    from ..files import write_file
    from .advice import RESULT_FILE

    if not result.run_folder or result.interrupted:
        return
    try:
        path = write_file(Path(result.run_folder) / RESULT_FILE, result.to_json())
    except SkalpelError as error:
        print(f"skalpel: tune could not keep its result in the run folder: {error}", file=sys.stderr)
        return
    print(f"skalpel: wrote {path} (skalpel run {result.script} cites it)", file=sys.stderr)
