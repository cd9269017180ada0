"""Progress bars for long loads: shown only when loading takes more than a second, in a terminal.

``load_progress`` follows one load in bytes over all its files. ``rank_progress`` follows
a job reduced rank by rank: a bar for the whole job (ranks done, bytes, time left) and a
line for each rank in flight with its own time left.
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

if TYPE_CHECKING:
    from rich.console import Console

SHOW_AFTER_S = 1.0
ProgressCallback = Callable[[int, int], None]  # (bytes done, bytes total): what trace.loader.load reports


def _stderr_console() -> Console:
    from rich.console import Console

    return Console(file=sys.stderr)


def _bar(label: str, console: Console):
    from rich.progress import BarColumn, DownloadColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn

    return Progress(
        TextColumn(label), BarColumn(), DownloadColumn(), TaskProgressColumn(), TimeRemainingColumn(),
        console=console, transient=True,
    )  # fmt: skip


@contextlib.contextmanager
def load_progress(*, console: Console | None = None) -> Iterator[ProgressCallback]:
    """Yield a callback for ``load``; a bar appears once loading has run for a second.

    ``load`` reports (bytes done, bytes total) over all the files it reads, so one bar
    covers a folder of many rank files. The bar goes away when loading is done; it is
    never shown when stderr is not a terminal.
    """
    started = time.monotonic()
    progress = None
    task = None
    finished = False

    def on_progress(done: int, total: int) -> None:
        nonlocal console, progress, task, finished
        if finished:
            return
        if progress is None:
            if done >= total or time.monotonic() - started < SHOW_AFTER_S:
                return
            console = console or _stderr_console()  # rich only once a bar may show: a quick load never imports it
            if not console.is_terminal:
                return
            progress = _bar("loading trace", console)
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


@contextlib.contextmanager
def rank_progress(files: list[Path], *, console: Console | None = None) -> Iterator[Callable[[int, float], None]]:
    """Yield a callback (file index, fraction of that file done) for ``skalpel.api.analyze_job``.

    The job's bar counts ranks done and bytes over all files, with the time left; each rank
    in flight has its own line (its file's name, bytes and time left) until it is done.
    """
    sizes = [_size(path) for path in files]
    total = max(sum(sizes), 1)
    done = [0.0] * len(files)
    started = time.monotonic()
    state: dict = {"progress": None, "job": None, "lines": {}, "console": console}

    def start() -> None:
        progress = state["progress"] = _bar("{task.description}", state["console"])
        progress.start()
        state["job"] = progress.add_task(_job_label(done), total=total)

    def on_rank(index: int, fraction: float) -> None:
        done[index] = max(done[index], min(max(fraction, 0.0), 1.0))
        if state["progress"] is None:
            if time.monotonic() - started < SHOW_AFTER_S or all(part >= 1.0 for part in done):
                return
            state["console"] = state["console"] or _stderr_console()  # rich only once a bar may show
            if not state["console"].is_terminal:
                return
            start()
        progress, lines = state["progress"], state["lines"]
        if len(files) > 1:
            if index not in lines and done[index] < 1.0:
                lines[index] = progress.add_task(f"  {files[index].name}", total=max(sizes[index], 1))
            if index in lines:
                progress.update(lines[index], completed=int(sizes[index] * done[index]))
                if done[index] >= 1.0:
                    progress.remove_task(lines.pop(index))
        completed = int(sum(size * part for size, part in zip(sizes, done)))
        progress.update(state["job"], completed=completed, description=_job_label(done))

    try:
        yield on_rank
    finally:
        if state["progress"] is not None:
            state["progress"].stop()


def _job_label(done: list[float]) -> str:
    if len(done) == 1:
        return "loading trace"
    return f"ranks {sum(1 for part in done if part >= 1.0)}/{len(done)}"


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
