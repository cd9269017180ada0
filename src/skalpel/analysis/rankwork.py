"""The ranks' work side by side: how often a step calls each op, and on what inputs.

A rank that reaches the collectives late either does more (more calls of some op a step, or
the same calls on larger inputs) or does the same slower (a loaded CPU, a slower device). The
op tables (``analysis.ops``, carried in each rank's summary when a job is reduced rank by rank)
tell which: calls a step are each op's calls over the rank's profiled steps, and its most
frequent ``Input Dims`` stand for its inputs. A rank's extra work is what it calls more often
than the median of the others, or on other inputs, with the time that costs at its own time a
call (host self time, or device self time where that is larger).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..result.report import OpRow
from . import numeric
from .ops import OpTable
from .options import MIN_CALL_RATIO
from .steps import StepSegmentation

if TYPE_CHECKING:
    from .ranks import RankComparison


@dataclass(frozen=True)
class ExtraWork:
    """An op one rank runs more of a step than the others: more calls, or the same calls on other inputs."""

    op: str
    calls_per_step: float
    others_calls_per_step: float  # the median of the other ranks
    extra_ms_per_step: float  # what the extra calls (or the other inputs) cost, at this rank's own time a call
    input_shapes: str | None = None  # this rank's most frequent inputs, where they differ from the others'
    others_input_shapes: str | None = None

    @property
    def call_ratio(self) -> float:
        return self.calls_per_step / self.others_calls_per_step if self.others_calls_per_step > 0 else float("inf")


@dataclass(frozen=True)
class WorkComparison:
    """One rank's work against the other ranks'."""

    matched: bool  # every rank calls every op equally often a step, on the same most frequent inputs
    extra: tuple[ExtraWork, ...]  # what this rank runs more of, most extra time first


@dataclass(frozen=True)
class RankWork:
    """One rank's ops a step (op -> calls a step, ms a step, most frequent inputs), and its ``work``: the same
    without the times. A job's join makes it as each rank's summary arrives."""

    per_step: dict[str, tuple[float, float, str | None]]
    work: dict[str, tuple[float, str | None]]


def rank_work(rows: tuple[OpRow, ...], steps: int, kinds: list[dict[str, tuple[float, str | None]]] | None = None) -> RankWork:
    """``rows`` of an op table over ``steps`` profiled steps. ``kinds``: the ``work`` of other ranks, one of each
    kind; an equal one is shared, else this rank's joins them (up to ``WORK_KINDS``), so that a job of a few
    kinds of ranks holds each kind's once."""
    per_step = _per_step(rows, max(steps, 1))
    work = _work(per_step)
    if kinds is None:
        return RankWork(per_step, work)
    shared = next((kind for kind in kinds if kind == work), None)
    if shared is None and len(kinds) < WORK_KINDS:
        kinds.append(work)
    return RankWork(per_step, shared if shared is not None else work)


WORK_KINDS = 16


def slower_rank_work(comparison: RankComparison, ops: OpTable | None, steps: StepSegmentation, *,
                     works: dict[int, RankWork] | None = None) -> WorkComparison | None:  # fmt: skip
    """The slower rank's work (the straggler's, or the first rank's without one) against the other ranks'."""
    if not comparison.ranks:
        return None
    rank = comparison.straggler.rank if comparison.straggler is not None else comparison.ranks[0].rank
    return compare_work(ops, steps, rank, min_call_ratio=MIN_CALL_RATIO, works=works)


def compare_work(ops: OpTable | None, steps: StepSegmentation, rank: int, *, min_call_ratio: float,
                 works: dict[int, RankWork] | None = None) -> WorkComparison | None:  # fmt: skip
    """``rank``'s work against the others'; None without op tables for it and another rank.

    An op is extra work when ``rank`` calls it at least ``min_call_ratio`` times as often a step as the
    median of the others (or only it calls it), or as often on other most frequent inputs and for longer.
    ``works``: ranks' ``rank_work`` made already (a job's, as its ranks arrived).
    """
    if ops is None:
        return None
    works = works or {}
    ranks = {item.rank: works.get(item.rank) or rank_work(item.rows, len(steps.for_rank(item.rank))) for item in ops.ranks}
    if rank not in ranks or len(ranks) < 2:
        return None
    own = ranks.pop(rank)
    mine = own.per_step
    others = [other.per_step for other in ranks.values()]
    matched = all(other.work is own.work or other.work == own.work for other in ranks.values())
    extra = []
    for name, (calls, ms, shapes) in mine.items():
        theirs = [other.get(name, (0.0, 0.0, None)) for other in others]
        their_calls = numeric.median([row[0] for row in theirs])
        if calls >= min_call_ratio * their_calls:
            extra_ms = (calls - their_calls) * ms / calls
            extra.append(ExtraWork(name, calls, their_calls, extra_ms))
            continue
        their_shapes = _most_common([row[2] for row in theirs])
        their_ms = numeric.median([row[1] for row in theirs])
        if shapes is not None and their_shapes is not None and shapes != their_shapes and ms > their_ms:
            extra.append(ExtraWork(name, calls, their_calls, ms - their_ms, shapes, their_shapes))
    return WorkComparison(matched, tuple(sorted(extra, key=lambda item: -item.extra_ms_per_step)))


def _per_step(rows: tuple[OpRow, ...], steps: int) -> dict[str, tuple[float, float, str | None]]:
    """op -> (calls a step, ms a step, inputs: its only ones, or how many it ran on).

    Of several inputs the most frequent is no mark of the work: where they tie (DDP's buckets, each all-reduced
    once a step) it is the one recorded first, which two ranks doing the same work can record in another order
    (a real 2-rank gloo run on a loaded machine read as a critical straggler)."""
    return {row.name: (row.calls / steps, max(row.self_ms, row.device_ms) / steps,
                       row.input_shapes if row.shape_variants <= 1 else f"{row.shape_variants} input shapes")
            for row in rows}  # fmt: skip


def _work(ops: dict[str, tuple[float, float, str | None]]) -> dict[str, tuple[float, str | None]]:
    """What a rank does, without how long it took: calls a step and inputs of each op."""
    return {name: (calls, shapes) for name, (calls, _, shapes) in ops.items()}


def _most_common(values: list[str | None]) -> str | None:
    known = [value for value in values if value is not None]
    return max(sorted(set(known)), key=known.count) if known else None
