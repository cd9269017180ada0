"""A progress bar for long loads: shown only when loading takes more than a second."""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Iterator

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn

from ..trace.loader import ProgressCallback

SHOW_AFTER_S = 1.0


@contextlib.contextmanager
def load_progress(*, console: Console | None = None) -> Iterator[ProgressCallback]:
    """Yield a callback for ``load``; a bar appears once loading has run for a second."""
    console = console or Console(file=sys.stderr)
    started = time.monotonic()
    progress: Progress | None = None
    task = None
    done = 0

    def on_progress(events: int, total: int) -> None:
        nonlocal progress, task, done
        done += events
        if progress is None:
            if time.monotonic() - started < SHOW_AFTER_S or not console.is_terminal:
                return
            progress = Progress(
                TextColumn("loading trace"), BarColumn(), TaskProgressColumn(), TimeRemainingColumn(),
                console=console, transient=True,
            )  # fmt: skip
            progress.start()
            task = progress.add_task("load", total=total)
        progress.update(task, completed=min(done, total), total=total)
        if done >= total:
            done = 0  # the next file starts over

    try:
        yield on_progress
    finally:
        if progress is not None:
            progress.stop()
