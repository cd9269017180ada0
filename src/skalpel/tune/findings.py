"""Where the candidates' findings come from: one short profiled run of the script, or a report given with ``--from``.

The profiled run is an ordinary ``skalpel run`` folder (``skalpel-runs/<time>-<name>``): tune writes its
result beside that run's report, as it does into a run folder given with ``--from``, so that a later
``skalpel run`` of the script cites it (``advice.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .result import TuneFailed


@dataclass(frozen=True)
class Findings:
    ids: set[str]
    source: str  # where they came from, in words
    folder: Path | None  # the run folder they came from (tune's result is written there), if any


def findings_for(script: str, args: tuple[str, ...], *, source: str | None, profile: bool, timeout_s: float) -> Findings:
    if source:
        from ..api import load_report

        ids = {finding.id for finding in load_report(source, which="--from").findings}
        return Findings(ids, source, run_folder_of(Path(source)))
    if not profile:
        return Findings(set(), "nowhere (--no-profile)", None)
    ids, folder = profile_findings(script, args, timeout_s=timeout_s)
    return Findings(ids, f"a profiled run (skalpel run): {folder}", folder)


def run_folder_of(path: Path) -> Path | None:
    """The run folder a ``--from`` path is or lies in (a folder with a report.json); None for a bare trace."""
    folder = path if path.is_dir() else path.parent
    return folder.absolute() if (folder / "report.json").is_file() else None


def profile_findings(script: str, args: tuple[str, ...], *, timeout_s: float) -> tuple[set[str], Path]:
    """Finding ids of one short ``skalpel run --stop-after-capture`` of the script, and its run folder."""
    from ..capture.runfolder import default_folder, prepare_new, remove_if_empty

    out = prepare_new(default_folder(Path(script).stem))
    command = [sys.executable, "-m", "skalpel", "run", "--stop-after-capture", "--out", str(out), script, *args]
    try:
        done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout_s)  # fmt: skip
    except subprocess.TimeoutExpired:
        remove_if_empty(out)
        raise TuneFailed(f"the profiled run of {script} took longer than {timeout_s:.0f} s; "
                         "give a larger --budget, or a report with --from") from None  # fmt: skip
    try:
        report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        remove_if_empty(out)
        raise TuneFailed(_profile_error(script, done), _traceback_in(done.stderr)) from None
    return {str(finding.get("id")) for finding in report.get("findings", [])}, out


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


