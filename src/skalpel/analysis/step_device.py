"""The device's share of each step: how long the device works inside every step, per rank.

HTA's temporal breakdown (``gpu_time``) spans the first to the last device event, so a
step in which the device works 11 us of 33 ms reads as 99.99% compute when those are the
only kernels. Findings and the terminal summary judge the step the user waits for: per
step, the union of device events (kernels, copies, memsets, streams merged) clipped to
the step, against the step's duration. Without ProfilerStep markers the one pseudo-step
is the whole window (first to last host op), and ``marked`` says so.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..trace.model import Trace
from . import intervals, numeric
from .timeline import device_busy, device_events
from .steps import StepSegmentation


@dataclass(frozen=True)
class RankStepDevice:
    """How busy one rank's device is in each step."""

    rank: int
    step_ms: tuple[float, ...]  # each step's duration, in time order
    busy_ms: tuple[float, ...]  # device busy time inside each step (streams merged)

    @property
    def steps(self) -> int:
        return len(self.step_ms)

    @property
    def mean_step_ms(self) -> float:
        return sum(self.step_ms) / self.steps if self.steps else 0.0

    @property
    def median_step_ms(self) -> float:
        """The step time findings quote: the same statistic as the report's footer and HTML (the median)."""
        return numeric.median(self.step_ms) if self.steps else 0.0

    @property
    def idle_ms(self) -> tuple[float, ...]:
        return tuple(max(step - busy, 0.0) for step, busy in zip(self.step_ms, self.busy_ms))

    @property
    def idle_pct_by_step(self) -> tuple[float, ...]:
        return tuple(100.0 * idle / step if step > 0 else 0.0 for idle, step in zip(self.idle_ms, self.step_ms))

    @property
    def idle_pct(self) -> float:
        """Idle share of all steps together."""
        total = sum(self.step_ms)
        return 100.0 * sum(self.idle_ms) / total if total > 0 else 0.0

    @property
    def busy_pct(self) -> float:
        return 100.0 - self.idle_pct if sum(self.step_ms) > 0 else 0.0

    @property
    def idle_ms_per_step(self) -> float:
        return sum(self.idle_ms) / self.steps if self.steps else 0.0

    def steps_idle_at_least(self, share_pct: float) -> float:
        """Share of the steps (in %) whose own idle share reaches ``share_pct``: is the pattern consistent?"""
        shares = self.idle_pct_by_step
        return 100.0 * sum(share >= share_pct for share in shares) / len(shares) if shares else 0.0

    def to_dict(self) -> dict[str, float]:
        return {"steps": self.steps, "busy_pct": self.busy_pct, "idle_pct": self.idle_pct,
                "idle_ms_per_step": self.idle_ms_per_step}  # fmt: skip


@dataclass(frozen=True)
class StepDeviceResult:
    """Device busy share in the steps of every rank."""

    ranks: dict[int, RankStepDevice | None]  # None: no steps or no device work on that rank
    marked: bool  # False: each rank's one pseudo-step is its whole window

    def for_rank(self, rank: int) -> RankStepDevice | None:
        return self.ranks.get(rank)


def device_in_steps(trace: Trace, steps: StepSegmentation) -> StepDeviceResult | None:
    """Device busy time inside every step, per rank; None when the trace has no device work."""
    if not trace.has_device:
        return None
    ranks: dict[int, RankStepDevice | None] = {}
    for rank in trace.rank_ids:
        rank_steps = sorted(steps.for_rank(rank), key=lambda step: step.start_us)
        if len(device_events(trace, rank)) == 0 or not rank_steps:
            ranks[rank] = None
            continue
        busy_us = intervals.busy_between(device_busy(trace, rank), np.array([step.start_us for step in rank_steps]),
                                         np.array([step.end_us for step in rank_steps]))  # fmt: skip
        ranks[rank] = RankStepDevice(
            rank=rank,
            step_ms=tuple(step.duration_ms for step in rank_steps),
            busy_ms=tuple(float(us) / 1000.0 for us in busy_us),
        )
    return StepDeviceResult(ranks=ranks, marked=steps.marked)
