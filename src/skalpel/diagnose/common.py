"""Small helpers the finding families share: steps of a rank, events inside steps, per-step sums."""

from __future__ import annotations

import numpy as np

from ..analysis.step_window import Window
from ..analysis.steps import Step
from .rule import Context


def windows(ctx: Context) -> list[Window]:
    """One window per rank that has steps."""
    result = []
    for rank in ctx.rank_ids:
        steps = tuple(ctx.steps.for_rank(rank))
        if steps:
            result.append(Window(rank, steps))
    return result


def window_of(ctx: Context, rank: int) -> Window:
    """The units one rank is judged over, as the ledger counts them: its marked steps; without markers the loop's
    iterations (``judged_units``), so that "per step" means per iteration there, as in the blame and the ledger, not
    per whole window; the window itself where no loop was found."""
    found = ctx.analyses.ledger.for_rank(rank) if ctx.analyses.ledger is not None else None
    if found is None or found.unit != "iteration" or not found.lanes:
        return Window(rank, tuple(ctx.steps.for_rank(rank)))
    return Window(rank, tuple(Step(rank, unit.number, unit.start_us, unit.end_us, unit.end_us)
                              for unit in found.lanes[0].units))  # fmt: skip


def data_wait_ms(ctx: Context, rank: int, lane: str = "host") -> float:
    """Waiting for data a unit, from the ledger, the one account every rule reads (``RankLedger.data_wait_ms_per_unit``:
    the main thread in a fetch, or with ``lane="device"`` the part the device idled); 0 without a ledger."""
    found = ctx.analyses.ledger.for_rank(rank) if ctx.analyses.ledger is not None else None
    return found.data_wait_ms_per_unit(lane) if found is not None else 0.0


def job_data_wait_ms(ctx: Context) -> tuple[float, float] | None:
    """(waiting for data, the steady unit) in ms, each the mean over the ranks' host lanes: the job's account for
    the rules that judge the capture's CPU facts, which are the job's; None without a ledger or a host lane."""
    ledgers = ctx.analyses.ledger.ranks.values() if ctx.analyses.ledger is not None else ()
    hosts = [(ledger, ledger.lane("host")) for ledger in ledgers]
    hosts = [(ledger, host) for ledger, host in hosts if host is not None]
    if not hosts:
        return None
    wait = sum(ledger.data_wait_ms_per_unit() for ledger, _ in hosts) / len(hosts)
    return wait, sum(host.steady_ms_per_unit for _, host in hosts) / len(hosts)


def pct(part: float, whole: float) -> float:
    return 100.0 * part / whole if whole > 0 else 0.0


def first(events: np.ndarray, count: int = 5) -> list[int]:
    """A few event indices, as evidence a user can look up."""
    return [int(index) for index in events[:count]]


def named_at(label: str, location: str | None) -> str:
    """A cause and its line: "augment() in train.py:12 at train.py:15 in augment"; the label alone when it already
    names that line ("<listcomp> in train.py:30" located at train.py:30) or there is no line."""
    if not location:
        return label
    line = location.split(" in ", 1)[0]
    return label if line in label else f"{label} at {location}"
