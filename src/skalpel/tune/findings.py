"""Where the candidates' findings come from: one short profiled run of the script, or a report given with ``--from``."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from .result import TuneFailed


def findings_for(script: str, args: tuple[str, ...], *, source: str | None, profile: bool, timeout_s: float) -> tuple[set[str], str]:
    """Finding ids, and where they came from in words."""
    if source:
        from ..api import load_report

        return {finding.id for finding in load_report(source, which="--from").findings}, source
    if not profile:
        return set(), "nowhere (--no-profile)"
    return profile_findings(script, args, timeout_s=timeout_s), "a profiled run (skalpel run)"


def profile_findings(script: str, args: tuple[str, ...], *, timeout_s: float) -> set[str]:
    """Finding ids of one short ``skalpel run --stop-after-capture`` of the script."""
    with tempfile.TemporaryDirectory(prefix="skalpel-tune-profile-") as folder:
        out = Path(folder) / "run"
        command = [sys.executable, "-m", "skalpel", "run", "--stop-after-capture", "--out", str(out), script, *args]
        try:
            done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=timeout_s)  # fmt: skip
        except subprocess.TimeoutExpired:
            raise TuneFailed(f"the profiled run of {script} took longer than {timeout_s:.0f} s; "
                             "give a larger --budget, or a report with --from") from None  # fmt: skip
        try:
            report = json.loads((out / "report.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise TuneFailed(_profile_error(script, done), _traceback_in(done.stderr)) from None
    return {str(finding.get("id")) for finding in report.get("findings", [])}


def _profile_error(script: str, done: subprocess.CompletedProcess) -> str:
    """``skalpel run``'s own error (no steps found, ...), else the script's exception line (the last unindented one)."""
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    own = [line for line in lines if line.startswith("skalpel: error:")]
    if own:
        return own[-1].removeprefix("skalpel: error: ")
    errors = [line for line in lines if not line.startswith(("skalpel:", " ", "Traceback"))]
    why = errors[-1] if errors else (lines[-1] if lines else "no output")
    return f"{script} failed on the profiled run, unchanged (exit status {done.returncode}): {why}"


def _traceback_in(stderr: str) -> str:
    """The script's traceback in ``skalpel run``'s output, without skalpel's own lines around it."""
    lines = stderr.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    if not starts:
        return ""
    kept = []
    for line in lines[starts[-1]:]:
        if line.startswith("skalpel:"):
            break
        kept.append(line)
    return "\n".join(kept)[-4000:]


