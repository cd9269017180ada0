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

import numpy as np

from ..trace.model import Trace
from .blame import BlameResult, PeerSplit, PeerWait, RankBlame
from .ranks import RankComparison

TRANSFER = "transfer"
UNMATCHED = "unmatched"
_TOP = 8


def with_late_peers(trace: Trace, result: BlameResult, comparison: RankComparison | None) -> BlameResult:
    """The blame with each rank's collective wait split by the peer that arrived last (unchanged for one rank)."""
    if comparison is None or len(comparison.ranks) < 2:
        return result
    ranks = {}
    for rank, blamed in result.ranks.items():
        arrivals = comparison.arrivals_of(rank) if blamed.collective_spans else []
        ranks[rank] = dataclasses.replace(blamed, peers=_split(trace, blamed, arrivals)) if blamed.collective_spans else blamed
    return dataclasses.replace(result, ranks=ranks)


def _split(trace: Trace, blamed: RankBlame, arrivals) -> PeerSplit:
    arrivals = sorted(arrivals, key=lambda item: item[0].start_us)
    starts = np.array([call.start_us for call, _, _ in arrivals])
    by_step: list[dict[str, float]] = [defaultdict(float) for _ in blamed.steps]
    by_cause: dict[tuple[str, int | None, int], float] = defaultdict(float)  # (part, peer, collective event) -> us
    for step, low, high in blamed.collective_spans:
        found = _holding(arrivals, starts, (low + high) / 2)
        if found is None:
            parts = [(UNMATCHED, None, -1, high - low)]
        else:
            call, latest, last = found
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
    return PeerSplit(tuple(dict(split) for split in by_step), dict(total), _top(trace, by_cause))


def _holding(arrivals, starts: np.ndarray, instant: float):
    """The matched collective holding an instant, the latest started when calls overlap (a few look back)."""
    position = int(np.searchsorted(starts, instant, side="right")) - 1
    for index in range(position, max(position - 4, -1), -1):
        call = arrivals[index][0]
        if call.start_us <= instant < call.end_us:
            return arrivals[index]
    return None


def _top(trace: Trace, by_cause: dict[tuple[str, int | None, int], float]) -> tuple[PeerWait, ...]:
    """The largest parts by (part, collective name), located at the collective that took most of each."""
    grouped: dict[tuple[str, int | None, str], list[tuple[float, int]]] = defaultdict(list)
    for (part, peer, event), ms in by_cause.items():
        name = trace.names[trace.name[event]] if event >= 0 else ""
        grouped[(part, peer, name)].append((ms, event))
    ranked = sorted(grouped.items(), key=lambda item: -sum(ms for ms, _ in item[1]))[:_TOP]
    locator = None
    result = []
    for (part, peer, name), items in ranked:
        event = max(items)[1]
        location = None
        if event >= 0:
            if locator is None:
                from ..trace.stacks import Locator  # only when there is something to locate

                locator = Locator(trace)
            location = locator.location_of(event)
        result.append(PeerWait(peer, part, name, location, sum(ms for ms, _ in items)))
    return tuple(result)
