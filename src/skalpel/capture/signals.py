"""Signals while ``skalpel run`` runs a script: SIGTERM and SIGHUP end it like Ctrl-C, never the trace.

By default SIGTERM and SIGHUP kill a Python process on the spot, losing the trace being
recorded. While the script runs they raise ``Terminated`` in the main thread instead, so
the script unwinds (its ``finally`` blocks run) and skalpel writes what was recorded,
then exits with 128 + the signal number, as a shell reports a process killed by it.

A script may install its own handlers: a callable one is kept (wrapped, so skalpel can
say the signal came), ``SIG_IGN`` is kept, and ``SIG_DFL`` ("die") becomes skalpel's
``Terminated``, which dies too, after keeping the trace. While the trace is written,
``deferred()`` holds every such signal back (a second Ctrl-C cannot cut the file) and
tells the caller afterwards. A forked child gets the default handlers back. A launcher
waiting for its ranks (``--nproc``) passes SIGTERM and SIGHUP on to them (``passed_on``).
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any, Callable

HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_original_signal = signal.signal


class Terminated(BaseException):
    """SIGTERM or SIGHUP reached the script (a BaseException: ``except Exception`` lets it pass)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"{signal.Signals(signum).name} received")
        self.signum = signum

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


def name(signum: int) -> str:
    return signal.Signals(signum).name


def _terminate(signum: int, frame: Any) -> None:
    raise Terminated(signum)


class Guard:
    """Installed around the script (main thread only); ``arrived`` lists the signals that came."""

    def __init__(self) -> None:
        self.arrived: list[int] = []
        self.script_handlers: dict[int, Any] = {}  # signals the script took over, with its handler
        self.late: int | None = None  # the first signal after the script ended (see ``hold``)
        self._saved: dict[int, Any] = {}
        self._active = False

    def __enter__(self) -> Guard:
        if threading.current_thread() is not threading.main_thread():
            return self
        self._active = True
        for signum in (signal.SIGTERM, signal.SIGHUP):
            self._saved[signum] = _original_signal(signum, self._on_signal(_terminate))
        self._saved[signal.SIGINT] = signal.getsignal(signal.SIGINT)
        signal.signal = self._script_signal  # type: ignore[assignment]
        global _guard
        _guard = self
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._active:
            return
        global _guard
        _guard = None
        signal.signal = _original_signal  # type: ignore[assignment]
        for signum, handler in self._saved.items():
            if handler is not None:
                _original_signal(signum, handler)
        self._active = False

    def hold(self) -> None:
        """The script ended: a signal now is noted in ``late`` (whatever the script installed), not raised."""
        if self._active:
            for signum in HANDLED:
                _original_signal(signum, self._hold)

    def _hold(self, signum: int, frame: Any) -> None:
        if self.late is None:
            self.late = signum

    def interrupting(self) -> None:
        """The trace is written: a signal now interrupts the analysis (Ctrl-C as KeyboardInterrupt)."""
        if self._active:
            for signum in (signal.SIGTERM, signal.SIGHUP):
                _original_signal(signum, _terminate)
            _original_signal(signal.SIGINT, signal.default_int_handler)

    def handlers_without_skalpel(self) -> dict[int, Any]:
        """Each signal's handler as it would be without skalpel: the script's own, else the one before."""
        return {signum: self.script_handlers.get(signum, handler) for signum, handler in self._saved.items()}

    def _on_signal(self, handler: Callable[[int, Any], Any]) -> Callable[[int, Any], Any]:
        def noted(signum: int, frame: Any) -> Any:
            self.arrived.append(signum)
            return handler(signum, frame)

        noted.skalpel_noted = True  # type: ignore[attr-defined]
        return noted

    def _script_signal(self, signum: int, handler: Any) -> Any:
        """``signal.signal`` as the script sees it while skalpel runs it."""
        if signum not in HANDLED or os.getpid() != _owner_pid:
            return _original_signal(signum, handler)
        if getattr(handler, "skalpel_noted", False) or handler is signal.default_int_handler:  # put back as it was
            self.script_handlers.pop(signum, None)
            return _original_signal(signum, handler)
        self.script_handlers[signum] = handler
        if handler is signal.SIG_IGN:
            return _original_signal(signum, handler)
        if handler is signal.SIG_DFL or handler is None:
            return _original_signal(signum, self._on_signal(_terminate))
        return _original_signal(signum, self._on_signal(handler))


class deferred:
    """Hold Ctrl-C, SIGTERM and SIGHUP back while a file is written; ``signum`` is the first that came."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._saved: dict[int, Any] = {}

    def __enter__(self) -> deferred:
        if threading.current_thread() is threading.main_thread():
            for signum in HANDLED:
                self._saved[signum] = _original_signal(signum, self._hold)
        return self

    def _hold(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum = signum

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._saved.items():
            _original_signal(signum, handler if handler is not None else signal.SIG_DFL)

    def reraise(self) -> None:
        """Deliver a held signal as the interruption it stands for."""
        if self.signum == signal.SIGINT:
            raise KeyboardInterrupt
        if self.signum is not None:
            raise Terminated(self.signum)


class passed_on:
    """While a child process runs: SIGTERM and SIGHUP go on to it, Ctrl-C waits for it (the terminal told it)."""

    def __init__(self, process: Any) -> None:
        self.process = process
        self._saved: dict[int, Any] = {}

    def __enter__(self) -> passed_on:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGHUP):
                self._saved[signum] = _original_signal(signum, self._pass)
            self._saved[signal.SIGINT] = _original_signal(signal.SIGINT, signal.SIG_IGN)
        return self

    def _pass(self, signum: int, frame: Any) -> None:
        try:
            self.process.send_signal(signal.SIGTERM)
        except OSError:
            pass

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._saved.items():
            _original_signal(signum, handler if handler is not None else signal.SIG_DFL)


_owner_pid = os.getpid()
_guard: Guard | None = None


def set_owner() -> None:
    """The process being profiled; its forked children are not."""
    global _owner_pid
    _owner_pid = os.getpid()


def is_owner() -> bool:
    return os.getpid() == _owner_pid


def _child_handlers() -> None:
    """In a forked child: the handlers it would have without skalpel (its parent's run keeps the trace)."""
    guard = _guard
    if guard is None or os.getpid() == _owner_pid:
        return
    signal.signal = _original_signal  # type: ignore[assignment]
    for signum, handler in guard.handlers_without_skalpel().items():
        try:
            _original_signal(signum, handler if handler is not None else signal.SIG_DFL)
        except (OSError, TypeError, ValueError):
            pass


os.register_at_fork(after_in_child=_child_handlers)
