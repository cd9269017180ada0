"""``skalpel watch SCRIPT``: run an unchanged script in-process, as ``skalpel run`` does, under the flight recorder.

The script is checked and started as ``skalpel run`` starts it (``capture/target.py``,
``capture/runner``); a folder that cannot be recorded into is said in one line and the
script runs unwatched. Its exit status is handed back; its own error is shown as python would.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

from ..capture import signals
from ..capture.kineto_noise import filtered_stderr
from ..capture.runner import run_script
from ..capture.settings import CaptureSettings
from ..capture.target import Target, as_main, check_target
from .recorder import Watcher, open_watcher

_OWN_FRAMES = ("runpy.py", "<frozen runpy>", "skalpel/capture/runner.py")
_LIBRARIES = ("/site-packages/", "/dist-packages/", "/lib/python3", "/skalpel/")


def watch_script(target: Target, *, out: Path | None = None, name: str | None = None, step_on: str | None = None,
                 cooldown_s: float, capture: bool = True, settings: CaptureSettings | None = None,
                 hang_after_s: float | None = None) -> int:  # fmt: skip
    """Run ``target`` watched; returns the script's exit status."""
    code_path = check_target(target)
    signals.set_owner()
    watcher: Watcher | None = open_watcher(out, name or target.label, script=target.name, step_on=step_on,
                                           cooldown_s=cooldown_s, capture=capture, settings=settings,
                                           hang_after_s=hang_after_s)  # fmt: skip
    if watcher is not None:
        _say(f"watching {target.name}: every step into {watcher.store.path}")
    guard = signals.Guard()
    with guard, filtered_stderr():  # Kineto's chatter at each capture's start and stop, as under skalpel run
        if watcher is not None:
            watcher.install()
        with as_main(target, code_path):
            status, error = run_script(target, code_path, guard)  # the script's own error is caught there
        if not signals.is_owner():  # a child the script forked came back here
            return status
        if watcher is not None:
            said = None if error is None or isinstance(error, SystemExit) else f"{type(error).__name__}: {error}"
            watcher.close(exit_status=status, error=said, error_line=_error_line(error) if said else None)
    if watcher is not None:
        _say(watcher.why_no_step() or watcher.summary())
    if error is not None and not isinstance(error, (KeyboardInterrupt, signals.Terminated)):
        _show_error(error, status)
    return status


def _error_line(error: BaseException) -> str | None:
    """The innermost frame of the script's own code in the error's traceback (``train.py:88 in evaluate``)."""
    found, tb = None, error.__traceback__
    while tb is not None:
        path = tb.tb_frame.f_code.co_filename
        if not path.endswith(_OWN_FRAMES) and not any(part in path for part in _LIBRARIES):
            found = f"{path}:{tb.tb_lineno} in {tb.tb_frame.f_code.co_name}"
        tb = tb.tb_next
    return found


def _show_error(error: BaseException, status: int) -> None:
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename.endswith(_OWN_FRAMES):
        tb = tb.tb_next
    print(f"skalpel: the script stopped with {type(error).__name__} (exit status {status}):", file=sys.stderr)
    traceback.print_exception(type(error), error, tb, file=sys.stderr)


def _say(message: str) -> None:
    print(f"skalpel watch: {message}", file=sys.stderr, flush=True)
