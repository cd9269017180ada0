"""A rule says where it is judged (Rule.scope); the job machinery takes the job-level set from the registry."""

from __future__ import annotations

import dataclasses

import pytest

from skalpel.diagnose import registry
from skalpel.diagnose.registry import JOB_RULES, RULES, judged_rules
from skalpel.job import join, rank

from .conftest import corpus


def test_job_rules_come_from_the_rules_scope() -> None:
    assert JOB_RULES == {rule.id for rule in RULES if rule.scope == "job"}
    # the rules that compare ranks, and the one that reads the capture's CPU facts, need the whole job
    assert {"straggler_rank", "communication_bound", "low_comm_overlap", "cpu_contention"} <= JOB_RULES
    assert {"dataloader_bound", "gpu_idle", "host_device_sync"}.isdisjoint(JOB_RULES)  # one rank's events suffice
    assert {rule.scope for rule in RULES} == {"rank", "job"}


def test_the_job_machinery_uses_the_registry_set() -> None:
    assert rank.JOB_RULES is registry.JOB_RULES and join.JOB_RULES is registry.JOB_RULES


def test_a_rank_worker_judges_every_rule_but_the_job_level_ones() -> None:
    summary = rank.summarize_rank(rank.SummaryRequest(corpus("hta/trace_filter/sampled_rank-0.json.gz"), job_ranks=2))
    assert isinstance(summary, rank.RankSummary)
    assert set(summary.outcomes) == {rule.id for rule in judged_rules()} - JOB_RULES


def test_an_unknown_scope_is_refused() -> None:
    with pytest.raises(ValueError, match="scope must be 'rank' or 'job'"):
        dataclasses.replace(registry.BY_ID["gpu_idle"], scope="node")
