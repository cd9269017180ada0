"""``skalpel run`` and ``skalpel tune`` agree: run's advice cites what tune measured on the same script.

``skalpel tune`` writes its result as ``tune.json`` into the run folder its findings came from (its
own profiled run, or the folder given with ``--from``). When ``skalpel run`` profiles that script
again, ``annotate`` finds the newest such result among the run folders beside the new one and adds,
under each finding's fix, what tune measured for the candidates that act on it:

    fix: ... Try num_workers=1 ...
         skalpel tune measured (skalpel-runs/...-train/tune.json): fewer_workers (num_workers=1) 0.72x
         (0.65-0.80): not recommended here

``cli.py`` hands ``annotate`` to the run command (``capture`` sits below ``tune`` and cannot import it).
Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from ..result.report import Finding, Report
from .candidates import BY_NAME

RESULT_FILE = "tune.json"
# Candidates that act on a finding beyond those its catalogue entry names: the worker count both ways.
_ALSO = {"dataloader_bound": ("fewer_workers", "no_workers", "workers_threads")}


def same_script(document: dict[str, Any], script: str, args: tuple[str, ...]) -> bool:
    """The tune result is for this script (the same file, wherever it was named from) and these arguments."""
    named = document.get("script_path") or document.get("script") or ""
    return _real(named) == _real(script) and list(document.get("args") or []) == list(args)


def latest_result(folders: list[Path], script: str, args: tuple[str, ...]) -> tuple[dict[str, Any], Path] | None:
    """The newest ``tune.json`` for this script in ``folders`` or the run folders inside them; None when there is none."""
    found: list[tuple[float, Path, dict[str, Any]]] = []
    for folder in folders:
        for path in [folder / RESULT_FILE, *folder.glob(f"*/{RESULT_FILE}")]:
            try:
                document = json.loads(path.read_text(encoding="utf-8"))
                modified = path.stat().st_mtime
            except (OSError, ValueError):
                continue
            if isinstance(document, dict) and document.get("schema") == "skalpel.tune/1" and same_script(document, script, args):
                found.append((modified, path, document))
    if not found:
        return None
    _, path, document = max(found, key=lambda item: (item[0], str(item[1])))
    return document, path


def measured_words(finding_id: str, document: dict[str, Any], path: Path | str) -> str | None:
    """What tune measured for the candidates acting on ``finding_id``, in one sentence; None when it tried none."""
    names = [name for name, candidate in BY_NAME.items() if finding_id in candidate.findings]
    names += [name for name in _ALSO.get(finding_id, ()) if name not in names]
    recommended = set(document.get("recommended") or [])
    parts = []
    for entry in document.get("candidates") or []:
        if entry.get("name") not in names or entry.get("verdict") is None:
            continue
        parts.append(f"{entry['name']}{_settings(entry.get('fix') or {})} {_speedup(entry)}: "
                     f"{_judgement(entry, recommended)}")  # fmt: skip
    if not parts:
        return None
    return f"skalpel tune measured ({path}): " + "; ".join(parts)


def annotate(report: Report, folder: Path | None, script: str, args: tuple[str, ...]) -> Report:
    """``report`` with each fix followed by what tune measured on this script, when a tune result is found."""
    if folder is None:
        return report
    found = latest_result([folder, folder.parent], script, args)
    if found is None:
        return report
    document, path = found
    shown = _shown(path)
    findings = tuple(_cited(finding, document, shown) for finding in report.findings)
    return dataclasses.replace(report, findings=findings)


def _cited(finding: Finding, document: dict[str, Any], path: str) -> Finding:
    words = measured_words(finding.id, document, path)
    if words is None or not finding.fix:
        return finding
    return dataclasses.replace(finding, fix=f"{finding.fix} ({words})")


def _settings(fix: dict[str, Any]) -> str:
    """The settings a candidate ran with, as the user would write them: ``(num_workers=1, threads=1)``."""
    pieces = [f"{key}={value}" for key, value in (fix.get("dataloader") or {}).items()]
    if "threads" in fix:
        pieces.append(f"set_num_threads({fix['threads']})")
    return f" ({', '.join(pieces)})" if pieces else ""


def _speedup(entry: dict[str, Any]) -> str:
    speedup, low, high = entry.get("speedup"), entry.get("speedup_low"), entry.get("speedup_high")
    if speedup is None:
        return entry.get("verdict") or ""
    interval = f" ({low:.2f}–{high:.2f})" if low is not None and high is not None else ""
    return f"{speedup:.2f}x{interval}"


def _judgement(entry: dict[str, Any], recommended: set[str]) -> str:
    if entry.get("name") in recommended:
        return "recommended here"
    verdict = entry.get("verdict")
    if verdict == "error":
        return "it broke the script here"
    why = {"slower": "slower", "no_gain": "no gain beyond the noise", "faster": "faster, but another was faster still"}
    return f"{why.get(verdict, verdict)}: not recommended here"


def _real(path: str) -> str:
    return os.path.realpath(path) if path else ""


def _shown(path: Path) -> str:
    """The result file as short as it can be said: relative to the working directory when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
