"""A job of many ranks in a few lines: each figure's spread across ranks, its outlier ranks, the ranks alike.

Read from the ranks' reports only (``RankReport``), so a report read back from JSON gives the
same summary. The figures of a rank: its median step time, compute (share of device time in
compute kernels), communication and wait in collectives (ms per step), and idle (share of the
marked steps the device idles, or of the span from first to last device event without markers).

Outliers are robust: a rank's z-score is 0.6745 (x - median) / MAD, judged against
``thresholds.RANK_OUTLIER_Z``, and it must differ from the median by a share and an amount
that are not a rounding. Groups are ranks whose step-time shares (``step_breakdown_pct``) and
step times match (``thresholds.RANK_GROUP_*``): each rank joins the first group whose
representative it matches, else starts one; O(ranks x groups), never ranks squared.
"""

from __future__ import annotations

from typing import Iterable

from ..analysis import numeric
from ..diagnose import thresholds
from ..result.report import CollectiveSpread, JobSummary, MetricSpread, RankGroup, RankReport, rank_ranges
from ..result.sections import CollectiveRow

FIGURES = (  # name, label, unit
    ("step_ms", "step time", "ms"),
    ("compute_pct", "compute", "%"),
    ("comm_ms", "communication", "ms"),
    ("wait_ms", "collective wait", "ms"),
    ("idle_pct", "idle", "%"),
)
HISTOGRAM_BINS = 16
SHOWN_OUTLIERS = 8  # outlier ranks a report details, farthest first; the rest are named in the summary
SHOWN_GROUPS = 8  # groups a report details by a representative, largest first
MAX_GROUPS = 32  # more kinds of ranks than this are not groups any more: the rest are one bag of ranks unlike them


def rank_figures(rank: RankReport) -> dict[str, float]:
    """The summary's figures of one rank (a figure the rank lacks is absent)."""
    figures: dict[str, float] = {}
    if rank.step_ms:
        figures["step_ms"] = numeric.median(rank.step_ms)
    if rank.gpu is not None:
        figures["compute_pct"] = rank.gpu.compute_pct
    if rank.comm is not None:
        figures["comm_ms"] = float(rank.comm.comm_ms_per_step)
    if rank.distributed is not None and rank.distributed.wait_ms_per_step is not None:
        figures["wait_ms"] = float(rank.distributed.wait_ms_per_step)
    if rank.step_device is not None and rank.step_device.marked:
        figures["idle_pct"] = float(rank.step_device.idle_pct)
    elif rank.gpu is not None:
        figures["idle_pct"] = rank.gpu.idle_pct
    return figures


def job_summary(ranks: Iterable[RankReport]) -> JobSummary | None:
    """The summary of a job's ranks; None for fewer than two."""
    ranks = list(ranks)
    if len(ranks) < 2:
        return None
    figures = {rank.rank: rank_figures(rank) for rank in ranks}
    metrics = tuple(spread for name, label, unit in FIGURES if (spread := _spread(name, label, unit, figures)) is not None)
    groups = _groups(ranks, figures)
    farthest: dict[int, float] = {}
    for metric in metrics:
        for rank, _, z in metric.outliers:
            farthest[rank] = max(farthest.get(rank, 0.0), abs(z))
    outliers = tuple(sorted(farthest, key=lambda rank: (-farthest[rank], rank)))
    representatives = [group.representative for group in groups if group.alike][:SHOWN_GROUPS]
    shown = set(outliers[:SHOWN_OUTLIERS]) | set(representatives)
    return JobSummary(ranks=len(ranks), metrics=metrics, groups=groups, outliers=outliers, shown=tuple(sorted(shown)),
                      outlier_z=thresholds.RANK_OUTLIER_Z, collectives=collectives(ranks))  # fmt: skip


SLOWEST_RANKS = 3


def collectives(ranks: list[RankReport]) -> tuple[CollectiveSpread, ...]:
    """Each type of collective over the ranks that ran it, most time per step first; its slowest ranks are those
    whose bus bandwidth after the last rank arrived (the link's, without the waits) is well below the median's."""
    rows: dict[str, list[tuple[int, CollectiveRow, float | None]]] = {}
    for rank in ranks:
        transfer = (rank.distributed.transfer_busbw_gbps if rank.distributed is not None else None) or {}
        for row in rank.comm.by_type if rank.comm is not None else ():
            rows.setdefault(row.type, []).append((rank.rank, row, transfer.get(row.type)))
    spreads = []
    for kind, items in rows.items():
        times = [float(row.ms_per_step) for _, row, _ in items]
        p50, p90 = numeric.percentiles(times, (50, 90))
        whole = {rank: float(row.busbw_gbps) for rank, row, _ in items if row.busbw_gbps is not None}
        moved = {rank: float(value) for rank, _, value in items if value is not None}
        slow = moved or whole
        spreads.append(CollectiveSpread(
            type=kind, ranks=len(items), calls_per_step=round(numeric.median([float(row.calls_per_step) for _, row, _ in items]), 3),
            ms_per_step_p50=round(p50, 4), ms_per_step_p90=round(p90, 4), ms_per_step_max=round(max(times), 4),
            **_bandwidth("busbw_gbps", whole), **_bandwidth("transfer_busbw_gbps", moved),
            slowest=_slowest(slow),
        ))  # fmt: skip
    return tuple(sorted(spreads, key=lambda spread: -spread.ms_per_step_p50))


