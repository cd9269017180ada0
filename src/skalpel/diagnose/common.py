"""Small helpers the finding families share: steps of a rank, events inside steps, per-step sums."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..analysis import numeric
from ..analysis.steps import Step
from .rule import Context


@dataclass(frozen=True)
class Window:
    """The profiled steps of one rank."""

    rank: int
    steps: tuple[Step, ...]

    @property
    def count(self) -> int:
        return len(self.steps)

    @property
    def mean_step_ms(self) -> float:
        return float(np.mean([step.duration_ms for step in self.steps])) if self.steps else 0.0

    @property
    def median_step_ms(self) -> float:
        """The step time a finding quotes: the report's footer and HTML give the median too."""
        return numeric.median([step.duration_ms for step in self.steps]) if self.steps else 0.0

    @property
    def starts(self) -> np.ndarray:
        return np.array([step.start_us for step in self.steps], dtype=np.float64)

    @property
    def ends(self) -> np.ndarray:
        return np.array([step.end_us for step in self.steps], dtype=np.float64)

    def inside(self, ts_us: np.ndarray) -> np.ndarray:
        """Which instants fall inside one of the steps."""
        return self.step_of(ts_us) >= 0

    def step_of(self, ts_us: np.ndarray) -> np.ndarray:
        """Position (0-based, in time order) of the step containing each instant; -1 outside."""
        starts, ends = self.starts, self.ends
        order = np.argsort(starts)
        starts, ends = starts[order], ends[order]
        index = np.searchsorted(starts, ts_us, side="right") - 1
        valid = index >= 0
        valid[valid] = ts_us[valid] < ends[index[valid]]
        return np.where(valid, index, -1)


def windows(ctx: Context) -> list[Window]:
    """One window per rank that has steps."""
    result = []
    for rank in ctx.trace.rank_ids:
        steps = tuple(ctx.steps.for_rank(rank))
        if steps:
            result.append(Window(rank, steps))
    return result


def events_of(ctx: Context, window: Window, mask: np.ndarray) -> np.ndarray:
    """Indices of events selected by ``mask`` on the window's rank that start inside its steps."""
    trace = ctx.trace
    events = np.flatnonzero(mask & (trace.rank == window.rank))
    return events[window.inside(trace.ts[events])]


def pct(part: float, whole: float) -> float:
    return 100.0 * part / whole if whole > 0 else 0.0


def first(events: np.ndarray, count: int = 5) -> list[int]:
    """A few event indices, as evidence a user can look up."""
    return [int(index) for index in events[:count]]


def named_at(label: str, location: str | None) -> str:
    """A cause and its line: "augment() in train.py:12 at train.py:15 in augment"; the label alone when it already
    names that line ("<listcomp> in train.py:30" located at train.py:30) or there is no line."""
    if not location:
        return label
    line = location.split(" in ", 1)[0]
    return label if line in label else f"{label} at {location}"
