"""The sync calls of each rank that blocked on device work inside the steps (``blame``'s), by cause: a ``.item()``,
a blocking copy to the host, or an explicit synchronize; the copy and the synchronize that one ``.item()`` makes
are one sync point."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..trace import opnames
from ..trace.kinds import Kind
from ..trace.model import Trace
from ..trace.roles import Role
from . import intervals
from .blame import BlameResult, holding_range
from .step_window import Window
from .steps import StepSegmentation

SYNC_CALL, ITEM, BLOCKING_DTOH = "sync_call", "item", "blocking_dtoh"
CAUSES = (SYNC_CALL, ITEM, BLOCKING_DTOH)
SHOWN = 8  # the sync calls a finding names and locates


@dataclass(frozen=True)
class RankSyncCauses:
    rank: int
    waited: np.ndarray  # the sync calls inside the steps that blocked while device work ran
    points: dict[str, int]  # sync points by cause
    main_cause: str  # the cause with the most host time blocked
    blocked_us: float  # host time blocked in the calls, overlaps once
    shown: np.ndarray  # those after which the device idled most (blame's charged ones), else the longest
    shown_names: tuple[str, ...]  # the names of the shown calls, sorted
    device_sync_events: int  # the cuda_sync events CUPTI recorded on the rank

    @property
    def points_total(self) -> int:
        return sum(self.points.values())


@dataclass(frozen=True)
class SyncCauses:
    ranks: dict[int, RankSyncCauses]  # ranks with steps whose syncs blocked on device work, in the trace's order

    def for_rank(self, rank: int) -> RankSyncCauses | None:
        return self.ranks.get(rank)


def sync_causes(trace: Trace, steps: StepSegmentation, blamed: BlameResult | None) -> SyncCauses | None:
    """None where blame does not apply (no device work)."""
    if blamed is None or not blamed.applies:
        return None
    ranks = {}
    for rank in trace.rank_ids:
        window, rank_blame = Window(rank, tuple(steps.for_rank(rank))), blamed.for_rank(rank)
        if not window.count or rank_blame is None:
            continue
        waited = np.array(rank_blame.syncs_waited, dtype=np.int64)
        waited = waited[window.inside(trace.ts[waited])] if len(waited) else waited
        if len(waited):
            ranks[rank] = _rank_causes(trace, rank, waited, rank_blame.syncs_charged)
    return SyncCauses(ranks)


def _rank_causes(trace: Trace, rank: int, waited: np.ndarray, charged_syncs: tuple[int, ...]) -> RankSyncCauses:
    causes, first = _causes(trace, waited)
    points = {name: int(((causes == name) & first).sum()) for name in CAUSES}
    main = max(points, key=lambda name: float(trace.dur[waited[causes == name]].sum()) if points[name] else -1.0)
    inside = set(waited.tolist())
    charged = [event for event in charged_syncs if event in inside]
    longest = waited[np.argsort(-trace.dur[waited], kind="stable")[:SHOWN]]
    shown = np.array((charged or longest.tolist())[:SHOWN], dtype=np.int64)
    return RankSyncCauses(
        rank=rank,
        waited=waited,
        points=points,
        main_cause=main,
        blocked_us=intervals.length(trace.ts[waited], trace.ts[waited] + trace.dur[waited]),
        shown=shown,
        shown_names=tuple(sorted({trace.name_of(index) for index in shown})),
        device_sync_events=int(((trace.kind == Kind.DEVICE_SYNC) & (trace.rank == rank)).sum()),
    )


def _causes(trace: Trace, syncs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What each sync call is, from the op it runs in (.item(), a copy to the host, or an explicit synchronize),
    and which calls are one sync point: the copy and the synchronize that one .item() makes count once."""
    end = trace.end
    ops = np.flatnonzero((trace.kind == Kind.CPU_OP) & (trace.rank == trace.rank[syncs[0]]))
    item = holding_range(trace, end, ops[trace.role[ops] == Role.ITEM], syncs)
    copy = holding_range(trace, end, ops[opnames.named(trace, opnames.COPY_OPS)[ops]], syncs)
    copy_call = opnames.memcpy_calls(trace, syncs)  # the synchronous copy calls (cudaMemcpy) and copies by name
    causes = np.where(item >= 0, ITEM, np.where((copy >= 0) | copy_call, BLOCKING_DTOH, SYNC_CALL))
    point = np.where(item >= 0, item, np.where(copy >= 0, copy, -1))  # the op the call belongs to
    first = np.ones(len(syncs), dtype=bool)
    for cause, held in ((ITEM, item), (BLOCKING_DTOH, copy)):
        inside = np.flatnonzero((causes == cause) & (held >= 0))
        _, keep = np.unique(point[inside], return_index=True)
        first[inside] = False
        first[inside[keep]] = True
    return causes, first
