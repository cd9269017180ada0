"""Where a rank's step time goes, by category, to say where a straggler spends its extra time.

Categories: the top-level host ops of the training thread (the thread with the
``ProfilerStep`` ranges), device compute kernels by (short) name, and host time outside
any op while no collective runs (Python code, ``time.sleep``, I/O), each in ms per step.
The straggler's excess is its value less the median of the other ranks, largest first.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from ..trace.kinds import Kind
from ..trace.model import Trace
from ..trace.opnames import kernel_stem
from . import intervals, numeric
from .comm import CommAnalysis
from .steps import StepSegmentation

OUTSIDE_OPS = "(host time outside any op, no collective running: Python code, sleep, I/O)"


@dataclass(frozen=True)
class Excess:
    """Where a straggler spends more time per step than the other ranks."""

    category: str  # an op name, "kernel: NAME" or OUTSIDE_OPS
    ms_per_step: float  # on the straggler
    others_ms_per_step: float  # median of the other ranks
    extra_ms_per_step: float
    events: tuple[int, ...] = ()  # events of this category on the straggler, to locate it in user code
    instants_us: tuple[float, ...] = ()  # or instants inside the longest stretches outside any op
    tid: int | None = None  # the straggler's training thread


def excess(profiles: dict[int, Profile], rank: int, limit: int = 3) -> tuple[Excess, ...]:
    mine = profiles[rank]
    others = [profile.ms for other, profile in profiles.items() if other != rank]
    rows = []
    for category in set(mine.ms).union(*others):
        median = numeric.median([profile.get(category, 0.0) for profile in others])
        extra = mine.ms.get(category, 0.0) - median
        if extra > 0:
            where = mine.where.get(category, ((), ()))
            rows.append(Excess(category, mine.ms.get(category, 0.0), median, extra, where[0], where[1], mine.tid))
    return tuple(sorted(rows, key=lambda row: -row.extra_ms_per_step)[:limit])


@dataclass
class Profile:
    """Time per step of one rank by category, for comparing ranks."""

    ms: dict[str, float]  # ms per step by category
    where: dict[str, tuple[tuple[int, ...], tuple[float, ...]]]  # category -> (events, instants) to locate it
    tid: int | None  # the training thread


def time_profile(trace: Trace, steps: StepSegmentation, comm: CommAnalysis, rank: int) -> Profile:
    """ms per step by category: top-level ops of the training thread, compute kernels, time outside both."""
    own = steps.for_rank(rank)
    profile = Profile(defaultdict(float), {}, None)
    if not own:
        return profile
    count = len(own)
    spans = intervals.union(np.array([s.start_us for s in own]), np.array([s.end_us for s in own]))
    host = trace.mask(Kind.CPU_OP, Kind.USER_ANNOTATION, Kind.DATALOADER, rank=rank)
    step_events = np.flatnonzero(trace.mask(Kind.STEP, rank=rank))
    if len(step_events):
        threads, counts = np.unique(trace.tid[step_events], return_counts=True)
        profile.tid = int(threads[np.argmax(counts)])
        host &= trace.tid == profile.tid
    top = _top_level(trace, np.flatnonzero(host & _inside(trace, spans)))
    for name_id, events in _by_name(trace, top):
        name = trace.names[name_id]
        profile.ms[name] += float(trace.dur[events].sum()) / 1000.0 / count
        profile.where[name] = (tuple(int(i) for i in events[:50]), ())
    kernels = np.flatnonzero(trace.mask(Kind.KERNEL, rank=rank) & _inside(trace, spans))
    for name_id, events in _by_name(trace, kernels):
        profile.ms["kernel: " + kernel_stem(trace.names[name_id])] += float(trace.dur[events].sum()) / 1000.0 / count
    rank_comm = comm.for_rank(rank)
    calls = rank_comm.collectives if rank_comm else ()
    covered = intervals.union(
        np.concatenate([trace.ts[top], [c.start_us for c in calls]]),
        np.concatenate([trace.ts[top] + trace.dur[top], [c.end_us for c in calls]]),
    )
    gaps = _gaps(spans, covered)
    profile.ms[OUTSIDE_OPS] = sum(end - start for start, end in gaps) / 1000.0 / count
    longest = sorted(gaps, key=lambda gap: gap[0] - gap[1])[:20]
    # Locate the stretches that carry the time: a few 60 ms sleeps must outvote many sub-ms gaps between ops.
    if longest:
        floor = 0.25 * (longest[0][1] - longest[0][0])
        longest = [gap for gap in longest if gap[1] - gap[0] >= floor]
    profile.where[OUTSIDE_OPS] = ((), tuple((start + end) / 2 for start, end in longest))
    return profile


def _by_name(trace: Trace, events: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """The events grouped by name id (one sort, no Python loop over events)."""
    if len(events) == 0:
        return []
    order = np.argsort(trace.name[events], kind="stable")
    ordered = events[order]
    ids, starts = np.unique(trace.name[ordered], return_index=True)
    return [(int(name_id), part) for name_id, part in zip(ids, np.split(ordered, starts[1:]))]


def _gaps(spans: tuple[np.ndarray, np.ndarray], covered: tuple[np.ndarray, np.ndarray]) -> list[tuple[float, float]]:
    """The parts of the (disjoint) spans that no covered interval touches."""
    result = []
    starts, ends = covered
    for span_start, span_end in zip(*spans):
        cursor = float(span_start)
        first = max(int(np.searchsorted(ends, span_start, side="right")), 0)
        for start, end in zip(starts[first:], ends[first:]):
            if start >= span_end:
                break
            if start > cursor:
                result.append((cursor, float(start)))
            cursor = max(cursor, float(end))
        if cursor < span_end:
            result.append((cursor, float(span_end)))
    return result


def _inside(trace: Trace, spans: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Events that start inside one of the (disjoint, sorted) spans."""
    position = np.searchsorted(spans[0], trace.ts, side="right") - 1
    valid = position >= 0
    result = np.zeros(len(trace), dtype=bool)
    result[valid] = trace.ts[valid] <= spans[1][position[valid]]
    return result


def _top_level(trace: Trace, events: np.ndarray) -> np.ndarray:
    """The events not nested inside another of ``events`` (one host thread), in time order."""
    ends = trace.ts[events] + trace.dur[events]
    top = events[intervals.outermost(trace.ts[events], ends, np.zeros(len(events), dtype=np.int64))]
    return top[np.argsort(trace.ts[top], kind="stable")]


@dataclass(frozen=True)
class RankLocations:
    """The user-code locations the job-level rules may cite for one rank, found where its trace is loaded.

    A job reduced rank by rank keeps no trace on the driver: each worker locates what the
    job-level rules could cite for its rank (where it issues its costliest collective, and
    each category of its time profile, should it be the straggler) and the rules read them
    from ``Analyses.rank_locations``.
    """

    issued_at: tuple[str, ...]
    by_category: dict[str, tuple[str, ...]]
