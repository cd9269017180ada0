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
from typing import Sequence

import numpy as np

from ..trace.model import RankInfo
from . import numeric
from .collectives import SYNCHRONISING, Collective, busbw_factor
from .comm import CommAnalysis
from .rankcheck import consistency_warnings
from .rankprofile import OUTSIDE_OPS, Excess, Profile, excess  # noqa: F401 - OUTSIDE_OPS re-exported
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
class Arrivals:
    """A rank's matched collectives (2+ ranks) as columns, sorted by start (``RankComparison.arrivals``): each
    call's start, end, rank and event, the last rank's start on this rank's clock, and the rank that arrived last."""

    start: np.ndarray
    end: np.ndarray
    rank: np.ndarray
    event: np.ndarray
    latest: np.ndarray
    last: np.ndarray

    @classmethod
    def of(cls, items) -> Arrivals:
        """From (collective, last start, last rank) triples, in any order."""
        items = sorted(items, key=lambda item: item[0].start_us)
        calls = [call for call, _, _ in items]
        return cls(np.array([call.start_us for call in calls], np.float64), np.array([call.end_us for call in calls], np.float64),
                   np.array([call.rank for call in calls], np.int64), np.array([call.event for call in calls], np.int64),
                   np.array([latest for _, latest, _ in items], np.float64), np.array([last for _, _, last in items], np.int64))  # fmt: skip


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
        if shared is None or rank not in shared.members:
            return []
        groups, indices = shared.matched_of(rank)
        calls, offset = shared.calls[rank].calls, shared.offsets.get(rank, 0.0)
        latest, last = (shared.latest[groups] + offset).tolist(), shared.last_rank[groups].tolist()
        return [(calls[index], start, late) for index, start, late in zip(indices.tolist(), latest, last)]

    def arrivals(self, rank: int) -> Arrivals:
        """``arrivals_of`` as columns sorted by start, without a Python object per collective (the join asks
        every rank's)."""
        shared = self._shared
        if shared is None or rank not in shared.members:
            return Arrivals.of(())
        groups, indices = shared.matched_of(rank)
        calls = shared.calls[rank]
        order = np.argsort(calls.start[indices], kind="stable")  # as sorted() orders them: ties kept
        groups, indices = groups[order], indices[order]
        return Arrivals(calls.start[indices], calls.end[indices], calls.rank[indices], calls.event[indices],
                        shared.latest[groups] + shared.offsets.get(rank, 0.0), shared.last_rank[groups])  # fmt: skip

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
    ranks: Sequence[RankInfo], steps: StepSegmentation, comm: CommAnalysis, *, profiles: dict[int, Profile],
    indexed: "IndexedRanks | None" = None,
) -> RankComparison:
    """Compare the ranks of one job (``ranks``: what each rank's file says of it); meaningful from two ranks on.

    ``profiles``: rank -> its ``time_profile``, made where its trace was reduced (``skalpel.job.rank``).
    ``indexed``: the ranks' collectives already indexed by type, and matched where the reference was known, as
    their summaries arrived.
    """
    by_rank = {item.rank: item.collectives for item in comm.ranks}
    rank_ids = [info.rank for info in ranks]
    reference = rank_ids[0]
    hosts = {info.rank: info.host for info in ranks}
    known = indexed or IndexedRanks()
    calls = {rank: _Calls(items, known.indices.get(rank)) for rank, items in by_rank.items()}
    groups = _match(calls, reference, known.pairs if known.reference == reference else {})
    offsets = _offsets(groups, calls, hosts)
    shared = _Shared(groups, calls, offsets, hosts)
    timings = tuple(_timing(steps, comm, rank, shared) for rank in rank_ids)
    matched = int(shared.matched.sum())
    warnings = consistency_warnings(ranks, steps, {t.rank: (t.matched_collectives, len(by_rank[t.rank])) for t in timings})
    return RankComparison(
        reference_rank=reference,
        ranks=timings,
        matched_groups=matched,
        aligned=all(t.clock != "raw" for t in timings),
        straggler=_straggler(timings, matched, profiles) if len(timings) >= 2 else None,
        warnings=warnings,
        _shared=shared,
    )


