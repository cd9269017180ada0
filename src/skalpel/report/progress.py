"""A progress bar for long loads: shown only when loading takes more than a second."""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Iterator

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn

from ..trace.loader import ProgressCallback

SHOW_AFTER_S = 1.0


@contextlib.contextmanager
def load_progress(*, console: Console | None = None) -> Iterator[ProgressCallback]:
    """Yield a callback for ``load``; a bar appears once loading has run for a second.

    ``load`` reports (bytes done, bytes total) over all the files it reads, so one bar
    covers a folder of many rank files. The bar goes away when loading is done; it is
    never shown when stderr is not a terminal.
    """
    console = console or Console(file=sys.stderr)
    started = time.monotonic()
    progress: Progress | None = None
    task = None
    finished = False

    def on_progress(done: int, total: int) -> None:
        nonlocal progress, task, finished
        if finished:
            return
        if progress is None:
            if done >= total or time.monotonic() - started < SHOW_AFTER_S or not console.is_terminal:
                return
            progress = Progress(
                TextColumn("loading trace"), BarColumn(), DownloadColumn(), TaskProgressColumn(), TimeRemainingColumn(),
                console=console, transient=True,
            )  # fmt: skip
            progress.start()
            task = progress.add_task("load", total=total)
        progress.update(task, completed=min(done, total), total=total)
        if done >= total:
            finished = True
            progress.stop()

    try:
        yield on_progress
    finally:
        if progress is not None and not finished:
            progress.stop()
