"""Kineto's chatter filtered out of stderr while ``skalpel run`` runs a script.

Kineto prints from C++ straight to file descriptor 2: ``USDT: ... profiler_start`` and
``profiler_stop`` on every profiler start and stop, and, with a CUDA build of torch on a
machine without a GPU, ``gpuGetDeviceCount failed``; the profiler's memory recording warns
of every block allocated before it started (skalpel starts it mid-run, on purpose), and its
event collection (``collection.cpp``) warns of Python calls that were open when it started
or stopped (``_weakrefset.py`` frames). In a job's ranks c10 puts ``[rankN]:`` before its
warnings. Only warnings (``[W``) from those two files are dropped: errors (``[E``) stay.
Python's ``warnings`` cannot catch
them, so fd 2 is pointed at a pipe whose reader passes every other byte on to the real
stderr at once (a progress bar's partial line too); real Kineto errors, the script's
own output and its tracebacks go through unchanged.
"""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
import sys

_C10_WARNING = rb"(?:\[rank\d+\]:)?\[W[^\]]*\b"  # c10's "[W1203 20:21:14.249 file.cpp:245] ", a rank's prefix first
NOISE = re.compile(
    rb"^(?:USDT:.*|.*gpuGetDeviceCount failed.*"
    # skalpel starts the profiler mid-run, so blocks allocated before it are expected: not news
    rb"|" + _C10_WARNING + rb"CPUAllocator\.cpp:\d+\] Memory block of unknown size was allocated before the profiling started.*"
    # Python calls open across the profiler's start or stop (skalpel's own, or the script's): bookkeeping, not news
    rb"|" + _C10_WARNING + rb"collection\.cpp:\d+\] .*)$"
)
_NOISE_PREFIXES = (b"USDT:", b"ERROR:", b"WARNING:", b"[W", b"[rank")  # a partial line that may turn out to be noise
_PIPE_BYTES = 1 << 20
_READ_BYTES = 1 << 16


def is_noise(line: bytes) -> bool:
    return NOISE.match(line.rstrip(b"\r\n")) is not None


def filter_chunk(pending: bytes, chunk: bytes) -> tuple[bytes, bytes]:
    """(bytes to write now, bytes held back) after reading ``chunk``: whole noise lines are dropped."""
    data = pending + chunk
    lines = data.split(b"\n")
    tail = lines.pop()
    kept = b"".join(line + b"\n" for line in lines if not is_noise(line))
    if tail and not any(tail.startswith(prefix) or prefix.startswith(tail) for prefix in _NOISE_PREFIXES):
        return kept + tail, b""
    return kept, tail


class filtered_stderr:
    """Point fd 2 at the filter while the block runs (a no-op where that cannot be done).

    The filter is a small process of its own, not a thread: if the script crashes (a
    segfault), the filter still drains the pipe, so the crash's last words are printed.
    It runs in a session of its own, so a Ctrl-C at the terminal does not stop it; it
    ends when every write end is closed (children the script forked may hold one).
    """

    def __init__(self) -> None:
        self._saved: int | None = None
        self._filter: subprocess.Popen | None = None

    def __enter__(self) -> filtered_stderr:
        try:
            saved = os.dup(2)
            read_end, write_end = os.pipe()
        except OSError:
            return self
        try:
            command = [sys.executable, "-I", "-S", "-c", _RUN_FILTER, __file__]
            self._filter = subprocess.Popen(command, stdin=read_end, stdout=saved, start_new_session=True)
        except (OSError, ValueError, TypeError):  # no interpreter to start (an embedded Python)
            for descriptor in (saved, read_end, write_end):
                os.close(descriptor)
            return self
        os.close(read_end)
        try:
            fcntl.fcntl(write_end, getattr(fcntl, "F_SETPIPE_SZ", 1031), _PIPE_BYTES)  # room for bursts
        except OSError:
            pass
        _flush()
        os.dup2(write_end, 2)
        os.close(write_end)
        self._saved = saved
        return self

    def __exit__(self, *exc: object) -> None:
        if self._saved is None:
            return
        _flush()
        os.dup2(self._saved, 2)  # this process's last write end closes: the filter sees EOF once it drained
        os.close(self._saved)
        self._saved = None
        if self._filter is not None:
            try:
                self._filter.wait(timeout=2.0)  # its output comes before ours; a forked child may keep it running
            except subprocess.TimeoutExpired:
                pass


# The filter process runs this file's functions alone (-I -S: no site, no skalpel import).
_RUN_FILTER = "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__skalpel_filter__')"


def forward(read_end: int, target: int) -> None:
    """Copy ``read_end`` to ``target`` until end of file, without the noise.

    Once ``target`` cannot be written (a closed terminal), the pipe is still drained, so
    the writers never see a broken pipe.
    """
    pending = b""
    writable = True
    while True:
        try:
            chunk = os.read(read_end, _READ_BYTES)
        except OSError:
            return
        if not chunk:
            break
        now, pending = filter_chunk(pending, chunk)
        writable = writable and _write_all(target, now)
    if writable and pending and not is_noise(pending):
        _write_all(target, pending)


def _write_all(descriptor: int, data: bytes) -> bool:
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(descriptor, view) :]
    except OSError:
        return False
    return True


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass


if __name__ == "__skalpel_filter__":
    forward(0, 1)