def _slowest(bandwidth: dict[int, float]) -> tuple[int, ...]:
    """The ranks whose bandwidth is a fraction of the median's (``thresholds.RANK_SLOW_BANDWIDTH``), slowest first."""
    if len(bandwidth) < 2:
        return ()
    cut = thresholds.RANK_SLOW_BANDWIDTH * numeric.median(list(bandwidth.values()))
    slow = [rank for rank, value in bandwidth.items() if value < cut]
    return tuple(sorted(slow, key=lambda rank: (bandwidth[rank], rank))[:SLOWEST_RANKS])


def _bandwidth(name: str, values: dict[int, float]) -> dict[str, float | None]:
    if not values:
        return {f"{name}_p10": None, f"{name}_p50": None, f"{name}_p90": None}
    p10, p50, p90 = numeric.percentiles(list(values.values()), (10, 50, 90))
    return {f"{name}_p10": round(p10, 4), f"{name}_p50": round(p50, 4), f"{name}_p90": round(p90, 4)}


def _spread(name: str, label: str, unit: str, figures: dict[int, dict[str, float]]) -> MetricSpread | None:
    values = {rank: figure[name] for rank, figure in figures.items() if name in figure}
    if len(values) < 2:
        return None
    data = list(values.values())
    low, p10, p50, p90, high = numeric.percentiles(data, (0, 10, 50, 90, 100))
    return MetricSpread(
        name=name, label=label, unit=unit, ranks=len(values), min=round(low, 4), p10=round(p10, 4), p50=round(p50, 4),
        p90=round(p90, 4), max=round(high, 4), histogram=histogram(data, low, high), outliers=outliers(values, unit),
    )  # fmt: skip


def histogram(values: list[float], low: float, high: float, bins: int = HISTOGRAM_BINS) -> tuple[int, ...]:
    """Counts of values in ``bins`` equal bins from ``low`` to ``high`` (one bin when all are equal)."""
    if high <= low:
        return (len(values),)
    counts = [0] * bins
    for value in values:
        counts[min(bins - 1, int((value - low) / (high - low) * bins))] += 1
    return tuple(counts)


def outliers(values: dict[int, float], unit: str) -> tuple[tuple[int, float, float], ...]:
    """(rank, value, robust z) of the ranks beyond the cut, farthest first; none when too many are (a group, then)."""
    middle = numeric.median(list(values.values()))
    mad = numeric.median([abs(value - middle) for value in values.values()])
    least = thresholds.RANK_OUTLIER_MIN_PP if unit == "%" else thresholds.RANK_OUTLIER_MIN_MS
    least = max(least, thresholds.RANK_OUTLIER_MIN_DIFF * abs(middle))
    found = []
    for rank, value in values.items():
        off = value - middle
        if abs(off) < least:
            continue
        z = 0.6745 * off / mad if mad > 0 else (999.0 if off > 0 else -999.0)
        if abs(z) > thresholds.RANK_OUTLIER_Z:
            found.append((rank, round(value, 4), round(max(-999.0, min(999.0, z)), 2)))
    if len(found) > thresholds.RANK_OUTLIER_MAX_SHARE * len(values):
        return ()
    return tuple(sorted(found, key=lambda item: (-abs(item[2]), item[0])))


def _groups(ranks: list[RankReport], figures: dict[int, dict[str, float]]) -> tuple[RankGroup, ...]:
    leaders: list[RankReport] = []
    members: dict[int, list[int]] = {}
    unlike: list[int] = []  # ranks like no group once there are MAX_GROUPS: one bag, so the cost stays ranks x groups
    for rank in sorted(ranks, key=lambda item: item.rank):
        leader = next((other for other in leaders if alike(rank, other, figures)), None)
        if leader is not None:
            members[leader.rank].append(rank.rank)
        elif len(leaders) < MAX_GROUPS:
            leaders.append(rank)
            members[rank.rank] = [rank.rank]
        else:
            unlike.append(rank.rank)
    groups = [_group(members[leader.rank], figures) for leader in leaders]
    groups = sorted(groups, key=lambda group: (-len(group.members), group.representative))
    if unlike:
        groups.append(_group(unlike, figures, alike=False))
    return tuple(groups)


def _group(members: list[int], figures: dict[int, dict[str, float]], *, alike: bool = True) -> RankGroup:
    first = members[0]
    return RankGroup(ranks=rank_ranges(members), members=tuple(members), representative=first,
                     profile={key: round(value, 4) for key, value in figures[first].items()}, alike=alike)  # fmt: skip


def alike(one: RankReport, other: RankReport, figures: dict[int, dict[str, float]]) -> bool:
    """Whether two ranks spend their steps alike: every share within a few points, step times within a tenth."""
    shares, others = one.step_breakdown_pct, other.step_breakdown_pct
    if any(abs(shares.get(key, 0.0) - others.get(key, 0.0)) > thresholds.RANK_GROUP_SHARE_PP for key in {*shares, *others}):
        return False
    step, other_step = figures[one.rank].get("step_ms"), figures[other.rank].get("step_ms")
    if step is None or other_step is None:
        return step is None and other_step is None
    return abs(step - other_step) <= thresholds.RANK_GROUP_STEP * max(step, other_step)
