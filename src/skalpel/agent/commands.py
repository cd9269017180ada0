"""The agent's tools as skalpel's own commands, each run in a child process: ``skalpel analyze``, ``explain``,
``diff``, ``run`` and ``tune`` with their JSON written to a file and their terminal text captured.

A child process, not a call in the server's: a profiled script prints to stdout (the server's protocol channel),
may crash or hang, and imports torch; the analyses fork workers, which a threaded server should not. The answer is
the very JSON and text the CLI gives, so an agent quotes what a user would see. A command that fails gives its
one-line message (``skalpel: error: ...``) as a SkalpelError, never a traceback.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

import orjson

from ..errors import SkalpelError

TEXT_WIDTH = "100"  # columns of the captured terminal text
ANALYSIS_TIMEOUT_S = 600.0
# the line skalpel run prints before the script's own traceback (capture/command.py, watching/runner.py)
_STOPPED = re.compile(r"^skalpel: the script stopped with (?P<name>[\w.]+) \(exit status (?P<status>-?\d+)\):$", re.M)


@dataclasses.dataclass(frozen=True)
class Answer:
    """A command's result: its JSON document (a skalpel.* schema) and the text it printed."""

    document: Any
    text: str

    def as_tool_result(self, key: str) -> dict[str, Any]:
        return {key: self.document, "verdict": self.text}


def analyze(paths: Sequence[str]) -> Answer:
    """``skalpel analyze PATHS --json``: the report of stored traces or a run folder."""
    if not paths:
        raise SkalpelError("give at least one trace file, trace folder or run folder to analyze")
    return _with_json(["analyze", *_paths(paths)], ANALYSIS_TIMEOUT_S)


def explain(finding_id: str | None) -> Answer:
    """``skalpel explain [ID]``: what a finding means, its thresholds and fix (every finding without an id)."""
    args = ["explain", finding_id] if finding_id else ["explain"]
    document = orjson.loads(_cli([*args, "--json"], ANALYSIS_TIMEOUT_S).stdout)
    return Answer(document, _cli(args, ANALYSIS_TIMEOUT_S).stdout)


def diff(before: str, after: str) -> Answer:
    """``skalpel diff BEFORE AFTER``: what changed between two runs, with the noise taken into account."""
    return _with_json(["diff", *_paths([before, after])], ANALYSIS_TIMEOUT_S)


def run(script: str, args: Sequence[str] = (), *, out: str | None = None, timeout_s: float = 1800.0) -> Answer:
    """``skalpel run [--out OUT] SCRIPT ARGS``: profile a script; the run folder's report.json and summary (the
    folder is kept: ``./skalpel-runs/<time>-<script>`` by default, for analyze and diff to read later)."""
    done = _cli(["run", *(["--out", out] if out else []), script, *args], timeout_s)
    written = [line.removeprefix("wrote ") for line in done.stdout.splitlines() if line.startswith("wrote ")]
    report = next((Path(path) for path in written if path.endswith("report.json")), None)
    stopped = script_error(done.stderr)
    if report is None or not report.is_file():
        why = _said_after_the_script(done.stderr) if stopped else _one_line(done)
        raise SkalpelError("; ".join(part for part in (stopped, why) if part)
                           or f"skalpel run wrote no report (exit status {done.returncode})")  # fmt: skip
    summary = report.with_name("summary.txt")
    text = summary.read_text(encoding="utf-8") if summary.is_file() else done.stdout
    document = {"folder": str(report.parent), **orjson.loads(report.read_bytes())}
    if stopped:  # the steps before the error were profiled: the report stands, and the agent is told it failed
        document["script_error"] = stopped
        text = f"{stopped}\n{text}"
    return Answer(document, text)


def script_error(stderr: str) -> str | None:
    """The profiled script's own error in one line (``the script stopped with RuntimeError: CUDA error: ... (exit
    status 1)``), from what skalpel run printed on stderr; None when the script did not fail."""
    found = _STOPPED.search(stderr)
    if found is None:
        return None
    name = found["name"]
    # the traceback's last line naming the exception (a chained one prints its cause first); a qualified name too
    lines = [text.strip() for text in stderr[found.end():].splitlines()]
    raised = [text for text in lines if text.split(":", 1)[0].rsplit(".", 1)[-1] == name]
    return f"the script stopped with {raised[-1] if raised else name} (exit status {found['status']})"


def _said_after_the_script(stderr: str) -> str:
    """skalpel's own lines after the script's traceback (why nothing was recorded), as one line."""
    found = _STOPPED.search(stderr)
    rest = stderr[found.end():] if found is not None else stderr
    said = [line.removeprefix("skalpel: ").removeprefix("error: ") for line in rest.splitlines()
            if line.startswith("skalpel: ")]  # fmt: skip
    return "; ".join(said)


def tune(script: str, args: Sequence[str] = (), *, budget_s: float = 300.0, timeout_s: float | None = None) -> Answer:
    """``skalpel tune --budget BUDGET SCRIPT ARGS``: rerun with each applicable fix, measured (skalpel.tune/1)."""
    timeout = timeout_s if timeout_s is not None else budget_s * 2 + 120  # the budget, and the profiled run's
    return _with_json(["tune", "--budget", str(budget_s), script, *args], timeout)


def _paths(paths: Sequence[str]) -> list[str]:
    """Paths as arguments, never taken for options (a path starting with '-')."""
    return [str(Path(path).absolute()) if str(path).startswith("-") else str(path) for path in paths]


def _with_json(args: list[str], timeout: float) -> Answer:
    with tempfile.TemporaryDirectory(prefix="skalpel-mcp-") as scratch:
        target = Path(scratch) / "result.json"
        command = [args[0], "--json", str(target), *args[1:]]
        done = _cli(command, timeout)
        if not target.is_file():
            raise SkalpelError(_one_line(done) or f"skalpel {args[0]} wrote no JSON (exit status {done.returncode})")
        return Answer(orjson.loads(target.read_bytes()), done.stdout)


def _cli(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    """``python -m skalpel ARGS`` in a child process; a SkalpelError with its one-line message when it fails."""
    env = {**os.environ, "COLUMNS": TEXT_WIDTH, "NO_COLOR": "1", "TERM": "dumb"}
    try:
        done = subprocess.run([sys.executable, "-m", "skalpel", *args], capture_output=True, text=True, env=env,
                              timeout=timeout, stdin=subprocess.DEVNULL)  # fmt: skip
    except subprocess.TimeoutExpired:
        raise SkalpelError(f"skalpel {args[0]} did not finish in {timeout:g} s") from None
    if done.returncode != 0 and args[0] not in ("run", "tune"):  # a run's script may fail and still leave a report
        raise SkalpelError(_one_line(done) or f"skalpel {args[0]} failed (exit status {done.returncode})")
    return done


def _one_line(done: subprocess.CompletedProcess) -> str:
    """The CLI's own error line (``skalpel: error: ...``), without its prefix; else the last line of stderr."""
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    said = [line for line in lines if line.startswith("skalpel: error: ")]
    if said:
        return said[-1].removeprefix("skalpel: error: ")
    return lines[-1].strip() if lines else ""
