"""One measured run: the launcher in its own process, its result file read back.

Each run is a fresh ``python -m skalpel.tune.launch`` process in its own session (so that
Ctrl-C reaches skalpel, not the script, and the script's DataLoader workers can be ended with
it). The script's output goes to a log file; its tail is the error shown when the run fails.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .stats import Steady, steady

LOG_TAIL_CHARS = 4000


@dataclass(frozen=True)
class Window:
    warmup: int = 3  # steps run but not timed
    steps: int = 10  # timed steps


@dataclass
class RunOutcome:
    steps_ms: list[float]  # every step's time, warm-up included
    end: str  # window | time_limit | follow_limit | script_end | error | bad_target | killed
    exit_status: int
    error: str | None = None
    loss: float | None = None
    loss_step: int | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    log_tail: str = ""
    first_step_s: float | None = None  # from the process's start to the end of its first step: one-time work
    last_step_s: float | None = None  # ... to its last step boundary: the whole run, when it ran to its end
    steps_seen: int = 0  # step boundaries the script reached (past the window too, when followed)
    seq: int = 0  # the run's place in the session: a candidate run pairs with the nearest baseline run

    def one_time_s(self, window: Window) -> float | None:
        """The run's one-time cost: its time to the last recorded step, less that many steps at its steady pace
        (start-up, imports, building the model and data, a compile, the warm-up's excess)."""
        timed = self.timed(window)
        if self.first_step_s is None or not timed:
            return None
        pace = sum(timed) / len(timed) / 1000.0
        return max(0.0, self.first_step_s + sum(self.steps_ms) / 1000.0 - (len(self.steps_ms) + 1) * pace)

    @property
    def window_wall_s(self) -> float:
        """What the run took up to its window's end: its wall time, less the steps it was followed past the window."""
        if self.end != "follow_limit" or self.first_step_s is None:
            return self.wall_s
        return min(self.wall_s, self.first_step_s + sum(self.steps_ms) / 1000.0 + 1.0)  # + exit, as a run that stops

    @property
    def ran_to_end(self) -> bool:
        return self.end == "script_end"

    def timed(self, window: Window) -> list[float]:
        """The steady-state steps: the window after warm-up, or for a script with fewer steps the ones after
        the warm-up its steps show (``stats.steady``)."""
        return self.steady(window).steps

    def steady(self, window: Window) -> Steady:
        return steady(self.steps_ms, window.warmup, window.steps)

    @property
    def failed(self) -> bool:
        return self.end in ("error", "bad_target", "killed")


def run_once(script: str, args: tuple[str, ...], fix: dict[str, Any], window: Window, *,
             max_seconds: float | None, timeout_s: float, follow_s: float | None = None) -> RunOutcome:  # fmt: skip
    """Run the script once with ``fix``; Ctrl-C ends the run (and its workers) and is raised again."""
    with tempfile.TemporaryDirectory(prefix="skalpel-tune-") as folder:
        result, log = Path(folder) / "result.jsonl", Path(folder) / "output.log"
        command = [sys.executable, "-m", "skalpel.tune.launch", "--result", str(result), "--fix", json.dumps(fix),
                   "--warmup", str(window.warmup), "--steps", str(window.steps)]  # fmt: skip
        if max_seconds is not None:
            command += ["--max-seconds", f"{max_seconds:.3f}"]
        if follow_s:
            command += ["--follow-s", f"{follow_s:.3f}"]
        command += [script, *args]
        started, started_at = time.perf_counter(), time.time()
        with log.open("wb") as output:
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                                       start_new_session=True)  # fmt: skip
            killed = False
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                killed = True
            except KeyboardInterrupt:
                _end_group(process)
                raise
            finally:
                _end_group(process)  # the script's loader workers too
        outcome = read_result(result, killed=killed, timeout_s=timeout_s, exit_status=process.returncode)
        outcome.wall_s = time.perf_counter() - started
        for name in ("first_step_s", "last_step_s"):
            at = getattr(outcome, name)
            setattr(outcome, name, None if at is None else max(0.0, at - started_at))  # epoch seconds until here
        outcome.log_tail = _tail(log)
        return outcome


def read_result(path: Path, *, killed: bool = False, timeout_s: float = 0.0, exit_status: int | None = 0) -> RunOutcome:
    steps: list[float] = []
    final: dict[str, Any] | None = None
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        lines = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut by a kill
        if "step_ms" in record:
            steps.append(float(record["step_ms"]))
        elif record.get("restart"):
            steps = []  # a stronger step signal took over: what came before was not an iteration
        elif "end" in record:
            final = record
    if final is None:
        why = f"stopped after {timeout_s:.0f} s" if killed else f"the run ended without a result (exit status {exit_status})"
        return RunOutcome(steps, "killed", exit_status if exit_status is not None else -9, error=why)
    return RunOutcome(steps, final["end"], int(final.get("exit_status") or 0), error=final.get("error"),
                      loss=final.get("loss"), loss_step=final.get("loss_step"), facts=final.get("facts") or {},
                      first_step_s=final.get("first_step_at"), last_step_s=final.get("last_step_at"),
                      steps_seen=int(final.get("steps_seen") or 0))  # fmt: skip


def _end_group(process: subprocess.Popen) -> None:
    """End the run's process group (the launcher and the workers it started), then reap the launcher."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()


def _tail(path: Path) -> str:
    try:
        text = path.read_bytes()[-LOG_TAIL_CHARS:].decode("utf-8", "replace")
    except OSError:
        return ""
    return text.strip()
