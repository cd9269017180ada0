"""``skalpel watch`` and ``skalpel history``: their arguments and what they do (``cli.py`` only registers them)."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from ..capture.boundaries import SIGNALS as STEP_SIGNALS
from ..errors import SkalpelError

DEFAULT_COOLDOWN_S = 600.0  # recorder.DEFAULT_COOLDOWN_S; not imported from there: it imports torch


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "watch",
        allow_abbrev=False,  # the script's own options must never be taken for ours
        help="record every step of a whole run without the profiler, and profile the moment it goes wrong",
        description="Run SCRIPT (or -m MODULE) unchanged, as `skalpel run` does, and record every step (time, "
        "DataLoader wait, memory, CPU time) into watch.sqlite in a run folder, without the profiler. Anomalies "
        "(step-time spikes, level shifts, slow drift, memory creep, DataLoader stalls) are judged as the run goes; "
        "each triggers a torch.profiler capture of the next steps, analysed into a report beside the store "
        "(under torchrun with --out JOB: the same steps on every rank, one report of the job). "
        "`skalpel watch --show RUN` prints a run's timeline. Options go before SCRIPT.",
    )
    parser.add_argument("-m", dest="module", action="store_true", help="SCRIPT is a module name, run as python -m would")
    parser.add_argument("--out", metavar="DIR", help="run folder (default ./skalpel-runs/<time>-<name>)")
    parser.add_argument("--name", help="name in the run folder's name (default: the script's name)")
    parser.add_argument(
        "--step-on", choices=STEP_SIGNALS, default=None,
        help="what marks the end of one iteration (default: the first the script shows, as skalpel run)",
    )  # fmt: skip
    parser.add_argument(
        "--cooldown", type=_seconds, default=DEFAULT_COOLDOWN_S, metavar="S",
        help=f"at most one capture per anomaly kind every S seconds ({DEFAULT_COOLDOWN_S:g})",
    )  # fmt: skip
    parser.add_argument("--active", type=int, default=5, metavar="N", help="steps recorded per capture (5)")
    parser.add_argument(
        "--hang-after", type=_seconds, default=None, metavar="S",
        help="a step that has not ended after max(S, 20x the median step) is a hang: every rank dumps its stacks "
        "and collectives into the run folder (60; `skalpel analyze RUN` gives the verdict)",
    )  # fmt: skip
    parser.add_argument("--no-capture", dest="capture", action="store_false", help="record and judge, never profile")
    parser.add_argument("--show", metavar="RUN", help="print a watched run's timeline and anomalies (a run folder)")
    parser.add_argument(
        "--ask", metavar="RUN",
        help="ask a running watch (its run folder; under torchrun the job's): `--ask RUN stacks` (every rank's "
        "stacks now) or `--ask RUN profile N` (a capture of the next N steps, every rank's same steps)",
    )  # fmt: skip
    parser.add_argument("--html", metavar="FILE", help="with --show: also write the run's timelines as an HTML page")
    parser.add_argument("target", nargs="?", metavar="SCRIPT", help="the script (or module with -m)")
    parser.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="the script's arguments")
    parser.set_defaults(handler=execute)


def execute(args: argparse.Namespace) -> int:
    if args.ask:
        return _ask(Path(args.ask), args.target, args.args)
    if args.show:
        from .show import show_run

        sys.stdout.write(show_run(args.show))
        if args.html:
            from .timeline_html import write_run_html

            print(f"wrote {write_run_html(args.show, Path(args.html))}")
        return 0
    if args.html:
        raise SkalpelError("--html writes a watched run's page: give the run with --show RUN")
    if not args.target:
        raise SkalpelError("give a script to watch (skalpel watch train.py [ARGS]) or a run to show (--show RUN)")
    if args.active < 1:
        raise SkalpelError(f"--active must be at least 1 (got {args.active})")
    from ..capture.settings import CaptureSettings
    from ..capture.target import Target
    from .runner import watch_script

    target = Target(args.target, tuple(args.args), module=args.module)
    return watch_script(target, out=Path(args.out) if args.out else None, name=args.name, step_on=args.step_on,
                        cooldown_s=args.cooldown, capture=args.capture, hang_after_s=args.hang_after,
                        settings=CaptureSettings(active=args.active))  # fmt: skip


def _ask(run: Path, what: str | None, rest: list[str]) -> int:
    from .asks import ask, wait_for_answers
    from .hangs import rank_folders

    if what not in ("stacks", "profile") or (what == "stacks" and rest) or (what == "profile" and len(rest) != 1):
        raise SkalpelError("ask for `stacks` or `profile N`: skalpel watch --ask RUN stacks | --ask RUN profile N")
    steps = None
    if what == "profile":
        try:
            steps = int(rest[0])
        except ValueError:
            raise SkalpelError(f"profile N: N is a number of steps (got {rest[0]!r})") from None
    ask_id, folder, running = ask(run, what, steps)
    if what == "profile":
        print(f"asked {folder} for a profile of the next {steps} steps (request {ask_id}): the capture is written "
              f"into {folder}/capture-<step>-asked/ and linked in `skalpel watch --show {folder}`")  # fmt: skip
        return 0
    from ..diagnose.hang import where

    answers = wait_for_answers(folder, ask_id, sorted(running), timeout_s=10.0)
    folders = rank_folders(folder)
    for rank in sorted(running):
        answer = answers.get(rank)
        label = f"rank {rank}" if len(folders) > 1 else "the run"
        if answer is None:
            print(f"{label}: no answer within 10 s (its writer thread is late, or the rank is gone)")
            continue
        main = next((stack["frames"] for stack in answer.get("stacks", []) if stack.get("main")), [])
        print(f"{label} after step {answer.get('step')}: {where(main) or 'no main thread stack'}  "
              f"({folders.get(rank, folder)}/asked-{ask_id}.json)")  # fmt: skip
    return 0 if len(answers) == len(running) else 1


def add_history_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "history",
        help="list the watched runs of a folder, or compare the step times of two",
        description="Without RUNs: every run under DIR that skalpel watch recorded (steps, median and p99 step "
        "time, anomalies). With two RUN folders: their step-time distributions side by side.",
    )
    parser.add_argument("runs", nargs="*", metavar="RUN", help="two watched run folders to compare")
    parser.add_argument("--dir", default="skalpel-runs", metavar="DIR", help="where the runs are (./skalpel-runs)")
    parser.set_defaults(handler=execute_history)


def execute_history(args: argparse.Namespace) -> int:
    from .show import compare_runs, list_runs

    if len(args.runs) == 2:
        sys.stdout.write(compare_runs(*args.runs))
    elif args.runs:
        raise SkalpelError(f"give two runs to compare (got {len(args.runs)}), or none to list them")
    else:
        sys.stdout.write(list_runs(args.dir))
    return 0


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds, 0 or more, got {text!r}")
    return value
