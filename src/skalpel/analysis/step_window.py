"""The profiled steps of one rank as a window: which instants fall inside them, and in which step."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import numeric
from .steps import Step


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
