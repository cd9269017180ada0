"""Do these rank files belong to one job? Plain-words warnings when they may not.

Rank files of different runs mixed in one folder, a missing rank, ranks that recorded
different steps: each is said clearly, and the analysis goes on with what matches
(collectives are matched one by one, steps are per rank).
"""

from __future__ import annotations

from typing import Sequence

from ..trace.model import RankInfo
from .steps import StepSegmentation

MIN_MATCHED_SHARE = 0.5  # below this share of a rank's collectives matched, the ranks look like different runs
LISTED = 8  # ranks named one by one up to this many; past it, the ranks of one value are one range (a job of 1,000)


def consistency_warnings(
    ranks: Sequence[RankInfo], steps: StepSegmentation, matched: dict[int, tuple[int, int]] | None = None
) -> tuple[str, ...]:
    """Warnings about the set of rank files; ``matched`` is rank -> (matched collectives, collectives)."""
    if len(ranks) < 2:
        return ()  # one rank file of a bigger job is a normal single-rank analysis
    found = [
        _mixed_runs(ranks),
        _disagreeing(ranks, "world size", lambda info: info.world_size),
        _disagreeing(ranks, "backend", lambda info: info.backend),
        _missing_ranks(ranks),
        _step_counts(ranks, steps),
        _unmatched(matched or {}),
    ]
    return tuple(text for text in found if text)


def _declared_world(ranks: Sequence[RankInfo]) -> int:
    return max((info.world_size or 0 for info in ranks), default=0)


def _mixed_runs(ranks: Sequence[RankInfo]) -> str | None:
    jobs = {info.rank: info.job for info in ranks if info.job}
    if len(set(jobs.values())) <= 1:
        return None
    listing = _listing(jobs)
    return (
        f"the rank files come from different runs ({listing}); cross-rank figures compare unrelated "
        "captures: analyse each run's folder on its own"
    )


def _disagreeing(ranks: Sequence[RankInfo], what: str, value) -> str | None:
    values = {info.rank: value(info) for info in ranks if value(info) is not None}
    if len(set(values.values())) <= 1:
        return None
    listing = _listing(values)
    return f"the rank files disagree on the {what} ({listing}): files of different jobs mixed in one folder?"


def _missing_ranks(ranks: Sequence[RankInfo]) -> str | None:
    world = _declared_world(ranks)
    present = {info.rank for info in ranks}
    missing = [rank for rank in range(world) if rank not in present]
    if not missing:
        return None
    return (
        f"the job has {world} ranks but {len(present)} rank file{'s' if len(present) != 1 else ''} "
        f"{'were' if len(present) != 1 else 'was'} loaded (missing: {_ranges(missing)}); "
        "cross-rank figures cover the ranks present"
    )


def _step_counts(ranks: Sequence[RankInfo], steps: StepSegmentation) -> str | None:
    if not steps.marked:
        return None
    numbers = {rank: [s.number for s in steps.for_rank(rank)] for rank in [info.rank for info in ranks]}
    counts = {rank: len(values) for rank, values in numbers.items()}
    if len(set(counts.values())) > 1:
        listing = _listing(counts)
        return f"the ranks recorded different numbers of steps ({listing}); per-rank figures use each rank's own steps"
    spans = {rank: (min(values), max(values)) for rank, values in numbers.items() if values}
    if len(set(spans.values())) > 1:
        listing = _listing(spans, lambda span: f"#{span[0]}-#{span[1]}")
        return f"the ranks recorded different steps ({listing}): different runs or capture windows?"
    return None


def _unmatched(matched: dict[int, tuple[int, int]]) -> str | None:
    poor = {rank: (hits, total) for rank, (hits, total) in matched.items() if total and hits < MIN_MATCHED_SHARE * total}
    if not poor:
        return None
    return (
        "few collectives match across ranks (" + _listing(poor, lambda pair: f"{pair[0]} of {pair[1]}")
        + " matched): the files may come from "
        "different runs, or the traces were sampled; waits and clock offsets use the matched ones only"
    )


def _listing(values: dict[int, object], show=str) -> str:
    """'rank 0: 8, rank 1: 128' for a few ranks; for more, one range of ranks per value, the rarest values first."""
    if len(values) <= LISTED:
        return ", ".join(f"rank {rank}: {show(value)}" for rank, value in sorted(values.items()))
    by_value: dict[object, list[int]] = {}
    for rank, value in sorted(values.items()):
        by_value.setdefault(value, []).append(rank)
    groups = sorted(by_value.items(), key=lambda item: (len(item[1]), item[1][0]))
    shown = [f"rank{'s' if len(ranks) > 1 else ''} {_ranges(ranks)}: {show(value)}" for value, ranks in groups[:LISTED]]
    if len(groups) > LISTED:
        shown.append(f"{len(groups) - LISTED} more values on {sum(len(ranks) for _, ranks in groups[LISTED:])} ranks")
    return "; ".join(shown)


def _ranges(values: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8'."""
    parts: list[str] = []
    start = previous = values[0]
    for value in values[1:] + [None]:
        if value is not None and value == previous + 1:
            previous = value
            continue
        parts.append(str(start) if start == previous else f"{start}-{previous}")
        if value is not None:
            start = previous = value
    return ", ".join(parts)
