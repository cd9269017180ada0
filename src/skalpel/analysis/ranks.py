"""Ranks side by side: aligned clocks, time spent waiting in collectives, and the straggler.

Clocks of different hosts are not trusted raw. A synchronising collective (all_reduce,
all_gather, reduce_scatter, all_to_all, barrier) ends at nearly the same true time on
every rank, so each host's clock offset against the reference rank's is the median
difference of the ends of matching collectives (pooled over the host's ranks, and kept
within what causality allows). Ranks whose header names the reference's host share its
clock: there, end times only add scheduler noise (ms on a loaded CPU). Collectives
are matched per type on the sequence of their message sizes (difflib), so a rank that
misses a few (a sampled trace, a cut-off capture) still matches on the rest; all_to_all
and point-to-point calls, whose sizes differ per rank, match in order when the counts agree.

On the aligned clocks, a rank that reaches a collective before the last rank does waits:
its wait is the time from its start to the last rank's start (at most its duration). The
straggler is the rank the others wait for: the least wait of its own, and the most often
the last to arrive. ``excess`` says where its extra time goes: top-level host ops on the
training thread, device compute kernels, or host time outside any op while no collective
runs (Python code, ``time.sleep``, I/O), each per step against the median of the others.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from ..trace.model import Trace
from . import numeric
from .collectives import SYNCHRONISING, Collective, busbw_factor
from .comm import CommAnalysis
from .rankcheck import consistency_warnings
from .rankprofile import OUTSIDE_OPS, Excess, Profile, excess, time_profile  # noqa: F401 - OUTSIDE_OPS re-exported
from .steps import StepSegmentation


@dataclass(frozen=True)
class RankTiming:
    """One rank's step, communication and waiting times on the aligned clocks."""

    rank: int
    steps: int
    step_ms: float  # median step time
    comm_ms_per_step: float
    wait_ms_per_step: float  # in collectives, waiting for later ranks
    busy_ms_per_step: float  # step time less the wait
    clock_offset_us: float  # subtracted from this rank's times to align them with the reference
    clock: str  # "reference", "same host" (one clock), "aligned" (estimated) or "raw" (nothing to align on)
    matched_collectives: int  # of this rank's collectives, matched to the reference rank's
    last_arrivals: int  # matched collectives this rank reached last
    transfer_busbw_gbps: dict[str, float] = field(default_factory=dict)  # by type, without the wait (nccl-tests busbw)


@dataclass(frozen=True)
class Straggler:
    """The rank the others wait for, and where its extra time goes."""

    rank: int
    own_wait_ms_per_step: float
    others_wait_ms_per_step: float  # median wait of the other ranks
    imposed_wait_ms_per_step: float  # others' median wait less its own
    last_arrival_pct: float  # of matched collectives (with 2+ ranks) where it arrived last
    step_ms: float  # median step time of the job
    excess: tuple[Excess, ...]  # where its extra time goes, largest first


@dataclass(frozen=True)
class RankComparison:
    """Ranks side by side: clocks, waits and the straggler."""

    reference_rank: int
    ranks: tuple[RankTiming, ...]
    matched_groups: int  # collectives matched across 2+ ranks
    aligned: bool  # every rank's clock is the reference's host clock or aligned on matched collectives
    straggler: Straggler | None  # the rank the others wait for most; None with < 2 matched ranks
    warnings: tuple[str, ...]  # mixed runs, missing ranks, different step counts
    _shared: "_Shared | None" = field(default=None, compare=False, repr=False)

    def arrivals_of(self, rank: int) -> list[tuple[Collective, float, int]]:
        """Each matched collective (2+ ranks) of one rank: (its call, the last rank's start on this rank's clock,
        the rank that arrived last), in order."""
        shared = self._shared
        if shared is None:
            return []
        offset = shared.offsets.get(rank, 0.0)
        groups, latest, last = shared.groups, shared.latest, shared.last_rank
        return [(groups[index][rank], latest[index] + offset, last[index]) for index in shared.matched.get(rank, ())]

    @cached_property
    def _by_rank(self) -> dict[int, RankTiming]:
        return {timing.rank: timing for timing in self.ranks}

    def summary_of(self, rank: int) -> dict:
        """Plain-JSON figures of one rank for RankReport.extra['distributed'] (the per-rank comparison)."""
        timing = self._by_rank.get(rank)
        if timing is None:
            return {}
        straggler = self.straggler
        return {
            "step_ms": round(timing.step_ms, 4),
            "comm_ms_per_step": round(timing.comm_ms_per_step, 4),
            "wait_ms_per_step": round(timing.wait_ms_per_step, 4),
            "busy_ms_per_step": round(timing.busy_ms_per_step, 4),
            "clock_offset_us": round(timing.clock_offset_us, 2),
            "clock": timing.clock,
            "matched_collectives": timing.matched_collectives,
            "last_arrivals": timing.last_arrivals,
            "straggler_candidate": straggler is not None and straggler.rank == rank,
            "transfer_busbw_gbps": {kind: round(value, 4) for kind, value in timing.transfer_busbw_gbps.items()},
        }


