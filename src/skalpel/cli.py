"""The ``skalpel`` command: parse arguments, call the Python API, render, write.

Argument parsing (``build_parser``) and dispatch (``main``) are separate; each
subcommand is one small handler. No analysis happens here.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import Callable, Sequence

from . import __version__, env
from .errors import SkalpelError
from .files import write_file


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``skalpel`` parser; given the ``command`` the words name, only that command's own parser is built.

    Building them all costs ``skalpel analyze`` some 10 ms: ``run``, ``demo`` and ``tune`` take their
    options from the capture and tune layers. A word that is not a command (``--help``, a typo) gets them all,
    so the help and the "invalid choice" error list every command.
    """
    parser = argparse.ArgumentParser(
        prog="skalpel",
        description="A profiler doctor for PyTorch: profile a training loop, read any torch.profiler trace, "
        "and name the bottleneck with the numbers that prove it.",
    )
    parser.add_argument("--version", action="version", version=f"skalpel {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, add in _COMMANDS.items():
        if command not in _COMMANDS or name == command:
            add(commands)
    return parser


_OUT_HELP = "write {what} to FILE in the format its extension names: .json, .html or .txt"


def _add_analyze(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "analyze",
        help="analyse stored torch.profiler traces (files or folders, one rank or many), or memory snapshots",
        description="Load torch.profiler traces (.json or .json.gz files, or folders of them, e.g. a "
        "tensorboard_trace_handler folder or a skalpel run folder) and print the diagnosis; or read PyTorch "
        "memory snapshots (FILE.pickle from torch.cuda.memory._dump_snapshot) without torch: what holds the memory, "
        "from which line, and how fragmented the cache is; or a stopped job's records (a `skalpel watch` run "
        "folder, PyTorch flight-recorder dumps, pickled or JSON): which rank, which collective, which line.",
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help="trace files or folders")
    parser.add_argument(
        "--json", nargs="?", const="-", metavar="FILE", help="write the skalpel.report/1 JSON to FILE (or stdout)"
    )
    parser.add_argument("--html", metavar="FILE", help="write the self-contained HTML report to FILE")
    parser.add_argument("--out", metavar="FILE", help=_OUT_HELP.format(what="the report"))
    parser.add_argument(
        "--commbench", metavar="FILE", help="a `skalpel commbench --json` result: compare achieved bus bandwidth with it"
    )
    parser.add_argument(
        "--workers", type=_COUNT, metavar="N",
        help="processes that reduce the rank files of a job, one rank each at a time, or that decode and analyse "
        "one large trace file together (default: the cores this process may use, for one file those idle now; "
        "1: all in this process)",
    )  # fmt: skip
    parser.add_argument(
        "--ray", nargs="?", const=True, default=False, metavar="ADDRESS",
        help="reduce the ranks as Ray tasks on a cluster (traces on a shared filesystem): ADDRESS is the cluster's "
        "(host:port, ray://host:port or auto; default RAY_ADDRESS, else a local instance). Needs skalpel[ray]; "
        "put it after the PATHs",
    )  # fmt: skip
    parser.add_argument(
        "--rank", type=_RANK, action="append", default=[], metavar="R",
        help="in a job of more than 8 ranks, also show rank R's panel (repeatable; the outliers and one rank of "
        "each group of ranks alike are shown anyway)",
    )  # fmt: skip
    parser.add_argument("--all-ranks", action="store_true", help="show every rank's panel, however many ranks")
    parser.set_defaults(handler=_cmd_analyze)


def _cmd_analyze(args: argparse.Namespace) -> int:
    from .api import analyze_job
    from .report.base import RENDERERS, named, requested, write
    from .report.progress import rank_progress
    from .trace.loader import find_trace_files

    if _snapshots(args.paths):
        return _analyze_snapshots(args)
    files = requested(RENDERERS, json=args.json, html=args.html, out=args.out)
    printing = args.json != "-"  # rich (20 ms of imports) only for the terminal report: --json - prints none
    stopped, traced = _stopped_jobs(args.paths)
    if stopped and printing:  # the verdict first (beside traces, only when it found something)
        from .watching.hangs import verdict_text

        for folder in stopped:
            sys.stdout.write(verdict_text(folder, say_clean=not traced))
    if stopped and not traced:  # a watched run's records were the answer: no trace to analyse
        return _write_verdict(stopped, files, printing)
    with rank_progress(find_trace_files(args.paths)) as on_rank_progress:
        job = analyze_job(
            args.paths, workers=args.workers, ray=args.ray, on_rank_progress=on_rank_progress,
            flame=any(renderer.name == "html" for _, renderer in files),  # the page's flame graph needs the trace
            while_loading=_import_terminal if printing else None,
        )  # fmt: skip
    report = _with_verdict(_with_commbench(job.report, args.commbench), stopped)
    options = {"html": {"flame": job.flame_tree}}
    if not printing:
        write(report, files, options)
        sys.stdout.buffer.write(named("json", RENDERERS)().render(report) + b"\n")
        return 0
    from .report import terminal

    terminal.print_report(report, ranks=tuple(args.rank), all_ranks=args.all_ranks)
    terminal.print_written(write(report, files, options))
    return 0


def _stopped_jobs(paths: list[str]) -> tuple[list[Path], bool]:
    """The folders that hold a stopped job's records (``skalpel watch``'s hang dumps, collectives, dead ranks;
    flight-recorder dumps, or one such dump), and whether there are traces to analyse beside them."""
    from .trace.loader import find_trace_files
    from .watching.hangs import has_dumps

    stopped = [path for path in map(Path, paths) if _is_folder(path) and has_dumps(path) or _is_recorder(path)]
    if not stopped:
        return [], True
    others = [path for path in paths if not _is_recorder(Path(path))]
    try:
        traced = bool(others) and bool(find_trace_files(others))
    except SkalpelError:
        traced = False
    return stopped, traced


def _is_recorder(path: Path) -> bool:
    from .trace.flight_recorder import looks_like_flight_recorder

    try:
        return path.is_file() and looks_like_flight_recorder(path)
    except OSError:
        return False


def _write_verdict(stopped: list[Path], files: list, printing: bool) -> int:
    """The stopped jobs' verdict as a report: --json/--html/--out written, ``--json -`` printed."""
    from .report.base import RENDERERS, named, write
    from .watching.hangs import verdict_report

    report = verdict_report(stopped)
    written = write(report, files)
    if not printing:
        sys.stdout.buffer.write(named("json", RENDERERS)().render(report) + b"\n")
    for path in written:
        sys.stdout.write(f"skalpel: wrote {path}\n")
    return 0


def _with_verdict(report, stopped: list[Path]):
    """A report of traces with the verdict of the stopped jobs beside them: their findings among its findings."""
    if not stopped:
        return report
    import dataclasses

    from .result.report import sorted_findings
    from .watching.hangs import verdict_report

    verdict = verdict_report(stopped)
    return dataclasses.replace(report, findings=tuple(sorted_findings(verdict.findings + report.findings)),
                               warnings=report.warnings + verdict.warnings)  # fmt: skip


def _is_folder(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:  # a name too long, a loop of links: the loader says what is wrong with it
        return False


def _snapshots(paths: Sequence[str]) -> bool:
    """True when the paths are PyTorch memory snapshots (pickles); a mix of snapshots and traces is an error."""
    from .api import is_snapshot_path

    kinds = {is_snapshot_path(path) for path in paths}
    if kinds == {True, False}:
        raise SkalpelError("memory snapshots (.pickle) and traces cannot be analysed together: name one kind")
    return kinds == {True}


def _analyze_snapshots(args: argparse.Namespace) -> int:
    from .api import analyze_snapshot

    if args.html or args.out or args.commbench:
        raise SkalpelError("a memory snapshot's summary is printed or written as JSON (--json FILE): "
                           "--html, --out and --commbench are for traces")  # fmt: skip
    summaries = [analyze_snapshot(path) for path in args.paths]
    if args.json is not None:
        body = b"\n".join(summary.to_json() for summary in summaries) + b"\n"
        if args.json == "-":
            sys.stdout.buffer.write(body)
            return 0
        write_file(Path(args.json), body)
    from .report.snapshot_render import print_snapshot

    for summary in summaries:
        print_snapshot(summary)
    return 0


def _diff_snapshots(args: argparse.Namespace) -> int:
    from .api import diff_snapshots
    from .report.snapshot_render import print_snapshot_diff

    if args.html or args.out or args.fail_if_slower is not None:
        raise SkalpelError("two memory snapshots' difference is printed or written as JSON (--json FILE): "
                           "--html, --out and --fail-if-slower are for runs")  # fmt: skip
    result = diff_snapshots(args.before, args.after)
    if args.json == "-":
        sys.stdout.buffer.write(result.to_json() + b"\n")
        return 0
    if args.json:
        write_file(Path(args.json), result.to_json() + b"\n")
    print_snapshot_diff(result)
    return 0


def _import_terminal() -> None:
    from .report import terminal  # noqa: F401


def _with_commbench(report, path: str | None):
    if not path:
        return report
    from .result.commbench import CommBench, compare
    from .trace.source import without_bom

    try:
        text = without_bom(Path(path).read_bytes())
    except OSError as error:
        raise SkalpelError(f"cannot read {path}: {error.strerror or error}") from None
    return compare(report, CommBench.from_json(text, source=path))


def _add_commbench(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "commbench",
        help="measure collective bandwidth (all_reduce, all_gather, ...) on this machine, as nccl-tests does",
        description="Spawn N local processes on the current backend (nccl with a GPU each, else gloo on CPU) and "
        "time each collective over a range of message sizes; print algorithm and bus bandwidth (nccl-tests "
        "definitions). Feed the --json result to `skalpel analyze --commbench FILE` to compare a run with it.",
    )
    parser.add_argument("--nproc", type=_COUNT, default=2, metavar="N", help="processes (ranks) to spawn (2)")
    parser.add_argument("--backend", choices=("gloo", "nccl"), help="default: nccl with N GPUs, else gloo")
    parser.add_argument("--min-bytes", default=None, metavar="SIZE", help="smallest message, e.g. 1K (1K)")
    parser.add_argument("--max-bytes", default=None, metavar="SIZE", help="largest message (4M on CPU, 64M on GPU)")
    parser.add_argument("--ops", default=None, metavar="LIST", help="comma-separated collectives (all five)")
    parser.add_argument("--iters", type=_COUNT, default=10, metavar="N", help="calls timed per measurement (10)")
    parser.add_argument("--json", metavar="FILE", help="also write the result as JSON to FILE")
    parser.set_defaults(handler=_cmd_commbench)


def _cmd_commbench(args: argparse.Namespace) -> int:
    from .capture.commbench import TYPES, BenchOptions, run_commbench, sizes_between
    from .result.commbench import render_table

    options = BenchOptions(
        nproc=args.nproc, backend=args.backend, sizes=sizes_between(args.min_bytes, args.max_bytes, args.backend),
        types=tuple(args.ops.split(",")) if args.ops else TYPES, iters=args.iters,
    )  # fmt: skip
    bench = run_commbench(options)
    sys.stdout.write(render_table(bench))
    if args.json:
        write_file(Path(args.json), bench.to_json())
    return 0


def _add_diff(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "diff",
        help="what changed between two runs, with the noise taken into account",
        description="Compare two runs (run folders, trace files or folders, or report.json files): the change "
        "in median step time against the noise of each side, per category, per op, and the findings that "
        "appeared or disappeared. Two memory snapshots (.pickle): what grew, by the line that allocated it.",
    )
    parser.add_argument("before", metavar="BEFORE", help="run folder, trace file/folder or report.json")
    parser.add_argument("after", metavar="AFTER", help="run folder, trace file/folder or report.json")
    parser.add_argument("--json", nargs="?", const="-", metavar="FILE", help="write the skalpel.diff/1 JSON to FILE (or stdout)")
    parser.add_argument("--html", metavar="FILE", help="write the comparison as a self-contained HTML page")
    parser.add_argument("--out", metavar="FILE", help=_OUT_HELP.format(what="the comparison"))
    parser.add_argument(
        "--fail-if-slower", type=_percent, metavar="PCT",
        help="exit with status 1 when AFTER is slower by more than PCT percent and outside the noise (a CI gate)",
    )  # fmt: skip
    parser.set_defaults(handler=_cmd_diff)


def _cmd_diff(args: argparse.Namespace) -> int:
    from .api import load_report
    from .report.base import DIFF_RENDERERS, named, requested, write
    from .result.diff import diff_reports

    if _snapshots([args.before, args.after]):
        return _diff_snapshots(args)
    files = requested(DIFF_RENDERERS, json=args.json, html=args.html, out=args.out)
    before = load_report(args.before, which="BEFORE")
    after = load_report(args.after, which="AFTER")
    result = diff_reports(before, after, labels=(_short_label(args.before), _short_label(args.after)))
    if args.json == "-":
        write(result, files)
        sys.stdout.buffer.write(named("json", DIFF_RENDERERS)().render(result) + b"\n")
    else:
        from .report.diff_render import print_diff

        print_diff(result)
        write(result, files)
    gate = args.fail_if_slower is not None and result.slower_than(args.fail_if_slower)
    if gate:
        print(f"skalpel: slower by {result.step.change_pct:.1f}% (> {args.fail_if_slower:g}%, outside the noise)",
              file=sys.stderr)  # fmt: skip
    return 1 if gate else 0


def _short_label(path: str) -> str:
    parts = Path(path).parts
    return str(Path(*parts[-2:])) if len(parts) > 2 else path


def _add_run(commands: argparse._SubParsersAction) -> None:
    from .capture.command import add_capture_options

    parser = commands.add_parser(
        "run",
        allow_abbrev=False,  # the script's own options (--n, --wa) must never be taken for ours
        help="run a training script under the profiler, unchanged, and diagnose it",
        description="Run SCRIPT (or -m MODULE) in-process as python would, find its steps (optimizer.step() or "
        "DataLoader iterations), record them with torch.profiler, and write a run folder with the trace, "
        "a flame graph and the summary. Options go before SCRIPT; everything after it is the script's.",
    )
    parser.add_argument("-m", dest="module", action="store_true", help="SCRIPT is a module name, run as python -m would")
    add_capture_options(parser)
    parser.add_argument(
        "--nproc", type=_COUNT, default=1, metavar="N",
        help="run N ranks on this machine through torch.distributed.run (torchrun) and merge their traces "
        "into one report (1); under your own torchrun, leave it out: every rank profiles itself",
    )  # fmt: skip
    parser.add_argument("target", nargs="?", metavar="SCRIPT", help="the script (or module with -m)")
    parser.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="the script's arguments")
    parser.set_defaults(handler=_cmd_run)


def _cmd_run(args: argparse.Namespace) -> int:
    from .capture.command import execute, script_target
    from .tune.advice import annotate  # run's advice cites what skalpel tune measured on the script

    target = script_target(args)
    return execute(target, args, advise=lambda report, folder: annotate(report, folder, target.name, target.args))


def _add_demo(commands: argparse._SubParsersAction) -> None:
    from .capture.command import add_capture_options

    parser = commands.add_parser(
        "demo",
        help="profile a built-in small training job whose DataLoader is the bottleneck",
        description="Train a small CNN on synthetic images with a deliberately slow DataLoader, under "
        "`skalpel run`, and print the diagnosis. No download.",
    )
    add_capture_options(parser, repeat=2)
    # 24: two windows of 8 steps, then the un-profiled steps the profiler overhead is measured against
    parser.add_argument("--steps", type=_COUNT, default=24, help="training steps the demo runs (24)")
    parser.set_defaults(handler=_cmd_demo)


def _cmd_demo(args: argparse.Namespace) -> int:
    from .capture.command import execute
    from .capture.target import Target

    args.name = args.name or "demo"
    return execute(Target("skalpel.demo", ("--steps", str(args.steps)), module=True), args)


def _add_explain(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "explain",
        help="what a finding means, how it is measured, its thresholds and the fix",
        description="Print a finding's documentation from the registry; without an id, a table of all findings.",
    )
    parser.add_argument("finding_id", nargs="?", metavar="FINDING_ID",
                        help="e.g. dataloader_bound; 'ledger' lists the causes every millisecond is charged to, "
                             "'blame' those of the device's idle time")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(handler=_cmd_explain)


def _cmd_explain(args: argparse.Namespace) -> int:
    import orjson
    from rich.console import Console

    from .diagnose import explain

    if args.finding_id is None:
        if args.json:
            sys.stdout.buffer.write(orjson.dumps(explain.explain_all_dicts(), option=orjson.OPT_INDENT_2) + b"\n")
        else:
            Console().print(explain.render_table())
            Console().print(f"the causes the findings read: skalpel explain {explain.LEDGER}; the device's idle time: "
                            f"skalpel explain {explain.BLAME}")  # fmt: skip
        return 0
    pages = {explain.LEDGER: (explain.ledger_dict, explain.render_ledger),  # not findings: what they read
             explain.BLAME: (explain.blame_dict, explain.render_blame)}  # fmt: skip
    if args.finding_id in pages:
        as_dict, render = pages[args.finding_id]
        if args.json:
            sys.stdout.buffer.write(orjson.dumps(as_dict(), option=orjson.OPT_INDENT_2) + b"\n")
        else:
            Console().print(render())
        return 0
    rule = explain.find(args.finding_id)
    if rule is None:
        raise SkalpelError(f"unknown finding id {args.finding_id!r} (skalpel explain lists them all)")
    if args.json:
        sys.stdout.buffer.write(orjson.dumps(explain.explain_dict(rule), option=orjson.OPT_INDENT_2) + b"\n")
    else:
        Console().print(explain.render_rule(rule))
    return 0


def _add_tune(commands: argparse._SubParsersAction) -> None:
    from .tune.command import add_parser  # the handler lives there: tune's options are its own

    add_parser(commands)


def _add_watch(commands: argparse._SubParsersAction) -> None:
    from .watching.command import add_parser  # the handler lives there

    add_parser(commands)


def _add_history(commands: argparse._SubParsersAction) -> None:
    from .watching.command import add_history_parser

    add_history_parser(commands)


def _add_mcp(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "mcp",
        help="serve skalpel's analyze, explain, diff, run and tune to a coding agent (Model Context Protocol, stdio)",
        description="Start a Model Context Protocol server on stdin/stdout for a coding agent: tools analyze, explain, "
        "diff, run and tune, each returning skalpel's JSON (findings with their evidence) and its text. Needs the "
        "mcp extra: pip install 'skalpel[mcp]'. docs/integrations.md gives the lines for an agent's configuration.",
    )
    parser.set_defaults(handler=_cmd_mcp)


def _cmd_mcp(args: argparse.Namespace) -> int:
    from .agent.server import serve

    return serve()


_COMMANDS = {  # in the order `skalpel --help` lists them
    "analyze": _add_analyze,
    "diff": _add_diff,
    "run": _add_run,
    "demo": _add_demo,
    "explain": _add_explain,
    "commbench": _add_commbench,
    "tune": _add_tune,
    "watch": _add_watch,
    "history": _add_history,
    "mcp": _add_mcp,
}


def _int_at_least(floor: int, what: str) -> Callable[[str], int]:
    """An argparse type: a whole number of ``floor`` or more, else a one-line usage error naming ``what`` it is."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < floor:
            raise argparse.ArgumentTypeError(f"{what} must be {floor} or more, got {value}")
        return value

    parse.__name__ = what  # argparse's own messages name the type
    return parse


_COUNT = _int_at_least(1, "a count")
_RANK = _int_at_least(0, "a rank number")


def _percent(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a percentage such as 5, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite percentage of 0 or more, got {text!r}")
    return value


def split_script_args(parser: argparse.ArgumentParser, argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """``skalpel run [OPTIONS] SCRIPT ARGS...``: (everything up to SCRIPT, the script's ARGS untouched).

    argparse would look for its own options among the script's (``--n`` "could match
    --name, --nproc"), so the script's arguments are cut off before it parses anything.
    The cut is the first word that is neither one of ``run``'s options nor an option's value.
    """
    argv = list(argv)
    if not argv or argv[0] not in ("run", "watch"):
        return argv, []
    run_parser = _subparser(parser, argv[0])
    takes_value = {
        option: action.nargs != 0
        for action in run_parser._actions
        for option in action.option_strings
    }
    index = 1
    while index < len(argv):
        word = argv[index]
        if word == "--":
            return argv[:index] + argv[index + 1 : index + 2], argv[index + 2 :]
        if not word.startswith("-") or word == "-":
            return argv[: index + 1], argv[index + 1 :]
        name = word.split("=", 1)[0]
        if name not in takes_value:
            return argv, []  # not one of ours: argparse says so
        index += 2 if takes_value[name] and "=" not in word else 1
    return argv, []


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    commands = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    return commands.choices[name]


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv[0] if argv else None)
    words, script_args = split_script_args(parser, argv)
    args = parser.parse_args(words)
    if script_args:
        args.args = list(args.args or []) + script_args
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        return args.handler(args)
    except SkalpelError as error:
        _error(str(error))
        return error.exit_code
    except KeyboardInterrupt:
        print("skalpel: interrupted", file=sys.stderr)
        return 130
    except MemoryError:
        _error("out of memory: analysing this input needs more memory than skalpel may use here")
        return 2
    except Exception as error:  # a bug: one line, not a traceback (SKALPEL_TRACEBACK=1 shows it)
        if env.text(env.TRACEBACK):
            raise
        _error(f"internal error ({type(error).__name__}: {error}); please report it with the input "
               f"({env.TRACEBACK.name}=1 shows where)", internal=True)  # fmt: skip
        return INTERNAL_ERROR


INTERNAL_ERROR = 3
_QUICK_EXIT_COMMANDS = ("analyze", "diff", "explain")
_SCRIPT_COMMANDS = ("run", "demo")  # they run a script in this process


def entry() -> None:
    """The ``skalpel`` command (console script and ``python -m skalpel``): ``main``, then exit.

    When they succeed, the commands that only read traces and write reports leave without the
    interpreter's teardown, which frees every module and object one by one (some 45 ms: a
    tenth of analysing a 50 MB trace). They leave no threads or processes running after
    ``main`` (rank workers are shut down, forked loaders reaped); an interrupted or failed run,
    and ``--ray`` (Ray's client has exit handlers of its own), exit the usual way. ``main``
    itself returns, for callers in Python.
    """
    import atexit

    atexit.register(_no_interrupt_in_teardown)  # registered first, so it runs last, after the script's own
    words = sys.argv[1:2]
    if words and words[0] in _QUICK_EXIT_COMMANDS:
        # numpy's OpenBLAS starts a thread per core when imported, which spins for some 70 ms of CPU; these
        # commands do no linear algebra (their rank workers inherit this too). Set before numpy is imported.
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    code = main()
    _forget_caught_interrupts()
    if words and words[0] in _SCRIPT_COMMANDS:
        from .capture.exits import end

        end(code)  # the script's threads, exit handlers and teardown as python's; returns for the usual exit
    if code == 0 and words and words[0] in _QUICK_EXIT_COMMANDS and "--ray" not in sys.argv:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError):
            sys.exit(code)  # a closed or broken stream: the usual exit, and its usual message
        os._exit(code)
    sys.exit(code)


def _forget_caught_interrupts() -> None:
    """Keep the exit status ``main`` chose after a Ctrl-C it caught.

    CPython notes a KeyboardInterrupt that left code it ran from a string (``exec``/``eval``: dataclasses and
    namedtuple build their methods so, in a module imported lazily by the analysis) and, once the interpreter
    has finished, kills itself with SIGINT, however the interrupt was caught later. A Ctrl-C that landed
    there during `skalpel run`'s analysis ended it with -2 instead of 130 (1 run in 8 of a loop of two Ctrl-C).
    Running an empty string clears that note."""
    exec("")  # noqa: S102 - the one way to reset CPython's "unhandled KeyboardInterrupt" flag


def _no_interrupt_in_teardown() -> None:
    """The last exit handler: from here on the interpreter only frees modules (torch's take a second after a run).

    Python puts SIGINT back to "die" for that part, so a Ctrl-C then killed skalpel by the signal (status -2)
    after it had written and said everything; ignored, the exit status stays the run's."""
    import signal

    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread
        pass


def _error(message: str, *, internal: bool = False) -> None:
    """One line on stderr; text from a trace (file names, keys) cannot drive the terminal."""
    from .display import cut_name

    print(f"skalpel: {'' if internal else 'error: '}{cut_name(message, 2000)}", file=sys.stderr)


if __name__ == "__main__":
    entry()
