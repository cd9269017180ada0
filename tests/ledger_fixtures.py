"""Ledgers built by hand, for rule tests that need no trace: a rule reads the ledger's lanes, so a firing case and
its look-alike are a dict of milliseconds each (as ruff keeps a fixture per rule)."""

from __future__ import annotations

from skalpel.analysis.bundle import Analyses
from skalpel.analysis.ledger import Lane, Ledger, LedgerUnit, RankLedger
from skalpel.analysis.steps import Step, StepSegmentation
from skalpel.diagnose.rule import Context


def rank_ledger(*, host: dict[str, float] | None = None, device: dict[str, float] | None = None, units: int = 4,
                rank: int = 0, unit: str = "step") -> RankLedger:  # fmt: skip
    """``units`` equal units whose time on each lane is the given ms by cause (a lane's unit lasts their sum; give
    both lanes the same sum)."""
    lanes = []
    for name, causes in (("device", device), ("host", host)):
        if causes is None:
            continue
        length_us = 1000.0 * sum(causes.values())
        rows = tuple(LedgerUnit(n, n * length_us, (n + 1) * length_us, dict(causes)) for n in range(units))
        lanes.append(Lane(name, "device (all streams)" if name == "device" else "main thread 1", rows))
    return RankLedger(rank, unit, tuple(lanes))


def ledger_context(**lanes) -> Context:
    """A Context holding one rank's hand-built ledger (see ``rank_ledger``) over as many marked steps."""
    found = rank_ledger(**lanes)
    first = found.lanes[0]
    steps = tuple(Step(found.rank, unit.number, unit.start_us, unit.end_us, unit.end_us) for unit in first.units)
    analyses = Analyses(trace=None, steps=StepSegmentation(steps, marked=found.unit == "step"),  # type: ignore[arg-type]
                        ledger=Ledger({found.rank: found}))  # fmt: skip
    return Context(analyses, None)


SHARES = ("share_pct", "exposed_pct", "idle_pct", "overlap_pct", "comm_share_pct")  # parts of a whole: at most 100


def assert_no_number_exceeds_its_unit(report) -> None:
    """Every ledger lane adds up to its units, and no finding quotes a share above 100% or a per-step time above
    the step it is a part of."""
    for rank in report.ranks:
        for lane in rank.ledger.lanes if rank.ledger is not None else ():
            for unit in lane.units:
                assert abs(sum(unit.ms.values()) - unit.length_ms) <= max(1e-3 * unit.length_ms, 1e-3), (rank.rank, lane)
    for finding in report.findings:
        evidence = finding.evidence
        for key, value in evidence.items():
            if (key in SHARES or "share" in key) and isinstance(value, (int, float)):
                assert value <= 100.0 + 1e-6, (finding.id, key, value)
        step = evidence.get("step_ms")
        for key in ("comm_ms_per_step", "ms_per_step", "exposed_ms_per_step"):
            if isinstance(step, (int, float)) and isinstance(evidence.get(key), (int, float)):
                assert evidence[key] <= step + 1e-6, (finding.id, key, evidence[key], step)