def compare_ranks(
    trace: Trace, steps: StepSegmentation, comm: CommAnalysis, *, profiles: dict[int, Profile] | None = None
) -> RankComparison:
    """Compare the ranks of one job; meaningful from two ranks on.

    ``profiles`` (rank -> ``time_profile``) are given when the ranks were reduced one by one
    (``skalpel.job.join``); ``trace`` then only needs ``ranks`` and ``rank_ids``.
    """
    by_rank = {item.rank: list(item.collectives) for item in comm.ranks}
    rank_ids = trace.rank_ids
    reference = rank_ids[0]
    hosts = {info.rank: info.host for info in trace.ranks}
    groups = _match(by_rank, reference)
    offsets = _offsets(groups, reference, hosts)
    waits, last = _waits(groups, offsets)
    shared = _Shared(groups, offsets, waits, last, hosts, reference)
    timings = tuple(_timing(steps, comm, rank, shared) for rank in rank_ids)
    usable = [g for g in groups if len(g) >= 2]
    warnings = consistency_warnings(trace, steps, {t.rank: (t.matched_collectives, len(by_rank[t.rank])) for t in timings})
    return RankComparison(
        reference_rank=reference,
        ranks=timings,
        matched_groups=len(usable),
        aligned=all(t.clock != "raw" for t in timings),
        straggler=_straggler(trace, steps, comm, timings, len(usable), profiles) if len(timings) >= 2 else None,
        warnings=warnings,
        _shared=shared,
    )


_UNEVEN = frozenset({"all_to_all", "send_recv", "gather", "scatter"})  # sizes legitimately differ across ranks


def _match(by_rank: dict[int, list[Collective]], reference: int) -> list[dict[int, Collective]]:
    """Groups of matching collectives: {rank: collective}, keyed on the reference rank's ones."""
    groups: dict[tuple[str, int], dict[int, Collective]] = {}
    for kind in sorted({c.type for calls in by_rank.values() for c in calls}):
        ref_calls = [c for c in by_rank.get(reference, []) if c.type == kind]
        for position, call in enumerate(ref_calls):
            groups[(kind, position)] = {reference: call}
        ref_keys = [c.nbytes for c in ref_calls]
        for rank, calls in by_rank.items():
            if rank == reference:
                continue
            mine = [c for c in calls if c.type == kind]
            for position, other in _pairs(kind, ref_keys, mine):
                groups[(kind, position)][rank] = other
    return list(groups.values())


def _pairs(kind: str, ref_keys: list[int], mine: list[Collective]) -> list[tuple[int, Collective]]:
    """(reference position, collective): in order when sizes may differ per rank, else on equal sizes.

    difflib costs the product of the lengths on sizes that repeat (every step's all_reduce of one
    bucket), so the common head and tail are paired first, in order, and only what lies between
    goes to it: a rank that recorded the reference's sequence costs its length (a job's usual case).
    """
    if kind in _UNEVEN and len(mine) == len(ref_keys):
        return list(enumerate(mine))  # uneven all_to_all splits: each rank moves its own byte count
    keys = [c.nbytes for c in mine]
    if keys == ref_keys:
        return list(enumerate(mine))
    head = 0
    while head < len(keys) and head < len(ref_keys) and keys[head] == ref_keys[head]:
        head += 1
    tail = 0
    while tail < len(keys) - head and tail < len(ref_keys) - head and keys[-1 - tail] == ref_keys[-1 - tail]:
        tail += 1
    import difflib  # here: a one-rank analysis never needs it (1-2 ms of `skalpel analyze`'s start)

    matcher = difflib.SequenceMatcher(None, ref_keys[head : len(ref_keys) - tail], keys[head : len(keys) - tail], autojunk=False)
    middle = [
        (head + block.a + step, mine[head + block.b + step]) for block in matcher.get_matching_blocks() for step in range(block.size)
    ]
    end = [(len(ref_keys) - tail + step, mine[len(keys) - tail + step]) for step in range(tail)]
    return [(position, mine[position]) for position in range(head)] + middle + end


