"""A finding that several ranks of a job raise alike is one finding: its ranks, its key number's spread, the worst.

A per-rank rule judges each rank alone, so a job of 256 alike ranks used to say the same thing
256 times. Here the findings of one rule on several ranks become one: ``rank`` None, ``ranks``
the ranks it holds on, ``across`` their ranges, the spread (min, median, max) of its key number
(the first number of its evidence that every rank gives), the worst ranks (largest first), and
each rank's own finding (``per_rank``) as it was. Its title, evidence, locations and fix are the
worst rank's. A finding on part of the job only (one rank, or a few) says how those ranks differ
from the rest, by the job summary's figures (``job/summary.py``).

The n-th finding of a rule on a rank goes with the n-th of that rule on every other rank (a rule
may raise two findings on a rank). Job-wide findings (no rank) are left as they are.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

from ..analysis import numeric
from ..diagnose.thresholds import WORST_RANKS
from ..result.report import SEVERITIES, AcrossRanks, Finding, RankReport
from .summary import FIGURES, rank_figures


def across_ranks(findings: tuple[Finding, ...], ranks: tuple[RankReport, ...]) -> tuple[Finding, ...]:
    """``findings`` with each rule's findings on several ranks merged into one, in the place of the first."""
    if len(ranks) < 2:
        return findings
    keys: dict[int, tuple[str, int]] = {}
    seen: dict[tuple[str, int], int] = defaultdict(int)
    groups: dict[tuple[str, int], list[Finding]] = defaultdict(list)
    for index, finding in enumerate(findings):
        if finding.rank is None:
            continue
        nth = seen[(finding.id, finding.rank)]
        seen[(finding.id, finding.rank)] += 1
        keys[index] = (finding.id, nth)
        groups[(finding.id, nth)].append(finding)
    if not groups:
        return findings
    figures = {rank.rank: rank_figures(rank) for rank in ranks}
    merged: list[Finding] = []
    done: set[tuple[str, int]] = set()
    for index, finding in enumerate(findings):
        key = keys.get(index)
        if key is None:
            merged.append(finding)
        elif key not in done:
            done.add(key)
            merged.append(_merged(groups[key], figures))
    return tuple(merged)


def _merged(members: list[Finding], figures: dict[int, dict[str, float]]) -> Finding:
    members = sorted(members, key=lambda finding: finding.rank)
    ranks = tuple(finding.rank for finding in members)
    key = _key_number(members)
    values = {finding.rank: float(finding.evidence[key]) for finding in members} if key else {}
    worst = sorted(values, key=lambda rank: (-values[rank], rank))
    differs = _differs(set(ranks), figures)
    if len(members) == 1:
        across = AcrossRanks(ranks=str(ranks[0]), count=1, of=len(figures), differs=differs)
        return dataclasses.replace(members[0], across=across)
    across = AcrossRanks.spread_of(values, ranks=ranks, of=len(figures), key=key, worst=WORST_RANKS, differs=differs,
                                   per_rank=tuple(_own(finding) for finding in members))  # fmt: skip
    lead = next(finding for finding in members if finding.rank == worst[0]) if worst else members[0]
    severity = min((finding.severity for finding in members), key=SEVERITIES.index)
    return dataclasses.replace(lead, severity=severity, rank=None, ranks=ranks, across=across)


def _key_number(members: list[Finding]) -> str | None:
    """The first evidence key whose value is a number on every rank's finding."""
    for key, value in members[0].evidence.items():
        if _number(value) and all(_number(finding.evidence.get(key)) for finding in members):
            return key
    return None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _own(finding: Finding) -> dict[str, Any]:
    return {"rank": finding.rank, "severity": finding.severity, "title": finding.title, "evidence": finding.evidence,
            "locations": list(finding.locations)}  # fmt: skip


def _differs(subset: set[int], figures: dict[int, dict[str, float]]) -> str | None:
    """How ``subset`` differs from the job's other ranks: the figure whose medians differ most, relatively."""
    if len(subset) >= len(figures):
        return None
    best: tuple[float, str] | None = None
    for name, label, unit in FIGURES:
        mine = [figure[name] for rank, figure in figures.items() if rank in subset and name in figure]
        rest = [figure[name] for rank, figure in figures.items() if rank not in subset and name in figure]
        if not mine or not rest:
            continue
        here, there = numeric.median(mine), numeric.median(rest)
        gap = abs(here - there) / max(abs(there), abs(here), 1e-9)
        if best is None or gap > best[0]:
            text = (f"{label} {_fmt(here, unit)} on {'it' if len(subset) == 1 else 'them'} vs {_fmt(there, unit)} "
                    f"on the other {len(figures) - len(subset)} rank{'s' if len(figures) - len(subset) > 1 else ''}")  # fmt: skip
            best = (gap, text)
    if best is None:
        return None
    return best[1] if best[0] >= 0.01 else "the job summary's figures are alike on them and on the rest"


def _fmt(value: float, unit: str) -> str:
    return f"{value:.1f}%" if unit == "%" else f"{value:.2f} ms"
