"""Line samples a skalpel capture stored in the trace header: which statement ran when.

``skalpel_line_samples`` (written by ``capture/sampler.py``)::

    {"anchor_step": 3, "anchor_us": 81234.5, "interval_us": 5000,
     "samples": [[t_us, [[path, def_line, function, current_line], ...innermost first]], ...]}

``t_us`` and ``anchor_us`` are on the capturing process's ``perf_counter`` clock; the
``ProfilerStep#<anchor_step>`` event began at ``anchor_us``, which puts the samples on the
trace's clock. Anything malformed is ignored: the locations then stay at the def line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

HEADER_KEY = "skalpel_line_samples"

Frame = tuple[str, int, str, int]  # path, def line, function, current line


@dataclass(frozen=True)
class LineSamples:
    anchor_step: int
    times_us: np.ndarray  # float64, on the sampling process's clock, ascending
    stacks: tuple[tuple[Frame, ...], ...]
    interval_us: float

    def shifted(self, offset_us: float) -> LineSamples:
        return LineSamples(self.anchor_step, self.times_us + offset_us, self.stacks, self.interval_us)

    def lines_of(self, path: str, line: int, function: str, start_us: float, end_us: float) -> list[int]:
        """Current lines of one function in the samples between two instants (times already shifted).

        The profiler names a function by its def line, or by the line it was at when recording
        began: the sampled frame is the innermost of that name that starts at or before ``line``.
        """
        first, last = np.searchsorted(self.times_us, [start_us, end_us], side="left")
        name = _base(path)
        lines = []
        for stack in self.stacks[first:last]:
            for frame in stack:
                if frame[2] == function and frame[1] <= line and _base(frame[0]) == name:
                    lines.append(frame[3])
                    break
        return lines


def parse(value: Any) -> LineSamples | None:
    """The header value as LineSamples; None when absent or malformed."""
    if not isinstance(value, dict):
        return None
    try:
        anchor_step = int(value["anchor_step"])
        anchor_us = float(value["anchor_us"])
        interval_us = float(value.get("interval_us", 5000))
        times, stacks = [], []
        for t_us, frames in value["samples"]:
            stack = tuple((str(p), int(first), str(func), int(line)) for p, first, func, line in frames)
            times.append(float(t_us) - anchor_us)
            stacks.append(stack)
    except (KeyError, TypeError, ValueError):
        return None
    order = np.argsort(np.asarray(times, dtype=np.float64), kind="stable")
    return LineSamples(anchor_step, np.asarray(times, dtype=np.float64)[order], tuple(stacks[i] for i in order),
                       interval_us)  # fmt: skip


def _base(path: str) -> str:
    return path.replace("\\", "/").rsplit("/", 1)[-1]