def _offsets(groups: list[dict[int, Collective]], reference: int, hosts: dict[int, str | None]) -> dict[int, float]:
    """Clock offset of each rank against the reference, pooled over the ranks of one host.

    Ranks on the reference's host share its clock (offset 0). For other hosts: the median
    difference of matched collective ends, kept inside what causality allows (no rank
    finishes a collective before every rank has started it).
    """
    pools: dict[object, list[int]] = defaultdict(list)
    for rank in {rank for group in groups for rank in group}:
        host = hosts.get(rank)
        pools[host if host is not None else ("rank", rank)].append(rank)
    pool_of = {rank: key for key, ranks in pools.items() for rank in ranks}
    reference_host = hosts.get(reference)
    estimated = {
        key for key, ranks in pools.items()
        if reference not in ranks and not (reference_host is not None and hosts.get(ranks[0]) == reference_host)
    }  # fmt: skip
    bounds = _Bounds.over(groups, reference, {rank: pool_of[rank] for rank in pool_of if pool_of[rank] in estimated})
    offsets: dict[int, float] = {}
    for key, ranks in pools.items():
        value = bounds[key].estimate() if key in bounds else (None if key in estimated else 0.0)
        if value is not None:
            offsets.update({rank: value for rank in ranks})
    return offsets


class _Bounds:
    """One pool's differences of matched collective ends against the reference, and what causality allows."""

    def __init__(self) -> None:
        self.diffs: list[float] = []
        self.low, self.high = -np.inf, np.inf

    @classmethod
    def over(cls, groups: list[dict[int, Collective]], reference: int, pool_of: dict[int, object]) -> dict[object, _Bounds]:
        """Every estimated pool's bounds, in one pass over the groups: O(ranks x collectives)."""
        found: dict[object, _Bounds] = {}
        for group in groups:
            ref = group[reference]
            if ref.type not in SYNCHRONISING:
                continue
            for rank, call in group.items():
                key = pool_of.get(rank)
                if key is None:
                    continue
                bounds = found.get(key) or found.setdefault(key, cls())
                bounds.diffs.append(call.end_us - ref.end_us)
                low, high = call.start_us - ref.end_us, call.end_us - ref.start_us
                if low > bounds.low:  # max() and min() as comparisons: this runs ranks x collectives times
                    bounds.low = low
                if high < bounds.high:
                    bounds.high = high
        return found

    def estimate(self) -> float:
        value = numeric.median(self.diffs)
        return float(np.clip(value, self.low, self.high)) if self.low <= self.high else value


def _waits(groups: list[dict[int, Collective]], offsets: dict[int, float]) -> tuple[dict[int, float], dict[int, int]]:
    """Total wait (us) and count of last arrivals per rank, on aligned clocks."""
    wait: dict[int, float] = defaultdict(float)
    last: dict[int, int] = defaultdict(int)
    for group in groups:
        if len(group) < 2:
            continue
        starts = {rank: call.start_us - offsets.get(rank, 0.0) for rank, call in group.items()}
        latest = max(starts.values())
        for rank, call in group.items():  # min(max(latest - start, 0), duration), as comparisons: ranks x collectives
            gap = latest - starts[rank]
            if 0.0 > gap:
                gap = 0.0
            duration = call.end_us - call.start_us
            if duration < gap:
                gap = duration
            wait[rank] += gap
        last[max(starts, key=starts.get)] += 1
    return wait, last


