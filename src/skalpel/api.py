"""The Python API: what ``import skalpel`` offers besides ``skalpel.profile``."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import orjson

from .pipeline import build_report
from .report.model import CaptureInfo, Report
from .trace.loader import ProgressCallback, load

RUN_REPORT = "report.json"


def analyze(paths: str | Path | Iterable[str | Path], *, on_progress: ProgressCallback | None = None) -> Report:
    """Load traces (files or folders, any torch.profiler output) and diagnose them."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    return build_report(load(paths, on_progress=on_progress), capture=stored_capture(paths))


def stored_capture(paths: str | Path | Iterable[str | Path]) -> CaptureInfo | None:
    """The capture facts of a skalpel run folder (kept in its report.json), so a re-analysis keeps them.

    Only for a single run folder: traces gathered from several places have no one capture.
    """
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    if len(paths) != 1 or not (Path(paths[0]) / RUN_REPORT).is_file():
        return None
    try:
        return Report.from_json((Path(paths[0]) / RUN_REPORT).read_bytes()).capture
    except (OSError, ValueError, KeyError, TypeError, orjson.JSONDecodeError):
        return None  # an old or damaged report: analyse the traces without capture facts
