"""The live line: one line at the bottom of the terminal, updated by the writer thread while the run goes on.

Only when stdout is a terminal (a log file gets nothing); rich's ``Live`` keeps the script's
own prints above it. ``line()`` is the text, testable without a terminal.
"""

from __future__ import annotations

import sys
from typing import Any

MIB = 2**20


def line(steps: int, median_s: float | None, memory: int | None, memory_source: str, anomalies: int,
         capturing: bool, hang_bound_s: float | None = None) -> str:  # fmt: skip
    parts = [f"skalpel watch: step {steps}"]
    if median_s is not None:
        parts.append(f"median {median_s * 1e3:.2f} ms")
    if memory is not None:
        parts.append(f"{memory_source} {memory / MIB:.0f} MiB")
    parts.append(f"{anomalies} anomal{'y' if anomalies == 1 else 'ies'}")
    if hang_bound_s is not None:
        parts.append(f"hang after {hang_bound_s:.0f} s")
    if capturing:
        parts.append("capturing")
    return " · ".join(parts)


class LiveLine:
    def __init__(self) -> None:
        self._live: Any = None

    def start(self) -> None:
        if not sys.stdout.isatty():  # stderr may be a pipe already (Kineto's chatter filtered): stdout decides
            return
        from rich.console import Console
        from rich.live import Live

        self._live = Live("", console=Console(stderr=True, force_terminal=True), transient=True, auto_refresh=False,
                          redirect_stdout=True, redirect_stderr=True)  # fmt: skip
        self._live.start()

    def update(self, text: str) -> None:
        if self._live is not None:
            self._live.update(text, refresh=True)

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
