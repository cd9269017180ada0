"""Collective wait blamed on the peer rank that arrived last.

With several ranks compared (``ranks.compare_ranks``), each piece of a rank's idle time that blame charged to
``collective_wait`` is placed in the rank's matched collective that holds it. Until the last rank reached that
collective (on this rank's aligned clock), the rank was waiting for that peer: "rank N"; after it, the data was
moving: "transfer". On NCCL the collective is timed by its kernel, and the host's wait falls outside it: a piece
there is placed in the collective whose host side holds it, the host op that launched the kernel
(``record_param_comms``, ``c10d::allreduce_``, ``nccl:all_reduce``) or a ``cuda*Synchronize`` that starts while
the collective launched before it on that thread is still running; where this rank itself arrived last, the
host side before its arrival waited for no peer: "arriving". A piece in neither (an unmatched call, or
the device idle before a queued collective kernel started) is "unmatched". Per step the parts add up to the
step's collective wait. One rank alone has no peers: its blame is left as it is.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from ..trace.kinds import Kind
from ..trace.model import Trace, isin_few
from ..trace.roles import Role
from . import numeric
from .blame import PeerSplit, PeerWait, RankBlame, WaitSpans
from .ranks import Arrivals

TRANSFER = "transfer"
UNMATCHED = "unmatched"
ARRIVING = "arriving"  # the host side of a collective this rank itself reached last: no peer to wait for
_TOP = 8
_SYNC_ROLES = (Role.USER_SYNC, Role.INTERNAL_SYNC)  # runtime calls that block the host until the device catches up


@dataclass(frozen=True, eq=False)
class CollectiveWaits:
    """A rank's collective-wait pieces and the collectives holding them: what the split needs besides the peers
    (a rank reduced on its own keeps this for the join)."""

    spans: WaitSpans  # (step position, start, end)
    step_numbers: tuple[int, ...]
    described: dict[int, tuple[str, str | None]]  # collective event -> its name and user line
    # per span: the collective whose host side (launching op, sync) holds it, or -1
    host_side: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def pieces(self) -> int:
        return len(self.spans)

    def columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Steps, starts, ends and host sides as arrays (what ``split_waits`` reads)."""
        return self.spans.steps, self.spans.starts, self.spans.ends, self.host_side

    def __eq__(self, other) -> bool:
        if not isinstance(other, CollectiveWaits):
            return NotImplemented
        return (self.spans == other.spans and self.step_numbers == other.step_numbers and self.described == other.described
                and self.host_side.tolist() == other.host_side.tolist())  # fmt: skip

    __hash__ = None  # type: ignore[assignment]


def collective_waits(trace: Trace, blamed: RankBlame, collectives) -> CollectiveWaits:
    """The rank's collective-wait pieces, with the name and line of each of its ``collectives`` that holds one."""
    calls = sorted(collectives, key=lambda call: call.start_us)
    spans = blamed.collective_spans
    middles = spans.middles()
    found = _holding(calls, middles)
    outside = np.flatnonzero(found < 0)
    host_side = np.full(len(found), -1, np.int64)
    if len(outside):  # NCCL: the host's wait is outside the kernel that times the collective
        host_side[outside] = _host_side_owners(trace, blamed.rank, calls, middles[outside])
    holding = {calls[index].event for index in numeric.unique(found[found >= 0]).tolist()}
    holding |= set(numeric.unique(host_side[host_side >= 0]).tolist())
    described = {}
    if holding:
        from ..trace.stacks import Locator  # only when there is something to locate

        locator = Locator(trace)
        described = {event: (trace.names[trace.name[event]], locator.location_of(event)) for event in sorted(holding)}
    return CollectiveWaits(spans, tuple(step.number for step in blamed.steps), described, host_side)