_UNEVEN = frozenset({"all_to_all", "send_recv", "gather", "scatter"})  # sizes legitimately differ across ranks


@dataclass(frozen=True)
class CallIndex:
    """A rank's collectives by type, without their times: what matching reads (``_match``). Moving a rank onto
    the job's clock leaves it as it is, so the join makes it as the rank's summary arrives."""

    types: list[str]  # sorted
    type_codes: np.ndarray  # per call, into types
    nbytes: np.ndarray
    of_type: dict[str, np.ndarray]  # type -> its calls' indices, in order


def index_calls(calls) -> CallIndex:
    """``calls`` (``Collective``s in time order, or the driver's columns, ``job.transfer.PackedCollectives``) by type."""
    column = getattr(calls, "column", None)
    if column is not None:
        types, type_codes, nbytes = list(calls.types), calls.type_codes.astype(np.int64), column("nbytes")
    else:
        nbytes = np.array([c.nbytes for c in calls], np.int64)
        names = [c.type for c in calls]
        types = sorted(set(names))
        code_of = {kind: code for code, kind in enumerate(types)}
        type_codes = np.array([code_of[kind] for kind in names], np.int64)
    of_type = {kind: np.flatnonzero(type_codes == code) for code, kind in enumerate(types)}
    return CallIndex(types, type_codes, nbytes, of_type)


Pairs = tuple[np.ndarray, np.ndarray]
"""A rank's matched collectives: the reference's group numbers (increasing) and its own call indices."""


@dataclass
class IndexedRanks:
    """What the join worked out of each rank as its summary arrived: its ``CallIndex``, and its pairs with the
    reference rank's collectives (``reference``; None until known), which only a rank's own sizes decide."""

    indices: dict[int, CallIndex] = field(default_factory=dict)
    reference: int | None = None
    pairs: dict[int, Pairs | None] = field(default_factory=dict)  # rank -> pairs (None: none matched)

    def add(self, rank: int, index: CallIndex) -> None:
        self.indices[rank] = index
        if self.reference is None or rank < self.reference:  # the job's lowest rank so far: the reference
            self.reference, self.pairs = rank, {}  # those matched to another are matched again once all are in
        self.pairs[rank] = member_pairs(self.indices[self.reference], index, rank == self.reference)


class _Calls:
    """One rank's collectives as arrays (in time order): the comparison works on whole ranks at numpy speed,
    not call by call (a 1 GB rank has some 50,000 collectives, a job 1,000 ranks)."""

    __slots__ = ("calls", "start", "end", "nbytes", "group_size", "rank", "event", "types", "type_codes", "of_type")

    def __init__(self, calls: tuple[Collective, ...], index: CallIndex | None = None) -> None:
        self.calls = calls
        column = getattr(calls, "column", None)  # a job's driver holds them as columns (job.transfer.PackedCollectives)
        if column is not None:
            self.start, self.end, self.group_size, self.rank, self.event = (
                column(name) for name in ("start_us", "end_us", "group_size", "rank", "event"))
        else:
            self.start = np.array([c.start_us for c in calls], np.float64)
            self.end = np.array([c.end_us for c in calls], np.float64)
            self.group_size = np.array([c.group_size for c in calls], np.int64)
            self.rank = np.array([c.rank for c in calls], np.int64)
            self.event = np.array([c.event for c in calls], np.int64)
        index = index if index is not None else index_calls(calls)
        self.types, self.type_codes, self.nbytes, self.of_type = index.types, index.type_codes, index.nbytes, index.of_type


