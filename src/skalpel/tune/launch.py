"""``python -m skalpel.tune.launch``: run a script once with one fix applied and time its steps, no profiler.

    python -m skalpel.tune.launch --result R.jsonl --fix '{"dataloader": {"num_workers": 4}}' \
        --warmup 3 --steps 10 -- train.py --lr 0.1

The script runs in this process as ``python train.py --lr 0.1`` would (``skalpel run``'s
``__main__`` set-up). Step boundaries come from ``capture/boundaries.py``'s policy (after each
``optimizer.step()``, or each DataLoader batch without an optimizer); each step's time is
``perf_counter`` between boundaries (the same iteration as ``skalpel run``'s: an RL loop's
step is its episode's optimizer step, not a policy call; when a stronger signal takes over, the
steps before it are dropped) (on a GPU the device is synchronised where the timed steps
start and end, so that work still queued counts in them). Once ``warmup + steps`` steps have run (or the timed
steps pass ``--max-seconds``), the script is stopped at the next boundary.

The result file gets one JSON object per line as the run goes, so a run killed from outside
still leaves its steps: ``{"step_ms": ...}`` per step, then at the end
``{"end": "window"|"time_limit"|"follow_limit"|"script_end"|"error"|"bad_target", "exit_status", "error",
"loss", "loss_step", "steps_seen", "facts", "first_step_at", "last_step_at"}`` (the last two: wall-clock
seconds at the first and the last step boundary, so that the caller knows the one-time work before the
steps and the whole run's length). With ``--follow-s`` the script goes on past the window, its steps
counted but not timed, to its end or for that long: how many steps the whole run has.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import time
import traceback
from typing import IO, Any, Callable

_OWN_FRAMES = ("runpy.py", "<frozen runpy>", "skalpel/tune/launch.py")


class WindowDone(BaseException):
    """Raised at a step boundary once the window is measured; a BaseException so ``except Exception`` lets it by."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class StepClock:
    """Times the steps between boundaries, writes each, and ends the run when the window is done."""

    def __init__(self, out: IO[str], *, warmup: int, steps: int, max_seconds: float | None,
                 sync: Callable[[], None] = lambda: None, follow_s: float | None = None) -> None:  # fmt: skip
        self.out = out
        self.follow_s = follow_s  # after the window, follow the script (steps counted, not timed) this long
        self.follow_until: float | None = None
        self.first_step_at: float | None = None  # wall-clock (epoch) seconds at the first and the last boundary
        self.last_step_at: float | None = None
        self.sync = sync
        self.warmup = warmup
        self.stop_after = warmup + steps
        self.max_seconds = max_seconds
        self.boundaries = 0
        self.timed_s = 0.0
        self._last: float | None = None

    def restart(self) -> None:
        """A stronger step signal took over (``StepDetector.restart``): the steps so far were not iterations."""
        self.out.write(json.dumps({"restart": True}) + "\n")
        self.boundaries, self.timed_s, self._last = 0, 0.0, None

    def boundary(self) -> None:
        self.last_step_at = time.time()
        if self.first_step_at is None:
            self.first_step_at = self.last_step_at  # the script's one-time work (imports, set-up) ends here
        if self.follow_until is not None:  # past the window: only how long the whole run is
            self.boundaries += 1
            if time.perf_counter() > self.follow_until:
                raise WindowDone("follow_limit")
            return
        if self.boundaries + 1 in (self.warmup + 1, self.stop_after + 1):
            self.sync()  # the timed window starts and ends with the device idle: queued work is counted in it
        now = time.perf_counter()
        if self._last is not None:
            seconds = now - self._last
            self.out.write(json.dumps({"step_ms": seconds * 1000.0}) + "\n")
            if self.boundaries > self.warmup:
                self.timed_s += seconds
        self.boundaries += 1
        if self.boundaries > self.stop_after:
            if self.follow_s:
                self.follow_until = time.perf_counter() + self.follow_s
                return
            raise WindowDone("window")
        if self.max_seconds is not None and self.timed_s > self.max_seconds:
            raise WindowDone("time_limit")
        self._last = time.perf_counter()  # the write above is not the script's time


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m skalpel.tune.launch")
    parser.add_argument("--result", required=True, help="JSON-lines file to write")
    parser.add_argument("--fix", default="{}", help="the fix to apply, as JSON (candidates.py)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--max-seconds", type=float, default=None, help="stop once the timed steps take longer")
    parser.add_argument("--follow-s", type=float, default=None,
                        help="after the window, let the script go on to its end (steps counted) for at most this long")  # fmt: skip
    parser.add_argument("target", metavar="SCRIPT")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    options = parse(argv)
    with open(options.result, "w", encoding="utf-8", buffering=1) as out:
        status = run(options, out)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # the script's leftover threads or loader workers must not keep this run alive


def run(options: argparse.Namespace, out: IO[str]) -> int:
    from ..capture.steps import StepDetector
    from ..capture.target import Target, as_main, check_target, exit_status
    from ..errors import SkalpelError

    target = Target(options.target, tuple(options.args))
    try:
        code_path = check_target(target)
    except SkalpelError as error:
        out.write(json.dumps({"end": "bad_target", "exit_status": 2, "error": str(error)}) + "\n")
        return 2
    import torch

    from .patches import Patcher

    def sync() -> None:
        if torch.cuda.is_initialized():
            torch.cuda.synchronize()

    clock = StepClock(out, warmup=options.warmup, steps=options.steps, max_seconds=options.max_seconds, sync=sync,
                      follow_s=options.follow_s)  # fmt: skip
    patcher = Patcher(json.loads(options.fix), current_step=lambda: clock.boundaries)
    def boundary() -> None:
        if detector.policy.restart:  # as under skalpel run: the iteration is what the stronger signal marks
            detector.policy.restart = False
            clock.restart()
        clock.boundary()

    detector = StepDetector(boundary)
    end, status, error = "script_end", 0, None
    patcher.install()
    detector.install()
    with as_main(target, code_path):
        try:
            runpy.run_path(str(code_path), run_name="__main__")
        except WindowDone as done:
            end = done.reason
        except SystemExit as exit_:
            status = exit_status(exit_)
            if status:
                end, error = "error", f"the script exited with status {status}"
        except BaseException as raised:  # noqa: BLE001 - the script's error is reported, not ours to judge
            end, status, error = "error", 130 if isinstance(raised, KeyboardInterrupt) else 1, _describe(raised)
    detector.uninstall()
    patcher.uninstall()
    facts = {**patcher.facts(), "step_signal": detector.policy.signal}
    record: dict[str, Any] = {"end": end, "exit_status": status, "error": error, "loss": _loss(patcher),
                              "loss_step": patcher.loss_step, "steps_seen": clock.boundaries, "facts": facts,
                              "first_step_at": clock.first_step_at, "last_step_at": clock.last_step_at}  # fmt: skip
    out.write(json.dumps(record, default=str) + "\n")
    return status


def _loss(patcher: Any) -> float | None:
    try:
        return patcher.loss_value()
    except Exception:  # noqa: BLE001 - a loss that cannot be read (a broken device) is just not compared
        return None


def _describe(error: BaseException) -> str:
    """The script's error as Python prints it, without the launcher's and runpy's frames; also on stderr."""
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename.replace("\\", "/").endswith(_OWN_FRAMES):
        tb = tb.tb_next
    text = "".join(traceback.format_exception(type(error), error, tb))
    sys.stderr.write(text)
    return text.rstrip()


if __name__ == "__main__":
    main()
