"""What ``skalpel explain`` prints: a finding's docs, thresholds and fix, from the registry (one source)."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from ..analysis.blame import CATEGORIES, CATEGORY_WORDS, PEER_WORDS
from ..analysis.ledger import CAUSE_WORDS, DEVICE_CAUSES, HOST_CAUSES
from ..analysis.options import ALL_ONE_TIME_PCT
from .registry import RULES, lookup
from .rule import Rule
from .watch import BY_ID as WATCH_KINDS


def explain_dict(rule: Rule) -> dict[str, Any]:
    return {
        "id": rule.id,
        "family": rule.family,
        "severity": rule.severity,
        "title": rule.title,
        "needs_device": rule.needs_device,
        "needs_steps": rule.needs_steps,
        "thresholds": rule.thresholds.to_dict(),
        "thresholds_text": rule.thresholds.describe(),
        "fix": rule.fix,
        "docs": rule.docs.sections(),
    }


def explain_all_dicts() -> list[dict[str, Any]]:
    return [explain_dict(rule) for rule in RULES]


def render_rule(rule: Rule) -> Group:
    parts: list = [Text(f"{rule.id}  ({rule.family}, {rule.severity})", style="bold")]
    applies = "GPU traces only" if rule.needs_device else "CPU and GPU traces"
    if rule.family == "watch":
        applies = "skalpel watch, over a whole run (not a finding of a trace)"
    if rule.family == "hang":
        applies = "a run folder of skalpel watch (its hang dumps, collectives, dead ranks) or flight-recorder dumps"
    if rule.needs_steps:
        applies += ", needs ProfilerStep markers"
    parts.append(Text(f"applies to: {applies}"))
    parts.append(Text(f"fires at: {rule.thresholds.describe()}"))
    for heading, body in rule.docs.sections().items():
        parts.append(Text(f"\n{heading}", style="bold underline"))
        parts.append(Text(body))
    if rule.fix:
        parts.append(Text("\nDefault fix", style="bold underline"))
        parts.append(Text(rule.fix))
    return Group(*parts)


def render_table() -> Table:
    table = Table(title="skalpel findings (skalpel explain ID for details)", title_justify="left")
    table.add_column("id", no_wrap=True)
    table.add_column("severity")
    table.add_column("applies to")
    table.add_column("fires at", overflow="fold")
    for rule in RULES:
        applies = "GPU" if rule.needs_device else "CPU+GPU"
        table.add_row(rule.id, rule.severity, applies, rule.thresholds.describe())
    table.caption = f"anomalies skalpel watch judges over a run (skalpel explain KIND): {', '.join(WATCH_KINDS)}"
    table.caption_justify = "left"
    return table


BLAME = "blame"  # not a finding: the causes every idle interval of a step is charged to


def blame_dict() -> dict[str, Any]:
    return {
        "what": "every interval of a step in which the device is idle, charged to what held it back; per step and "
        "summed, the categories add up to the idle time (gpu_idle's evidence: blame_ms_per_step, culprits); on a "
        "CPU-only trace the compute is the main thread's ops and its time outside them is charged the same way",
        "collective_wait_by_peer": PEER_WORDS,
        "categories": {name: CATEGORY_WORDS[name] for name in CATEGORIES},
    }


def render_blame() -> Table:
    table = Table(title="Idle-time causes (each idle interval of a step is charged to one; they add up to the idle "
                  "time)", title_justify="left")  # fmt: skip
    table.add_column("cause", no_wrap=True)
    table.add_column("what holds the device back", overflow="fold")
    for name in CATEGORIES:
        table.add_row(name, CATEGORY_WORDS[name])
    table.caption = f"collective_wait by peer: {PEER_WORDS}"
    table.caption_justify = "left"
    return table


LEDGER = "ledger"  # not a finding: the account of every millisecond the rules read
LEDGER_WHAT = (
    "every millisecond of every unit a rank is judged over (a marked step; without markers an iteration found from "
    "the loop, else the whole window), on the device (all streams merged) and on the host's main thread, charged to "
    "exactly one cause, so each lane's causes add up to the unit; overlapping work counts once, for the first cause "
    "in the lane's order. One-time work is its own cause and is taken out before the steady state is judged; a "
    f"window that is {ALL_ONE_TIME_PCT:.0f}% one-time work or more is judged for nothing else. The rules read their "
    "shares here (waiting for data, collectives, host work), so a fact has one definition."
)


def ledger_dict() -> dict[str, Any]:
    return {
        "what": LEDGER_WHAT,
        "device": {name: CAUSE_WORDS[name] for name in DEVICE_CAUSES},
        "host": {name: CAUSE_WORDS[name] for name in HOST_CAUSES},
    }


def render_ledger() -> Table:
    table = Table(title="The ledger: every millisecond of a unit charged to one cause, in this order of precedence",
                  title_justify="left")  # fmt: skip
    table.add_column("lane", no_wrap=True)
    table.add_column("cause", no_wrap=True)
    table.add_column("what it is", overflow="fold")
    for lane, causes in (("device", DEVICE_CAUSES), ("host", HOST_CAUSES)):
        for name in causes:
            table.add_row(lane, name, CAUSE_WORDS[name])
    table.caption = LEDGER_WHAT
    table.caption_justify = "left"
    return table


def find(finding_id: str) -> Rule | None:
    """A finding, or an anomaly kind of skalpel watch."""
    return lookup(finding_id) or WATCH_KINDS.get(finding_id)