@dataclass
class _Groups:
    """Matching collectives of every rank. A group is one of the reference rank's calls: groups are numbered
    type by type (sorted), in the reference's order; each rank's members pair group numbers with its calls."""

    reference: int
    count: int
    synchronising: np.ndarray  # per group: of a type that ends at nearly one true time on every rank
    ref_start: np.ndarray  # per group: the reference's call
    ref_end: np.ndarray
    members: dict[int, tuple[np.ndarray, np.ndarray]]  # rank -> (group numbers, increasing; its call indices)


def _match(calls: dict[int, _Calls], reference: int, known: dict[int, Pairs | None]) -> _Groups:
    """Each rank's collectives matched to the reference rank's, type by type (``known``: ranks already matched)."""
    empty = _Calls(())
    ref = calls.get(reference, empty)
    kinds = sorted({kind for rank_calls in calls.values() for kind in rank_calls.types})
    count = sum(len(ref.of_type.get(kind, ())) for kind in kinds)
    ref_order = np.concatenate([ref.of_type.get(kind, np.zeros(0, np.int64)) for kind in kinds] or [np.zeros(0, np.int64)])
    synchronising = np.concatenate([np.full(len(ref.of_type.get(kind, ())), kind in SYNCHRONISING) for kind in kinds] or [np.zeros(0, bool)])
    members: dict[int, Pairs] = {}
    for rank in [reference] + [rank for rank in calls if rank != reference]:  # the reference first: ties go to it
        pairs = known[rank] if rank in known else member_pairs(ref, calls.get(rank, empty), rank == reference)
        if pairs is not None:
            members[rank] = pairs
    return _Groups(reference, count, synchronising.astype(bool), ref.start[ref_order], ref.end[ref_order], members)


def member_pairs(ref: CallIndex | _Calls, mine: CallIndex | _Calls, is_reference: bool) -> Pairs | None:
    """One rank's collectives paired with the reference's (``Pairs``), type by type; None when none pairs.

    Groups are numbered type by type (sorted), so a type's first group number counts the reference's calls of
    the types before it: the reference's own types and sizes decide them, whatever the other ranks hold."""
    bases, count = {}, 0
    for kind in sorted(ref.of_type):
        bases[kind] = count
        count += len(ref.of_type[kind])
    found_groups, found_calls = [], []
    for kind, indices in mine.of_type.items():
        ref_indices = ref.of_type.get(kind)
        if ref_indices is None:
            continue
        if is_reference:
            positions = chosen = np.arange(len(indices))
        else:
            positions, chosen = _pairs(kind, ref.nbytes[ref_indices], mine.nbytes[indices])
        found_groups.append(bases[kind] + positions)
        found_calls.append(indices[chosen])
    if found_groups:
        groups, indices = np.concatenate(found_groups), np.concatenate(found_calls)  # types in order: increasing
        if len(groups):
            return groups, indices
    return None


