"""The run folder: one folder per capture, holding the trace and everything derived from it.

``skalpel-runs/2026-12-02T11-30-05-train/`` by default; every run gets its own (two runs
started in the same second: ``...-train-2``). The folder is created (and checked for
writing) before the script runs, as an absolute path, so a bad ``--out`` fails at once
and a script that changes directory does not move it.
Every derived output is written by ``write_outputs``: the trace exporters, then each renderer of
``report/base.RENDERERS`` (a new renderer is one more file here, ``report.<extension>``).
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from ..errors import SkalpelError
from ..files import write_file
from ..result.report import Report

if TYPE_CHECKING:
    from ..job.rank import FlameGraphs

DEFAULT_PARENT = "skalpel-runs"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def trace_file_name(rank: int) -> str:
    return f"trace-rank{rank}.json.gz"


def default_folder(name: str, *, parent: Path | None = None, now: float | None = None) -> Path:
    """``./skalpel-runs/<YYYY-MM-DDTHH-MM-SS>-<name>``."""
    stamp = time.strftime("%Y-%m-%dT%H-%M-%S", time.localtime(now))
    safe = _UNSAFE.sub("_", name).strip("._") or "run"
    return (parent or Path(DEFAULT_PARENT)) / f"{stamp}-{safe}"


def prepare(folder: Path) -> Path:
    """Create ``folder`` (or reuse it) and prove it can be written; a SkalpelError (one line) if not."""
    return _writable(folder.absolute(), exclusive=False)


def prepare_new(folder: Path) -> Path:
    """Like ``prepare``, but a folder of its own: ``folder``, else ``folder-2``, ``folder-3``, ..."""
    folder = folder.absolute()
    for number in range(1, 1000):
        candidate = folder if number == 1 else folder.with_name(f"{folder.name}-{number}")
        try:
            return _writable(candidate, exclusive=True)
        except FileExistsError:
            continue
    raise SkalpelError(f"cannot create a new run folder next to {folder}: 999 folders of that name exist")


def _writable(folder: Path, *, exclusive: bool) -> Path:
    probe = folder / f".skalpel-write-test-{os.getpid()}-{threading.get_ident()}"
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        folder.mkdir(exist_ok=not exclusive)
        probe.write_bytes(b"")
        probe.unlink()
    except FileExistsError:
        if exclusive and folder.is_dir():
            raise
        raise SkalpelError(f"cannot write to the output folder {folder}: a file is in the way") from None
    except OSError as error:
        reason = error.strerror or str(error)
        raise SkalpelError(f"cannot write to the output folder {folder}: {reason}") from None
    return folder


def remove_if_empty(folder: Path) -> bool:
    """Remove a run folder that holds nothing; True when it is gone."""
    try:
        folder.rmdir()
    except OSError:
        return False
    return True


def holdings(folder: Path) -> str:
    """What a run folder holds, in a few words: ``trace-rank0.json.gz (1.2 MiB), summary.txt``."""
    try:
        files = sorted(path for path in folder.iterdir() if path.is_file() and not path.name.startswith("."))
    except OSError:
        return "nothing readable"
    if not files:
        return "nothing"
    return ", ".join(f"{path.name} ({path.stat().st_size / 2**20:.1f} MiB)" if "trace" in path.name else path.name
                     for path in files)  # fmt: skip


def write_outputs(report: Report, flame: FlameGraphs, folder: Path, *, traces: Iterable[Path] = ()) -> list[Path]:
    """Write every derived output of a capture into ``folder``; return all files of the run.

    ``flame``: the lowest rank's flame graphs (``job.report_of(..., flame_files=True)``); ``traces`` are the trace
    files already in the folder (written by the profiler); they head the returned list so the caller can print
    every file of the run.
    """
    from ..report.base import RENDERERS, named, write

    written = [Path(path) for path in traces]
    # The flame graph and the speedscope profile draw the trace itself, so they are no renderers of a Report.
    for name, content in (("flamegraph.svg", flame.svg), ("flamegraph.speedscope.json", flame.speedscope)):
        if content is not None:
            written.append(write_file(folder / name, content))
    # Each renderer of a Report writes report.<extension>, but the text one: that is summary.txt, written last
    # because it lists every file of the run.
    files = [(folder / f"report{renderer.extension}", renderer) for renderer in RENDERERS if renderer.name != "text"]
    written += write(report, files, {"html": {"flame": flame.tree}})
    summary = folder / "summary.txt"
    listing = "\n".join(f"wrote {path}" for path in [*written, summary])  # every file of the run, itself included
    written.append(write_file(summary, named("text", RENDERERS)().render(report) + listing + "\n"))
    return written
