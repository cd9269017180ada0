"""A script that starts ``torch.profiler`` itself: skalpel's capture steps aside.

Two profiler sessions at once crash the process (exit -11, Kineto: "External init
callback must run in same thread as registerClient"). While ``skalpel run`` runs a
script, every profiler start goes through ``torch.autograd.profiler.profile._prepare_trace``
(``torch.profiler.profile`` and the older ``torch.autograd.profiler.profile`` both call
it); a start that is not skalpel's own first calls ``on_foreign_start``, which stops
skalpel's session, keeping the steps it recorded so far, and stops marking steps.
"""

from __future__ import annotations

import sys
import weakref
from pathlib import Path
from typing import Any, Callable

from torch.autograd import profiler as autograd_profiler

from ..trace.stacks import is_user_file

OWN: weakref.WeakSet = weakref.WeakSet()  # the torch.profiler.profile objects skalpel created


def is_own(autograd_profile: Any) -> bool:
    return any(getattr(session, "profiler", None) is autograd_profile for session in list(OWN))


class ProfilerWatch:
    """Installed around the script; ``where`` is the script's line that started its own profiler."""

    def __init__(self, on_foreign_start: Callable[[], None]) -> None:
        self.on_foreign_start = on_foreign_start
        self.where: str | None = None
        self._original: Any = None

    def __enter__(self) -> ProfilerWatch:
        original = autograd_profiler.profile._prepare_trace
        watch = self

        def _prepare_trace(profile: Any) -> Any:
            if watch.where is None and not is_own(profile):
                watch.where = _script_line() or "the script"
                watch.on_foreign_start()
            return original(profile)

        _prepare_trace.__wrapped__ = original  # type: ignore[attr-defined]
        self._original = original
        autograd_profiler.profile._prepare_trace = _prepare_trace  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        if self._original is not None:
            autograd_profiler.profile._prepare_trace = self._original  # type: ignore[method-assign]
            self._original = None


def _script_line() -> str | None:
    """``train.py:12``: the innermost frame in the user's code."""
    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if is_user_file(filename) and "skalpel" not in Path(filename).parts:
            return f"{Path(filename).name}:{frame.f_lineno}"
        frame = frame.f_back
    return None