def _pairs(kind: str, ref_keys: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(reference positions, own positions) of the paired calls of one type: in order when sizes may differ
    per rank, else on equal sizes.

    difflib costs the product of the lengths on sizes that repeat (every step's all_reduce of one
    bucket), so the common head and tail are paired first, in order, and only what lies between
    goes to it: a rank that recorded the reference's sequence costs its length (a job's usual case).
    """
    if len(keys) == len(ref_keys) and (kind in _UNEVEN or np.array_equal(keys, ref_keys)):
        every = np.arange(len(keys))  # uneven all_to_all splits: each rank moves its own byte count
        return every, every
    shorter = min(len(keys), len(ref_keys))
    differ = np.flatnonzero(keys[:shorter] != ref_keys[:shorter])
    head = int(differ[0]) if len(differ) else shorter
    rest = shorter - head
    differ = np.flatnonzero(keys[len(keys) - rest :][::-1] != ref_keys[len(ref_keys) - rest :][::-1])
    tail = int(differ[0]) if len(differ) else rest
    import difflib  # here: a one-rank analysis never needs it (1-2 ms of `skalpel analyze`'s start)

    matcher = difflib.SequenceMatcher(
        None, ref_keys[head : len(ref_keys) - tail].tolist(), keys[head : len(keys) - tail].tolist(), autojunk=False
    )
    blocks = [block for block in matcher.get_matching_blocks() if block.size]
    ref_positions = [np.arange(head)] + [head + block.a + np.arange(block.size) for block in blocks]
    own_positions = [np.arange(head)] + [head + block.b + np.arange(block.size) for block in blocks]
    ref_positions.append(np.arange(len(ref_keys) - tail, len(ref_keys)))
    own_positions.append(np.arange(len(keys) - tail, len(keys)))
    return np.concatenate(ref_positions), np.concatenate(own_positions)


def _offsets(groups: _Groups, calls: dict[int, _Calls], hosts: dict[int, str | None]) -> dict[int, float]:
    """Clock offset of each rank against the reference, pooled over the ranks of one host.

    Ranks on the reference's host share its clock (offset 0). For other hosts: the median
    difference of matched collective ends, kept inside what causality allows (no rank
    finishes a collective before every rank has started it).
    """
    reference = groups.reference
    pools: dict[object, list[int]] = defaultdict(list)
    for rank in groups.members:
        host = hosts.get(rank)
        pools[host if host is not None else ("rank", rank)].append(rank)
    reference_host = hosts.get(reference)
    offsets: dict[int, float] = {}
    for key, ranks in pools.items():
        if reference in ranks or (reference_host is not None and hosts.get(ranks[0]) == reference_host):
            offsets.update({rank: 0.0 for rank in ranks})
            continue
        value = _pool_offset(groups, calls, ranks)
        if value is not None:
            offsets.update({rank: value for rank in ranks})
    return offsets


def _pool_offset(groups: _Groups, calls: dict[int, _Calls], ranks: list[int]) -> float | None:
    """The median difference of one pool's synchronising collective ends against the reference's, kept within
    causality; None when the pool has no synchronising collective matched."""
    diffs, low, high = [], -np.inf, np.inf
    for rank in ranks:
        members, indices = groups.members[rank]
        synchronising = groups.synchronising[members]
        if not synchronising.any():
            continue
        members, indices = members[synchronising], indices[synchronising]
        start, end = calls[rank].start[indices], calls[rank].end[indices]
        diffs.append(end - groups.ref_end[members])
        low = max(low, float((start - groups.ref_end[members]).max()))
        high = min(high, float((end - groups.ref_start[members]).min()))
    if not diffs:
        return None
    value = numeric.median(np.concatenate(diffs))
    return float(np.clip(value, low, high)) if low <= high else value


class _Shared:
    """What every rank's timing reads of the job, worked out once for all groups: their sizes, the last
    aligned start and the rank that arrived last; per rank, only its own groups are read."""

    def __init__(self, groups: _Groups, calls: dict[int, _Calls], offsets: dict[int, float], hosts: dict[int, str | None]) -> None:
        self.members, self.calls, self.offsets, self.hosts, self.reference = groups.members, calls, offsets, hosts, groups.reference
        sizes = np.zeros(groups.count, np.int64)
        latest = np.full(groups.count, -np.inf)
        last_rank = np.full(groups.count, -1, np.int64)
        for rank, (members, indices) in groups.members.items():  # the reference first: the first of equal starts is last
            sizes[members] += 1
            starts = calls[rank].start[indices] - offsets.get(rank, 0.0)
            later = starts > latest[members]
            latest[members[later]] = starts[later]
            last_rank[members[later]] = rank
        self.matched = sizes >= 2  # groups of 2+ ranks: the others are not compared
        self.latest = np.where(self.matched, latest, np.nan)
        self.last_rank = np.where(self.matched, last_rank, -1)
        ranks, counts = np.unique(self.last_rank[self.matched], return_counts=True)
        self.last = dict(zip(ranks.tolist(), counts.tolist()))
        self._matched_of: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def matched_of(self, rank: int) -> tuple[np.ndarray, np.ndarray]:
        """The rank's matched groups (2+ ranks), in order, and its calls in them."""
        found = self._matched_of.get(rank)
        if found is None:
            members, indices = self.members[rank]
            keep = self.matched[members]
            found = self._matched_of[rank] = (members[keep], indices[keep])
        return found

    def wait_us(self, rank: int) -> float:
        """Time the rank waited in collectives for later ranks: from its start to the last start, at most the call."""
        if rank not in self.members:
            return 0.0
        members, indices = self.matched_of(rank)
        calls = self.calls[rank]
        start = calls.start[indices] - self.offsets.get(rank, 0.0)
        gap = np.minimum(np.maximum(self.latest[members] - start, 0.0), calls.end[indices] - calls.start[indices])
        return float(gap.sum())


