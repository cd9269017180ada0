"""How the process of ``skalpel run`` ends: as ``python SCRIPT`` would, with the run written first.

Two ways a script ends its process that would otherwise cost the run:

- ``os._exit(n)`` ends the process on the spot: no ``finally``, no exit handler, no report.
  While the script runs, ``os_exit_concludes`` makes the call in the script's own thread
  conclude the run first (stop the profiler, write and analyse the trace, print the
  report), then end the process with ``n``, skipping the rest of the script, its
  ``finally`` blocks and its exit handlers, as ``os._exit`` does. A forked child's call
  passes straight through (its parent writes the run); one from another thread of the
  script too, after a line saying what the run folder holds, since the profiler is driven
  from the script's thread only.
- Threads still inside torch when the interpreter tears down. After the main thread,
  Python waits for the non-daemon threads, runs the exit handlers, then finalizes; a
  daemon thread that wakes in torch's C++ code then is stopped by CPython 3.11 with
  ``pthread_exit``, whose unwinding through torch's noexcept frames is
  ``std::terminate``: "terminate called without an active exception", status -6 (the
  script alone crashes so too, unless its daemons are idle at that moment). ``end``
  does the first two steps as Python does; if a thread of the script still runs then,
  it flushes the open files and ends with the script's status at once, without the
  teardown (the daemons die with the process, as the script asked of them). Without such
  a thread the usual exit follows, untouched.
"""

from __future__ import annotations

import atexit
import gc
import io
import os
import sys
import threading
from collections.abc import Callable

from .quiet import ignored

OWN_THREAD_PREFIX = "skalpel-"  # skalpel's own helper threads are named so: they never hold the process open

_real_exit = os._exit
_script_pid: int | None = None  # the process that ran the script in-process (`skalpel run`)


def ran_script() -> None:
    """This process runs the script: ``end`` applies to it (not to a child it forked)."""
    global _script_pid
    _script_pid = os.getpid()


class os_exit_concludes:
    """While the block runs: ``os._exit(n)`` in ``thread`` calls ``conclude(n)`` (which shows the run and returns
    the status to end with), then ends the process. ``owner`` says whether this process is the one profiled."""

    def __init__(self, conclude: Callable[[int], int], *, owner: Callable[[], bool], holding: Callable[[], str]) -> None:
        self.conclude = conclude
        self.owner = owner
        self.holding = holding
        self.thread = threading.get_ident()
        self._concluding = False

    def __enter__(self) -> None:
        os._exit = self._exit  # type: ignore[assignment]

    def __exit__(self, *exc: object) -> None:
        os._exit = _real_exit

    def _exit(self, status: int) -> None:
        if not isinstance(status, int) or not self.owner() or self._concluding:
            _real_exit(status)  # a bad value raises as it would; a forked child, or a second call, leaves now
        self._concluding = True
        if threading.get_ident() != self.thread:
            _say(f"os._exit({status}) in thread {threading.current_thread().name!r} ended the script before skalpel "
                 f"could write the report; {self.holding()}")  # fmt: skip
            _flush_streams()
            _real_exit(status)
        try:
            status = self.conclude(status)
        except Exception as error:  # noqa: BLE001 - skalpel's own bug: said in one line; the script's status stands
            _say(f"internal error while writing the run before os._exit ({type(error).__name__}: {error})")
        finally:
            _flush_streams()
            _real_exit(status)


def end(status: int) -> None:
    """After the report: end the process as ``python SCRIPT`` would; returns when the usual exit will do.

    Python's exit waits for the non-daemon threads (and lets idle thread pools end), then runs the exit
    handlers, then tears down. The first is done here, as Python does it (``threading._shutdown``, which the
    interpreter's own call then skips); if one of the script's threads still runs after it, the exit handlers
    run here too and the process ends with ``status`` without the teardown, which would crash it.
    """
    if _script_pid != os.getpid():
        return
    try:
        threading._shutdown()  # type: ignore[attr-defined]
    except KeyboardInterrupt:  # Ctrl-C while waiting for the script's threads: Python stops waiting too
        status = status or 130
    if not running_threads():
        return
    atexit._run_exitfuncs()  # the script's handlers, then skalpel's, as at the usual exit
    _flush_files()
    _real_exit(status)


def running_threads() -> list[threading.Thread]:
    """The script's threads still running besides this one (skalpel's own helpers and foreign threads left out:
    a thread Python did not start lingers in ``threading.enumerate()`` after it ended)."""
    current = threading.current_thread()
    return [
        thread for thread in threading.enumerate()
        if thread is not current and thread.is_alive() and not thread.name.startswith(OWN_THREAD_PREFIX)
        and not isinstance(thread, threading._DummyThread)  # type: ignore[attr-defined]
    ]  # fmt: skip


def _flush_files() -> None:
    """What the teardown would have done for a script's file left open: its buffer reaches the file."""
    _flush_streams()
    with ignored():  # isinstance on a deprecated module attribute warns (torch.distributed.reduce_op)
        for obj in gc.get_objects():
            try:
                # a dead weakref.proxy raises on isinstance (torch.compile leaves some at exit)
                if not isinstance(obj, (io.BufferedWriter, io.BufferedRandom, io.TextIOWrapper)):
                    continue
                if not obj.closed and obj.writable():
                    obj.flush()
            except (OSError, ValueError, RuntimeError, ReferenceError):
                pass


def _flush_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass


def _say(message: str) -> None:
    print(f"skalpel: {message}", file=sys.stderr, flush=True)
