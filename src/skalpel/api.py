"""The Python API: what ``import skalpel`` offers besides ``skalpel.profile``."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from .pipeline import build_report
from .report.model import Report
from .trace.loader import ProgressCallback, load


def analyze(paths: str | Path | Iterable[str | Path], *, on_progress: ProgressCallback | None = None) -> Report:
    """Load traces (files or folders, any torch.profiler output) and diagnose them."""
    return build_report(load(paths, on_progress=on_progress))