def _transfer_busbw(shared: _Shared, rank: int) -> dict[str, float]:
    """Bus bandwidth by type over the time after the last rank arrived: the transfer, not the wait."""
    if rank not in shared.members:
        return {}
    members, indices = shared.matched_of(rank)
    calls = shared.calls[rank]
    start = np.maximum(shared.latest[members] + shared.offsets.get(rank, 0.0), calls.start[indices])
    transfer = calls.end[indices] - start
    nbytes = calls.nbytes[indices]
    keep = (nbytes > 0) & (transfer > 0)
    if not keep.any():
        return {}
    codes, sizes, transfer, nbytes = calls.type_codes[indices][keep], calls.group_size[indices][keep], transfer[keep], nbytes[keep]
    present = list(dict.fromkeys(codes.tolist()))  # types in the order of their first call
    factor = np.empty(len(codes))
    for code in present:  # a few types, each mostly of one group size
        chosen = codes == code
        group_sizes = sizes[chosen]
        if group_sizes.min() == group_sizes.max():
            factor[chosen] = busbw_factor(calls.types[code], int(group_sizes[0]))
        else:
            distinct, inverse = np.unique(group_sizes, return_inverse=True)
            factors = np.array([busbw_factor(calls.types[code], size) for size in distinct.tolist()])
            factor[chosen] = factors[inverse.reshape(-1)]
    moved = np.bincount(codes, nbytes * factor, len(calls.types))  # summed in call order
    spent = np.bincount(codes, transfer, len(calls.types))
    return {calls.types[code]: moved[code] / spent[code] / 1e3 for code in present}


def _timing(steps: StepSegmentation, comm: CommAnalysis, rank: int, shared: _Shared) -> RankTiming:
    own = steps.for_rank(rank)
    count = max(len(own), 1)
    step_ms = numeric.median([s.duration_ms for s in own]) if own else 0.0
    rank_comm = comm.for_rank(rank)
    wait_ms = shared.wait_us(rank) / count / 1000.0
    return RankTiming(
        rank=rank,
        steps=len(own),
        step_ms=step_ms,
        comm_ms_per_step=rank_comm.comm_ms_per_step if rank_comm else 0.0,
        wait_ms_per_step=wait_ms,
        busy_ms_per_step=max(step_ms - wait_ms, 0.0),
        clock_offset_us=shared.offsets.get(rank, 0.0),
        clock=_clock_source(shared, rank),
        matched_collectives=len(shared.matched_of(rank)[0]) if rank in shared.members else 0,
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


def _straggler(timings, matched: int, profiles: dict[int, Profile]) -> Straggler | None:
    if matched == 0:
        return None
    candidate = min(timings, key=lambda t: (t.wait_ms_per_step, -t.last_arrivals))
    others = [t for t in timings if t.rank != candidate.rank]
    others_wait = numeric.median([t.wait_ms_per_step for t in others])
    return Straggler(
        rank=candidate.rank,
        own_wait_ms_per_step=candidate.wait_ms_per_step,
        others_wait_ms_per_step=others_wait,
        imposed_wait_ms_per_step=max(others_wait - candidate.wait_ms_per_step, 0.0),
        last_arrival_pct=100.0 * candidate.last_arrivals / matched,
        step_ms=numeric.median([t.step_ms for t in timings]),
        excess=excess(profiles, candidate.rank),
    )