def _host_side_owners(trace: Trace, rank: int, calls, instants: np.ndarray) -> np.ndarray:
    """For each instant, the event of the device-timed collective whose host side holds it, else -1: the
    outermost collective host op (``Kind.COMM_OP``) around the kernel's launch call, or a ``cuda*Synchronize``
    on that thread that starts after the launch and before the kernel ends (it waits for the collective).

    Thread by thread and all launches at once (sorted starts, searched): a rank of 1 GB has 50,000 collectives,
    and a scan of its ops for each of them grew with their square."""
    found = np.full(len(instants), -1, dtype=np.int64)
    launched = [(call.event, int(trace.launcher[call.event]), call.end_us) for call in calls if call.on_device]
    launched = [item for item in launched if item[1] >= 0]
    if not launched:
        return found
    owner = np.array([event for event, _, _ in launched], np.int64)
    launch = np.array([launch for _, launch, _ in launched], np.int64)
    call_end = np.array([end for _, _, end in launched], np.float64)
    ends = trace.ts + trace.dur
    at, thread, launch_end = trace.ts[launch], trace.tid[launch], ends[launch]
    on_rank = trace.rank == rank
    ops = np.flatnonzero(on_rank & (trace.kind == Kind.COMM_OP))
    syncs = np.flatnonzero(on_rank & isin_few(trace.role, _SYNC_ROLES))  # the profiler's own too
    pieces = []  # (launch's position, order within it, event of the op or sync): the ranges in the order found
    for tid in np.unique(thread).tolist():
        mine = np.flatnonzero(thread == tid)
        around = _by_start(trace, ops[trace.tid[ops] == tid])
        if len(around):  # the first op (by start) that started by the launch and ends after it: the outermost
            reach = np.maximum.accumulate(ends[around])
            started = np.searchsorted(trace.ts[around], at[mine], side="right")
            first = np.searchsorted(reach, launch_end[mine], side="left")
            hit = first < started
            pieces.append((mine[hit], np.zeros(int(hit.sum()), np.int64), around[first[hit]]))
        waiting = _by_start(trace, syncs[trace.tid[syncs] == tid])
        if len(waiting):  # the syncs starting from the launch until the kernel ends
            low = np.searchsorted(trace.ts[waiting], at[mine], side="left")
            high = np.maximum(np.searchsorted(trace.ts[waiting], call_end[mine], side="left"), low)
            counts = high - low
            within = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
            pieces.append((np.repeat(mine, counts), 1 + within, waiting[np.repeat(low, counts) + within]))
    if not pieces:
        return found
    position, order, event = (np.concatenate(part) for part in zip(*pieces))
    event = event[np.lexsort((order, position))]  # the order the ranges were found in: it settles equal starts
    owners = owner[position[np.lexsort((order, position))]]
    by_start = np.argsort(trace.ts[event], kind="stable")
    lows, highs, owners = trace.ts[event][by_start], ends[event][by_start], owners[by_start]
    last = np.searchsorted(lows, instants, side="right") - 1
    for back in range(8):  # the latest started range holding it (a few looked back at)
        index = last - back
        open_ = (found < 0) & (index >= 0)
        safe = np.where(open_, index, 0)
        held = open_ & (highs[safe] > instants)
        found[held] = owners[safe[held]]
    return found


def _by_start(trace: Trace, events: np.ndarray) -> np.ndarray:
    """``events`` (in event order) sorted by start time, ties kept in event order."""
    return events[np.argsort(trace.ts[events], kind="stable")]


def split_waits(waits: CollectiveWaits, arrivals: Arrivals, *, shift_us: float = 0.0, event_offset: int = 0) -> PeerSplit:
    """Each piece split at the last arrival of the matched collective holding it (``RankComparison.arrivals``).

    All pieces at once (a 1 GB rank has some 300,000): each piece gives one part before the last arrival and one
    after, summed by step and by cause with ``bincount``, which adds in the pieces' order, as a loop over them
    would. ``waits``: a rank's ``CollectiveWaits``, as its worker sent it. ``shift_us`` and ``event_offset``: the pieces moved onto the job's clock and event
    numbering (the join's; ``arrivals`` are already there), without making them first."""
    steps, lows, highs, host_side = waits.columns()
    count = len(lows)
    lows, highs = lows + shift_us, highs + shift_us  # the doubles the whole trace's pieces have
    described = {event + event_offset: text for event, text in waits.described.items()} if event_offset else waits.described
    holding = _holding_in(arrivals.start, arrivals.end, (lows + highs) / 2)
    if len(host_side):  # the host's wait for a kernel-timed collective
        outside = np.flatnonzero(holding < 0)
        host_side = host_side[outside]
        host_side = np.where(host_side >= 0, host_side + event_offset, -1)
        holding[outside] = _index_of(arrivals.event, host_side)
    length = highs - lows
    at = np.maximum(holding, 0)
    latest, last, own, event = (column[at] if len(column) else np.zeros(count, column.dtype)
                                for column in (arrivals.latest, arrivals.last, arrivals.rank, arrivals.event))  # fmt: skip
    waiting = np.minimum(np.maximum(latest - lows, 0.0), length)
    matched = holding >= 0
    # Two parts a piece, in order: before the last arrival (a rank, or arriving), then the transfer; unmatched: one.
    part = np.empty(2 * count, np.int64)
    part[0::2] = np.where(matched, np.where(last == own, _ARRIVING_CODE, last), _UNMATCHED_CODE)
    part[1::2] = _TRANSFER_CODE
    amount = np.empty(2 * count, np.float64)
    amount[0::2] = np.where(matched, waiting, length)
    amount[1::2] = np.where(matched, length - waiting, 0.0)
    events = np.repeat(np.where(matched, event, -1), 2)
    kept = np.flatnonzero(amount > 0)
    part, amount, events, steps = part[kept], amount[kept] / 1000.0, events[kept], np.repeat(steps, 2)[kept]
    by_step: list[dict[str, float]] = [{} for _ in waits.step_numbers]
    names = {code: _part_name(code) for code in np.unique(part).tolist()}
    for (step, code), ms in _sums(steps, part, amount):
        by_step[step][names[code]] = ms
    by_cause = {(names[code], code if code >= 0 else None, event): ms for (code, event), ms in _sums(part, events, amount)}
    total: dict[str, float] = defaultdict(float)
    for split in by_step:
        for name, value in split.items():
            total[name] += value
    return PeerSplit(tuple(by_step), dict(total), _top(described, by_cause))