@dataclass
class _Shared:
    """What every rank's timing reads of the job, worked out once: per rank, only its own groups are visited."""

    groups: list[dict[int, Collective]]
    offsets: dict[int, float]
    waits: dict[int, float]
    last: dict[int, int]
    hosts: dict[int, str | None]
    reference: int
    factors: dict[tuple[str, int], float] = field(default_factory=dict)  # busbw factor by (type, group size)

    @cached_property
    def latest(self) -> list[float]:
        """Each group's last aligned start (matched groups of 2+ ranks; NaN for the others)."""
        offsets = self.offsets
        return [
            max(call.start_us - offsets.get(rank, 0.0) for rank, call in group.items()) if len(group) >= 2 else np.nan
            for group in self.groups
        ]

    @cached_property
    def last_rank(self) -> list[int]:
        """Each group's last rank to arrive on the aligned clocks (matched groups of 2+ ranks; -1 for the others)."""
        offsets = self.offsets
        return [
            max(group, key=lambda rank: group[rank].start_us - offsets.get(rank, 0.0)) if len(group) >= 2 else -1
            for group in self.groups
        ]

    @cached_property
    def matched(self) -> dict[int, list[int]]:
        """rank -> the indices of the matched groups (2+ ranks) it takes part in, in order."""
        found: dict[int, list[int]] = defaultdict(list)
        for index, group in enumerate(self.groups):
            if len(group) >= 2:
                for rank in group:
                    found[rank].append(index)
        return found


def _transfer_busbw(shared: _Shared, rank: int) -> dict[str, float]:
    """Bus bandwidth by type over the time after the last rank arrived: the transfer, not the wait."""
    moved: dict[str, float] = defaultdict(float)
    spent: dict[str, float] = defaultdict(float)
    offset = shared.offsets.get(rank, 0.0)
    groups, latest, factors = shared.groups, shared.latest, shared.factors
    for index in shared.matched.get(rank, ()):
        call = groups[index][rank]
        if call.nbytes <= 0:
            continue
        start = latest[index] + offset
        if call.start_us > start:
            start = call.start_us
        transfer = call.end_us - start
        if transfer > 0:
            key = (call.type, call.group_size)
            factor = factors.get(key)
            if factor is None:
                factor = factors[key] = busbw_factor(call.type, call.group_size)
            moved[call.type] += call.nbytes * factor
            spent[call.type] += transfer
    return {kind: moved[kind] / spent[kind] / 1e3 for kind in moved}


def _timing(steps: StepSegmentation, comm: CommAnalysis, rank: int, shared: _Shared) -> RankTiming:
    own = steps.for_rank(rank)
    count = max(len(own), 1)
    step_ms = numeric.median([s.duration_ms for s in own]) if own else 0.0
    rank_comm = comm.for_rank(rank)
    wait_ms = shared.waits.get(rank, 0.0) / count / 1000.0
    return RankTiming(
        rank=rank,
        steps=len(own),
        step_ms=step_ms,
        comm_ms_per_step=rank_comm.comm_ms_per_step if rank_comm else 0.0,
        wait_ms_per_step=wait_ms,
        busy_ms_per_step=max(step_ms - wait_ms, 0.0),
        clock_offset_us=shared.offsets.get(rank, 0.0),
        clock=_clock_source(shared, rank),
        matched_collectives=len(shared.matched.get(rank, ())),
        last_arrivals=shared.last.get(rank, 0),
        transfer_busbw_gbps=_transfer_busbw(shared, rank),
    )


def _clock_source(shared: _Shared, rank: int) -> str:
    hosts, reference = shared.hosts, shared.reference
    if rank == reference:
        return "reference"
    if hosts.get(rank) is not None and hosts.get(rank) == hosts.get(reference):
        return "same host"
    return "aligned" if rank in shared.offsets else "raw"


def _straggler(trace, steps, comm, timings, matched, profiles) -> Straggler | None:
    if matched == 0:
        return None
    candidate = min(timings, key=lambda t: (t.wait_ms_per_step, -t.last_arrivals))
    others = [t for t in timings if t.rank != candidate.rank]
    others_wait = numeric.median([t.wait_ms_per_step for t in others])
    if profiles is None:
        profiles = {t.rank: time_profile(trace, steps, comm, t.rank) for t in timings}
    return Straggler(
        rank=candidate.rank,
        own_wait_ms_per_step=candidate.wait_ms_per_step,
        others_wait_ms_per_step=others_wait,
        imposed_wait_ms_per_step=max(others_wait - candidate.wait_ms_per_step, 0.0),
        last_arrival_pct=100.0 * candidate.last_arrivals / matched,
        step_ms=numeric.median([t.step_ms for t in timings]),
        excess=excess(profiles, candidate.rank),
    )
