"""A rule says where it is judged (Rule.scope); the job machinery takes the job-level set from the registry."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from skalpel.diagnose import registry
from skalpel.diagnose.registry import JOB_RULES, RULES, judged_rules
from skalpel.job import join, rank

from .conftest import corpus

DIAGNOSE = Path(registry.__file__).parent
PAIR = "hta/trace_filter"
DLRM = "extra/facebookresearch__param/et_replay/tests/inputs/dlrm_kineto_extracted"


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


# What only a rank's own trace has: its events (``.trace``) and the locator over them. The join holds summaries.
_TRACE_ONLY = {"trace", "locations", "location_in", "inner_locations", "locations_at", "_get_locator", "_locator"}


def _diagnose_functions() -> dict[tuple[str, str], ast.FunctionDef]:
    """(module, name) -> every top-level function of diagnose/, and each module's imports of its siblings."""
    functions: dict[tuple[str, str], ast.FunctionDef] = {}
    for path in sorted(DIAGNOSE.glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef):
                functions[(path.stem, node.name)] = node
    return functions


def _sibling_imports(module: str) -> dict[str, tuple[str, str]]:
    """name -> (module, name) for ``from .other import name`` in a diagnose module."""
    names = {}
    for node in ast.parse((DIAGNOSE / f"{module}.py").read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            for alias in node.names:
                names[alias.asname or alias.name] = (node.module, alias.name)
    return names


def _job_rule_checks() -> dict[str, tuple[str, str]]:
    """rule id -> (module, check function) for the rules of job scope, from their declarations."""
    checks = {}
    for path in sorted(DIAGNOSE.glob("*.py")):
        tree = ast.parse(path.read_text())
        factories = {}  # a module's own function that declares its rules: name -> their check (diagnose/hang.py)
        for function in (node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)):
            for node in ast.walk(function):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Rule":
                    fields = {keyword.arg: keyword.value for keyword in node.keywords}
                    if isinstance(fields.get("id"), ast.Name) and isinstance(fields.get("check"), ast.Name):
                        factories[function.name] = fields["check"].id
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Rule":
                fields = {keyword.arg: keyword.value for keyword in node.keywords}
                if isinstance(fields.get("id"), ast.Constant) and fields["id"].value in JOB_RULES:
                    checks[fields["id"].value] = (path.stem, fields["check"].id)
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in factories and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) and first.value in JOB_RULES:
                    checks[first.value] = (path.stem, factories[node.func.id])
    return checks


def test_no_rule_of_job_scope_reaches_for_a_trace() -> None:
    """Job rules are judged in the join, on summaries: neither they nor any diagnose/ function they call touches
    ``.trace`` or the locator (a rank's own locations travel in its summary: ``RankLocations``)."""
    functions = _diagnose_functions()
    checks = _job_rule_checks()
    assert set(checks) == JOB_RULES
    reached: dict[tuple[str, str], str] = {}
    for rule_id, start in checks.items():
        todo = [start]
        while todo:
            key = todo.pop()
            if key in reached or key not in functions:
                continue
            reached[key] = rule_id
            siblings = _sibling_imports(key[0])
            for node in ast.walk(functions[key]):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                    name = node.func.id
                    todo.append(siblings.get(name, (key[0], name)))
    found = [f"{module}.{name} (reached from {rule_id}): .{node.attr}"
             for (module, name), rule_id in reached.items()
             for node in ast.walk(functions[(module, name)])
             if isinstance(node, ast.Attribute) and node.attr in _TRACE_ONLY]  # fmt: skip
    assert len(reached) > len(checks) and not found, found


@pytest.mark.parametrize("name", [PAIR, DLRM, "hta/critical_path/alexnet"])
def test_job_rules_judge_the_corpus_without_a_rule_error(name: str) -> None:
    """The join gives job rules a JobContext (no locator, no events): none of them fails for want of one."""
    from skalpel.job.report_of import report_of

    report = report_of([corpus(name)], workers=1).report
    assert not [f.title for f in report.findings if "rule error" in f.title]


def test_the_join_holds_no_events_only_the_jobs_facts() -> None:
    """A job rule's analyses come from summaries: no trace to reach for (``analyses.trace`` is None), the ranks and
    the job's warnings in ``analyses.job``; a rank rule's context reads its own trace's."""
    from skalpel.analysis.bundle import run_analyses
    from skalpel.diagnose.rule import Context, JobContext
    from skalpel.trace.loader import load_one

    from .rankjob import joined_analyses

    analyses = joined_analyses(corpus(PAIR))
    assert analyses.trace is None and analyses.job is not None
    assert JobContext(analyses).rank_ids == analyses.job.rank_ids == [0, 1]
    one = run_analyses(load_one(corpus("hta/trace_filter/sampled_rank-1.json.gz")))
    assert one.job is None and Context(one).rank_ids == [1] and Context(one).trace is one.trace
