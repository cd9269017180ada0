"""The one table of every finding id, and the redirects of renamed ids.

Ids are public and stable (CI scripts match on them): an id is never reused, and a
renamed id stays in ``REDIRECTS`` so that ``skalpel explain OLD_ID`` still answers.
Rules run in the order of this table; the report sorts findings by severity.
"""

from __future__ import annotations

from . import (
    allocator,
    coldstart,
    cpu,
    device,
    distributed,
    hang,
    host,
    hot_module,
    hot_op,
    input,
    measurement,
    memory,
    peak,
    precision,
    recording,
    sync,
    verdict,
)
from . import compile as compile_rules
from .rule import Rule

_FAMILIES = (input, cpu, sync, device, host, hot_op, hot_module, precision, memory, peak, allocator, compile_rules, distributed,
             measurement, coldstart, recording, hang, verdict)  # fmt: skip

RULES: tuple[Rule, ...] = tuple(rule for family in _FAMILIES for rule in family.RULES)
"""Every finding, in the order the rules run."""

BY_ID: dict[str, Rule] = {rule.id: rule for rule in RULES}

JOB_RULES: frozenset[str] = frozenset(rule.id for rule in RULES if rule.scope == "job")
"""The findings judged once on the whole job (``Rule.scope``); the job's rank workers judge the others."""

REDIRECTS: dict[str, str] = {
    # old id -> current id (never reuse an old id for something else)
    "dataloader": "dataloader_bound",
    "data_loader_bound": "dataloader_bound",
    "sync": "host_device_sync",
    "cuda_sync": "host_device_sync",
    "low_gpu_utilization": "gpu_idle",
    "kernel_launch_bound": "launch_bound",
    "memory_leak": "memory_growth",
    "recompile": "recompilation",
}

if len(BY_ID) != len(RULES):  # pragma: no cover - a duplicate id is a programming error
    raise RuntimeError("duplicate finding id in the registry")


def lookup(finding_id: str) -> Rule | None:
    """The rule for an id, following redirects; None when unknown."""
    return BY_ID.get(REDIRECTS.get(finding_id, finding_id))


def judged_rules() -> tuple[Rule, ...]:
    """The rules that run on analyses (everything but the verdict notes the dispatcher writes)."""
    return tuple(rule for rule in RULES if rule.family != "verdict")