_ARRIVING_CODE, _TRANSFER_CODE, _UNMATCHED_CODE = -1, -2, -3  # parts that are not a peer rank (>= 0)


def _part_name(code: int) -> str:
    return {_ARRIVING_CODE: ARRIVING, _TRANSFER_CODE: TRANSFER, _UNMATCHED_CODE: UNMATCHED}.get(code) or f"rank {code}"


def _sums(first: np.ndarray, second: np.ndarray, values: np.ndarray) -> list[tuple[tuple[int, int], float]]:
    """The values summed by the pair of keys, in the order each pair first comes (a dict filled in a loop's order)."""
    if not len(values):
        return []
    low, high = int(second.min()), int(second.max())
    keys = (first - int(first.min())) * (high - low + 1) + (second - low)  # one integer a pair: a plain sort
    unique, where, inverse = np.unique(keys, return_index=True, return_inverse=True)
    sums = np.bincount(inverse.reshape(-1), weights=values, minlength=len(unique))
    order = np.argsort(where, kind="stable")
    pairs = zip(first[where[order]].tolist(), second[where[order]].tolist())
    return list(zip(pairs, sums[order].tolist()))


def _index_of(events: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """For each wanted event, the position of the last of ``events`` that is it; -1 where none is."""
    if not len(events):
        return np.full(len(wanted), -1, np.int64)
    order = np.argsort(events, kind="stable")
    position = np.searchsorted(events[order], wanted, side="right") - 1
    found = order[np.maximum(position, 0)]
    return np.where((position >= 0) & (events[found] == wanted), found, -1)


def _holding(calls, instants: np.ndarray) -> np.ndarray:
    """For each instant, the index of the call (sorted by start) holding it (``_holding_in``)."""
    return _holding_in(np.array([call.start_us for call in calls], np.float64),
                       np.array([call.end_us for call in calls], np.float64), instants)  # fmt: skip


def _holding_in(starts: np.ndarray, ends: np.ndarray, instants: np.ndarray) -> np.ndarray:
    """For each instant, the index of the call (by ``starts``, sorted) holding it, the latest started when calls
    overlap (a few looked back at); -1 for none. All instants at once: a rank has one per collective wait, 10,000s
    of them."""
    found = np.full(len(instants), -1, np.int64)
    if not len(starts):
        return found
    position = np.searchsorted(starts, instants, side="right") - 1
    for back in range(_LOOK_BACK):  # the latest started first: the first call that holds the instant wins
        index = position - back
        open_ = (found < 0) & (index >= 0)
        safe = np.where(open_, index, 0)
        held = open_ & (starts[safe] <= instants) & (instants < ends[safe])
        found[held] = index[held]
    return found


_LOOK_BACK = 4


def _top(described: dict[int, tuple[str, str | None]], by_cause) -> tuple[PeerWait, ...]:
    """The largest parts by (part, collective name), located at the collective that took most of each."""
    grouped: dict[tuple[str, int | None, str | None], list[tuple[float, int]]] = defaultdict(list)
    for (part, peer, event), ms in by_cause.items():  # unmatched time is in no collective: no name, no line
        grouped[(part, peer, described.get(event, (None, None))[0])].append((ms, event))
    ranked = sorted(grouped.items(), key=lambda item: -sum(ms for ms, _ in item[1]))[:_TOP]
    return tuple(PeerWait(peer, part, name, described.get(max(items)[1], (None, None))[1], sum(ms for ms, _ in items))
                 for (part, peer, name), items in ranked)  # fmt: skip
