"""Collective wait blamed on the peer rank that arrived last.

With several ranks compared (``ranks.compare_ranks``), each piece of a rank's idle time that blame charged to
``collective_wait`` is placed in the rank's matched collective that holds it. Until the last rank reached that
collective (on this rank's aligned clock), the rank was waiting for that peer: "rank N"; after it, the data was
moving: "transfer". A piece in no matched collective (an unmatched call, or the device idle before a queued
collective kernel started) is "unmatched". Per step the parts add up to the step's collective wait.
One rank alone has no peers: its blame is left as it is.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from ..trace.model import Trace
from .blame import BlameResult, PeerSplit, PeerWait, RankBlame
from .ranks import RankComparison

TRANSFER = "transfer"
UNMATCHED = "unmatched"
_TOP = 8


@dataclass(frozen=True)
class CollectiveWaits:
    """A rank's collective-wait pieces and the collectives holding them: what the split needs besides the peers
    (a rank reduced on its own keeps this for the join)."""

    spans: tuple[tuple[int, float, float], ...]  # (step position, start, end)
    step_numbers: tuple[int, ...]
    described: dict[int, tuple[str, str | None]]  # collective event -> its name and user line

    def shifted(self, shift_us: float, event_offset: int) -> CollectiveWaits:
        """On the job's clock and event numbering (``job.join``)."""
        spans = tuple((step, low + shift_us, high + shift_us) for step, low, high in self.spans)
        return CollectiveWaits(spans, self.step_numbers, {event + event_offset: text for event, text in self.described.items()})


def with_late_peers(trace: Trace, result: BlameResult, comparison: RankComparison | None) -> BlameResult:
    """The blame with each rank's collective wait split by the peer that arrived last (unchanged for one rank)."""
    if comparison is None or len(comparison.ranks) < 2:
        return result
    ranks = {}
    for rank, blamed in result.ranks.items():
        if blamed.collective_spans:
            arrivals = comparison.arrivals_of(rank)
            waits = collective_waits(trace, blamed, [call for call, _, _ in arrivals])
            blamed = dataclasses.replace(blamed, peers=split_waits(waits, arrivals))
        ranks[rank] = blamed
    return dataclasses.replace(result, ranks=ranks)


def collective_waits(trace: Trace, blamed: RankBlame, collectives) -> CollectiveWaits:
    """The rank's collective-wait pieces, with the name and line of each of its ``collectives`` that holds one."""
    calls = sorted(collectives, key=lambda call: call.start_us)
    starts = np.array([call.start_us for call in calls])
    found = [_holding(calls, starts, (low + high) / 2) for _, low, high in blamed.collective_spans]
    holding = {calls[index].event for index in found if index >= 0}
    described = {}
    if holding:
        from ..trace.stacks import Locator  # only when there is something to locate

        locator = Locator(trace)
        described = {event: (trace.names[trace.name[event]], locator.location_of(event)) for event in sorted(holding)}
    return CollectiveWaits(blamed.collective_spans, tuple(step.number for step in blamed.steps), described)


def split_waits(waits: CollectiveWaits, arrivals) -> PeerSplit:
    """Each piece split at the last arrival of the matched collective holding it (``RankComparison.arrivals_of``)."""
    arrivals = sorted(arrivals, key=lambda item: item[0].start_us)
    calls = [call for call, _, _ in arrivals]
    starts = np.array([call.start_us for call in calls])
    by_step: list[dict[str, float]] = [defaultdict(float) for _ in waits.step_numbers]
    by_cause: dict[tuple[str, int | None, int], float] = defaultdict(float)  # (part, peer, collective event) -> ms
    for step, low, high in waits.spans:
        index = _holding(calls, starts, (low + high) / 2)
        if index < 0:
            parts = [(UNMATCHED, None, -1, high - low)]
        else:
            call, latest, last = arrivals[index]
            waiting = min(max(latest - low, 0.0), high - low)  # before the last arrival: waiting for it
            parts = [(f"rank {last}", last, call.event, waiting), (TRANSFER, None, call.event, high - low - waiting)]
        for part, peer, event, amount in parts:
            if amount > 0:
                by_step[step][part] += amount / 1000.0
                by_cause[(part, peer, event)] += amount / 1000.0
    total: dict[str, float] = defaultdict(float)
    for split in by_step:
        for part, value in split.items():
            total[part] += value
    return PeerSplit(tuple(dict(split) for split in by_step), dict(total), _top(waits.described, by_cause))


def _holding(calls, starts: np.ndarray, instant: float) -> int:
    """The index of the call (sorted by start) holding an instant, the latest started when calls overlap (a few
    looked back at); -1 for none."""
    position = int(np.searchsorted(starts, instant, side="right")) - 1
    for index in range(position, max(position - 4, -1), -1):
        if calls[index].start_us <= instant < calls[index].end_us:
            return index
    return -1


def _top(described: dict[int, tuple[str, str | None]], by_cause) -> tuple[PeerWait, ...]:
    """The largest parts by (part, collective name), located at the collective that took most of each."""
    grouped: dict[tuple[str, int | None, str | None], list[tuple[float, int]]] = defaultdict(list)
    for (part, peer, event), ms in by_cause.items():  # unmatched time is in no collective: no name, no line
        grouped[(part, peer, described.get(event, (None, None))[0])].append((ms, event))
    ranked = sorted(grouped.items(), key=lambda item: -sum(ms for ms, _ in item[1]))[:_TOP]
    return tuple(PeerWait(peer, part, name, described.get(max(items)[1], (None, None))[1], sum(ms for ms, _ in items))
                 for (part, peer, name), items in ranked)  # fmt: skip
