"""Writing a recorded trace: whole, under its final name, or not at all.

torch.profiler's own ``.gz`` export writes the JSON to a temporary file, then gzips it
from Python, so a Ctrl-C or a full disk during that second part leaves a gzip file with a
bad CRC. Here the profiler writes the plain JSON into the run folder under a ``partial-``
name; skalpel gzips it under another ``partial-`` name, fsyncs, and renames it into place.
The caller holds back Ctrl-C and SIGTERM meanwhile (``signals.deferred``). When the disk
fills up the error says so, and what was written is kept: a complete plain JSON as
``trace-rankN.json``, a cut one as ``trace-rankN.truncated.json`` (the loader reads it).
Nothing named ``partial-*`` survives an export that returns or raises. A very large trace
keeps its Python stacks for its first steps only (``bounded.py``).
"""

from __future__ import annotations

import errno
import gzip
import os
import resource
import shutil
from pathlib import Path
from typing import Any

from .bounded import STACK_STEPS, Kept, PartialStep, copy_bounded, partial_step, stack_cut

_CHUNK = 1 << 20
_DISK_FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


class ExportError(Exception):
    """The trace could not be written; ``kept`` is what remains of it (None: nothing)."""

    def __init__(self, message: str, kept: Path | None = None, disk_full: bool = False) -> None:
        super().__init__(message)
        self.kept = kept
        self.disk_full = disk_full


def partial_name(path: Path, suffix: str) -> Path:
    return path.with_name("partial-" + path.name.removesuffix(".json.gz") + suffix)


def export_trace(prof: Any, path: Path, *, partial: list[PartialStep] | None = None) -> Kept | None:
    """Write ``prof``'s trace to ``path`` (``.json.gz``); what was left out of a long one (None: nothing).

    ``partial``: the recording stopped inside a step; that step is left out of the trace and appended to the list.
    An ExportError says what went wrong and what is kept.
    """
    plain = partial_name(path, ".json.part")  # not *.json: `skalpel analyze FOLDER` passes it over
    packed = partial_name(path, ".tmp.gz")
    try:
        prof.export_chrome_trace(str(plain))  # C++: it reports no write error, so the file is checked
        if not _complete(plain):
            raise _cut_short(plain, path)
        try:
            kept = _gzip(plain, packed, partial)
        except OSError as error:
            packed.unlink(missing_ok=True)  # frees the space the plain JSON needs to be kept
            kept = path.with_name(path.name.removesuffix(".gz"))
            os.replace(plain, kept)
            raise ExportError(
                f"{_describe(error, path)} while compressing the trace; kept the complete, uncompressed {kept}",
                kept=kept, disk_full=error.errno in _DISK_FULL,
            ) from None  # fmt: skip
        os.replace(packed, path)
        _fsync_folder(path.parent)
        return kept
    except OSError as error:
        raise ExportError(f"cannot write {path}: {_describe(error, path)}", disk_full=error.errno in _DISK_FULL) from None
    finally:
        for leftover in (plain, packed, plain.with_name(plain.name + ".tmp")):  # Kineto writes NAME.tmp, then renames
            leftover.unlink(missing_ok=True)


def _gzip(source: Path, target: Path, partial: list[PartialStep] | None = None) -> Kept | None:
    size = source.stat().st_size
    cut = stack_cut(str(source), size)
    step = partial_step(str(source)) if partial is not None else None
    if partial is not None and step is not None:
        partial.append(step)
    with open(source, "rb") as plain, open(target, "wb") as raw:
        with gzip.GzipFile(filename=source.name, mode="wb", fileobj=raw, compresslevel=6) as packed:
            if cut is None and step is None:
                shutil.copyfileobj(plain, packed, _CHUNK)
                written = size
            else:
                written = copy_bounded(plain, packed, cut[0] if cut else float("inf"),
                                       drop_from=step.start if step else None)  # fmt: skip
        raw.flush()
        os.fsync(raw.fileno())
    return None if cut is None else Kept(steps=cut[1], stack_steps=min(cut[1], STACK_STEPS), bytes_in=size, bytes_out=written)


def _complete(path: Path) -> bool:
    """Kineto ends a whole trace with its closing brace; a failed write leaves none (or no file)."""
    try:
        with open(path, "rb") as file:
            size = file.seek(0, os.SEEK_END)
            file.seek(max(0, size - 64))
            return size > 0 and file.read().rstrip().endswith(b"}")
    except OSError:
        return False


def _cut_short(plain: Path, path: Path) -> ExportError:
    """The profiler's write failed: keep what it wrote (Kineto writes NAME.tmp, then renames), named as cut short."""
    reason = _disk_full_reason(path)
    why = f"disk full ({reason})" if reason is not None else "the profiler could not write it (its error is printed above)"
    for written in (plain, plain.with_name(plain.name + ".tmp")):
        if written.is_file() and written.stat().st_size > 0:
            kept = path.with_name(path.name.removesuffix(".json.gz") + ".truncated.json")
            os.replace(written, kept)
            return ExportError(
                f"{why}: the trace was cut short at {kept.stat().st_size / 2**20:.1f} MiB; kept as {kept} "
                "(`skalpel analyze` reads what it holds)", kept=kept, disk_full=reason is not None,
            )  # fmt: skip
    return ExportError(f"{why}: the trace could not be written to {path.parent}", disk_full=reason is not None)


def _disk_full_reason(path: Path) -> str | None:
    """Why writing under ``path`` fails for lack of room, or None when room is not the problem."""
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit != resource.RLIM_INFINITY:
        return f"the file size limit, ulimit -f, is {limit / 2**20:.1f} MiB"
    try:
        free = shutil.disk_usage(path.parent).free
    except OSError:
        return None
    return f"{free / 2**20:.1f} MiB free" if free < 64 * 2**20 else None


def _describe(error: OSError, path: Path) -> str:
    if error.errno in _DISK_FULL:
        reason = _disk_full_reason(path)
        return f"disk full ({reason or error.strerror})"
    return error.strerror or str(error)


def _fsync_folder(folder: Path) -> None:
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)
