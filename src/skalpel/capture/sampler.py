"""A light sampler of the training thread's own frames, for locations at the costly statement.

The profiler's Python events name a function by its ``def`` line; which statement of it
costs the time is not in them. While the first window records, a thread reads the
training thread's frame stack (``sys._current_frames()``) every few milliseconds and
keeps the user's frames with their current line. The samples go into the trace header
(``skalpel_line_samples``, see ``trace/line_samples.py``) with an anchor, the
``perf_counter`` time at which a known ``ProfilerStep`` began, so the analysis can put
them on the trace's clock and name the statement running inside a slow range or at a
memory event. One sample costs tens of microseconds under the GIL, every 5 ms.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from ..trace.stacks import is_user_file
from .quiet import off_the_python_tracer

INTERVAL_S = 0.005
MAX_SAMPLES = 4000  # about 20 s of recorded steps; later steps keep their def-line locations
MAX_DEPTH = 12  # user frames kept per sample, innermost first


class LineSampler:
    def __init__(self, interval_s: float = INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.target = threading.get_ident()  # the thread that runs the steps
        self.samples: list[tuple[float, tuple[tuple[str, int, str, int], ...]]] = []
        self.anchor: tuple[int, float] | None = None  # (ProfilerStep number, perf_counter us at its start)
        self._stopped = False  # a plain flag and time.sleep: an Event's timed wait costs more than the sample
        self._thread = threading.Thread(target=self._run, name="skalpel-line-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def anchor_at(self, step_number: int) -> None:
        """``ProfilerStep#step_number`` begins now: what puts the samples on the trace's clock."""
        self.anchor = (step_number, time.perf_counter() * 1e6)

    def stop(self, *, wait: bool = True) -> None:
        """Stop sampling; ``wait=False`` leaves the thread to end at its next wake-up (inside a recorded step)."""
        self._stopped = True
        if wait and self._thread.is_alive():
            self._thread.join()

    def header_value(self) -> dict[str, Any]:
        assert self.anchor is not None
        return {
            "anchor_step": self.anchor[0],
            "anchor_us": round(self.anchor[1], 1),
            "interval_us": round(self.interval_s * 1e6),
            "samples": [[round(t_us, 1), [list(frame) for frame in stack]] for t_us, stack in list(self.samples)],
        }

    def _run(self) -> None:
        target, frames_of, clock, sleep = self.target, sys._current_frames, time.perf_counter, time.sleep
        user: dict[Any, bool] = {}
        samples, interval = self.samples, self.interval_s
        while len(samples) < MAX_SAMPLES:
            sleep(interval)
            if self._stopped:
                return
            off_the_python_tracer()  # tracing this thread slows the training one and fills the user's trace
            frame = frames_of().get(target)
            now = clock() * 1e6
            stack = []
            while frame is not None and len(stack) < MAX_DEPTH:
                code = frame.f_code
                keep = user.get(code)
                if keep is None:
                    keep = user[code] = is_user_file(code.co_filename)
                if keep:
                    stack.append((code.co_filename, code.co_firstlineno, code.co_name, frame.f_lineno))
                frame = frame.f_back
            del frame
            if stack:
                samples.append((now, tuple(stack)))
