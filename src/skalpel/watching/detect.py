"""Anomalies judged online, one step at a time: robust statistics over a rolling window.

``Detector.feed(sample)`` takes each step as it ends and returns the anomalies it shows
(usually none). Step-time kinds judge the step less its DataLoader wait (a stall is
``dataloader_stall``'s alone) and less the time the training thread waited for a core (a busy
machine slows every process on it; the script did not change). The window holds un-profiled steps only: the steps of a capture
(and its analysis) are fed with ``judged=False`` and skipped. Thresholds:
``diagnose/thresholds.py`` (the skalpel watch section); ``skalpel explain <kind>`` documents
each kind. Pure Python, no torch: it runs on the store's writer thread, off the training loop.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

from ..diagnose import thresholds as limits
from ..display import rough_duration

MIB = 2**20
MAD_SCALE = 1.4826  # the MAD of a normal distribution times this is its standard deviation
EVERY = 8  # steps between the judgements over a window (medians of hundreds of steps: too dear for each step)
REFRESH = 32  # steps between refreshes of the window's median and MAD (what spikes and shifts are judged against)
# diagnose/watch.py documents them; slow_rank is judged across the ranks of a job (ranks.py)
KINDS = ("step_spike", "level_shift", "slow_drift", "memory_creep", "dataloader_stall", "slow_rank")


class Sample(NamedTuple):
    """One step as the watcher saw it (a tuple: the writer thread makes one per step, and a frozen dataclass costs a
    setattr per field)."""

    step: int
    end_s: float  # seconds since the run started, at the step's end
    wall_s: float
    loader_s: float
    memory: int | None  # bytes: CUDA allocated when CUDA is in use, else RSS
    runq_s: float | None = None  # time the training thread waited for a core (a busy machine, not the script)
    judged: bool = True  # False: a capture's step, left out of every window


@dataclass(frozen=True)
class Anomaly:
    step: int
    kind: str
    message: str
    value: float  # what was judged (seconds, or bytes gained for memory_creep)
    baseline: float  # what it was judged against


class Detector:
    def __init__(self, *, memory_limit: int | None = None, memory_source: str = "RSS",
                 window: int = limits.WATCH_WINDOW_STEPS, warmup: int = limits.WATCH_WARMUP_STEPS) -> None:  # fmt: skip
        self.window = window
        self.warmup = warmup
        self.memory_limit = memory_limit
        self.memory_source = memory_source
        self.compute: deque[float] = deque(maxlen=window)  # step time less loader wait, judged steps
        self.walls: deque[float] = deque(maxlen=window)
        self.memory: deque[tuple[int, float, int]] = deque(maxlen=window)  # (step, end_s, bytes)
        self.recent_steps = int(limits.LEVEL_SHIFT.param("recent_steps"))
        self.reference: float | None = None  # drift's reference median
        self.stalled: list[int] = []  # consecutive steps over the stall threshold
        self.quiet_since = {"dataloader_stall": 0, "memory_creep": 0}  # judged steps since the kind last held
        self.armed = {"dataloader_stall": True, "memory_creep": True}  # re-armed after a window without it
        self.seen = 0
        # (median, scaled MAD) of the compute window and the median wall step, refreshed every REFRESH steps
        self._stats: tuple[float, float, float] | None = None
        self._spike_at = self._stall_at = 0.0  # the limits those give (set with them)

    def feed(self, sample: Sample) -> list[Anomaly]:
        if not sample.judged:
            self.stalled = []
            return []
        self.seen += 1
        compute = max(sample.wall_s - sample.loader_s - (sample.runq_s or 0.0), 0.0)
        found: list[Anomaly] = []
        if self.seen > self.warmup and len(self.compute) >= self.window // 2:
            if self._stats is None:
                self._window_stats()
            # the cheap path of most steps: two comparisons with the cached limits
            if sample.loader_s >= self._stall_at or self.stalled:
                found += self._rearmed("dataloader_stall", self._stall(sample))
            elif not self.armed["dataloader_stall"]:  # armed: its quiet count matters only once it fires again
                self._rearmed("dataloader_stall", [])
            over_window = self.seen % EVERY == 0
            if compute >= self._spike_at or over_window:
                found += self._step_time(sample.step, compute, over_window=over_window)
            if sample.memory is not None and len(self.memory) == self.window and self.seen % REFRESH == 0:
                found += self._rearmed("memory_creep", self._memory(sample), steps=REFRESH)
        if self.seen > self.warmup:
            self.compute.append(compute)
            self.walls.append(sample.wall_s)
            if sample.memory is not None:
                self.memory.append((sample.step, sample.end_s, sample.memory))
            if self.seen % REFRESH == 0:
                self._stats = None
        return found

    def restart(self) -> None:
        """Judge afresh: the steps seen so far were not training iterations (a stronger signal took over)."""
        self.__init__(memory_limit=self.memory_limit, memory_source=self.memory_source,  # type: ignore[misc]
                      window=self.window, warmup=self.warmup)  # fmt: skip

    def use_device_memory(self, limit: int | None) -> None:
        """The script put memory on a CUDA device: memory is judged there from now on (RSS values are dropped)."""
        self.memory_source, self.memory_limit = "CUDA allocated", limit
        self.memory.clear()

    @property
    def median_step(self) -> float | None:
        """The window's median step (wall time), as last refreshed; None before the window fills."""
        return self._stats[2] if self._stats is not None else None

    def _rearmed(self, kind: str, held: list[Anomaly] | bool, *, steps: int = 1) -> list[Anomaly]:
        """A kind that keeps holding (a loader slow for hours, a steady leak) is one anomaly: said again only
        after a window of steps without it."""
        if held:
            self.quiet_since[kind] = 0
            if self.armed[kind] and isinstance(held, list):
                self.armed[kind] = False
                return held
            return []
        self.quiet_since[kind] += steps
        if self.quiet_since[kind] >= self.window:
            self.armed[kind] = True
        return []

    # -- step time ----------------------------------------------------------------------------
    def _window_stats(self) -> tuple[float, float, float]:
        if self._stats is None:
            values = list(self.compute)
            median = statistics.median(values)
            mad = statistics.median([abs(value - median) for value in values]) * MAD_SCALE
            self._stats = (median, mad, statistics.median(self.walls))
            spike, stall = limits.STEP_SPIKE, limits.DATALOADER_STALL
            self._spike_at = median + max(spike.param("mad_k") * mad, spike.share_pct / 100 * median, spike.floor / 1e3)
            self._stall_at = max(stall.share_pct / 100 * self._stats[2], stall.floor / 1e3)
        return self._stats

    def _step_time(self, step: int, compute: float, *, over_window: bool) -> list[Anomaly]:
        median, mad, _ = self._window_stats()
        if compute >= self._spike_at:
            return [Anomaly(step, "step_spike", f"step {step} took {_ms(compute)} against a median of {_ms(median)} "
                            "(DataLoader wait left out)", compute, median)]  # fmt: skip
        found: list[Anomaly] = []
        if not over_window:
            return found
        if len(self.compute) >= self.recent_steps * 2:
            recent = statistics.median(list(self.compute)[-self.recent_steps :] + [compute])
            shift = limits.LEVEL_SHIFT
            before = median  # the whole window's (refreshed every REFRESH steps): the recent steps are a minority
            if recent - before >= max(shift.param("mad_k") * mad, shift.share_pct / 100 * before, shift.floor / 1e3):
                began = step - self.recent_steps // 2  # the median turns when half the recent steps are slow
                found.append(Anomaly(
                    began, "level_shift",
                    f"steps got slower from about step {began}: median {_ms(recent)} over the "
                    f"last {self.recent_steps} steps against {_ms(before)} before ({recent / before:.2f}x)",
                    recent, before,
                ))  # fmt: skip
                # the new level is the baseline from now on: the window fills again before anything is judged
                self.compute.clear()
                self.reference = None
                self._stats = None
                return found
        if len(self.compute) == self.window:
            current = median
            if self.reference is None:
                self.reference = current
            drift = limits.SLOW_DRIFT
            if current - self.reference >= max(drift.share_pct / 100 * self.reference, drift.floor / 1e3):
                found.append(Anomaly(
                    step, "slow_drift", f"the median step crept from {_ms(self.reference)} to {_ms(current)} "
                    f"({current / self.reference:.2f}x) over the run so far", current, self.reference,
                ))  # fmt: skip
                self.reference = current
        return found

    # -- DataLoader ---------------------------------------------------------------------------
    def _stall(self, sample: Sample) -> list[Anomaly] | bool:
        stall = limits.DATALOADER_STALL
        median_wall = self._window_stats()[2]
        if sample.loader_s < self._stall_at:
            self.stalled = []
            return []
        self.stalled.append(sample.step)
        if len(self.stalled) < int(stall.param("min_steps")):
            return []
        if len(self.stalled) > int(stall.param("min_steps")):
            return True  # still stalled
        first = self.stalled[0]
        return [Anomaly(first, "dataloader_stall", f"from step {first} the loop waits {_ms(sample.loader_s)} for each "
                        f"batch against a median step of {_ms(median_wall)}", sample.loader_s, median_wall)]  # fmt: skip

    # -- memory -------------------------------------------------------------------------------
    def _memory(self, sample: Sample) -> list[Anomaly] | bool:
        creep = limits.MEMORY_CREEP
        points = list(self.memory)
        size = len(points) // 4
        quarters = [statistics.median([value for _, _, value in points[index * size : (index + 1) * size]])
                    for index in range(4)]  # fmt: skip
        floor = creep.floor * MIB
        rise = creep.param("min_rise_pct") / 100 * floor
        gained = quarters[-1] - quarters[0]
        if gained < floor or any(later - earlier < rise for earlier, later in zip(quarters, quarters[1:])):
            return []
        if not self.armed["memory_creep"]:
            return True  # still creeping
        seconds = points[-size // 2][1] - points[size // 2][1]  # between the first and last quarters' middles
        rate = gained / max(seconds, 1e-9)
        message = (f"{self.memory_source} grew {gained / MIB:.0f} MiB over the last {len(points)} steps "
                   f"({rate / MIB:.1f} MiB/s), to {sample.memory / MIB:.0f} MiB")  # fmt: skip
        if self.memory_limit:
            left = (self.memory_limit - (sample.memory or 0)) / rate
            message += f"; at this rate the limit ({self.memory_limit / 2**30:.1f} GiB) is reached in {rough_duration(left)}"
        # the creep began where the window leaves its first quarter's range for good: after the last point at or
        # under that quarter's highest value (a device's allocated bytes swing within a step, and a step's reading
        # is interpolated: the first point above the quarter's median can be the window's first, steps before)
        top = max(value for _, _, value in points[:size])
        last_low = max((index for index, (_, _, value) in enumerate(points) if value <= top), default=-1)
        first = points[min(last_low + 1, len(points) - 1)][0]
        return [Anomaly(first, "memory_creep", message, gained, quarters[0])]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"
