"""The registry keeps its conventions: every finding id declared once, documented, thresholded and tested."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from skalpel.cli import main
from skalpel.diagnose import REDIRECTS, RULES, lookup, thresholds
from skalpel.diagnose.rule import DOC_HEADINGS

from .conftest import DESIGN, STRICT

TESTS = Path(__file__).resolve().parent
DESIGN_IDS = {
    "dataloader_bound", "pageable_memcpy", "host_device_sync", "gpu_idle", "launch_bound", "communication_bound",
    "low_comm_overlap", "straggler_rank", "recompilation", "attention_hotspot", "memory_growth", "memory_spike",
    "no_warmup", "too_few_steps", "noisy_measurement", "profiler_overhead",
}  # fmt: skip
IDS = [rule.id for rule in RULES]


def test_every_design_finding_is_registered():
    assert DESIGN_IDS <= set(IDS)
    if not DESIGN.exists():
        assert not STRICT, f"{DESIGN} not found: CI checks the registry against its table (SKALPEL_CI=1)"
    else:  # the table in DESIGN.md is the catalogue
        table = DESIGN.read_text().split("## Findings to know", 1)[1].split("## ", 1)[0]
        first_cells = [row.split("|")[1] for row in table.splitlines() if row.startswith("| `")]
        listed = {name for cell in first_cells for name in re.findall(r"`([a-z_]+)`", cell)}
        assert len(listed) >= 16
        assert listed <= set(IDS), sorted(listed - set(IDS))


def test_ids_are_unique_and_redirects_point_at_live_ids():
    assert len(IDS) == len(set(IDS))
    for old, new in REDIRECTS.items():
        assert old not in IDS, f"redirect {old} shadows a live id"
        assert new in IDS
        assert lookup(old).id == new


@pytest.mark.parametrize("rule", RULES, ids=IDS)
def test_rule_is_documented_under_the_fixed_headings(rule):
    sections = rule.docs.sections()
    assert tuple(sections) == DOC_HEADINGS
    for heading, body in sections.items():
        assert len(body) > 30, f"{rule.id}: '{heading}' is too short"
    assert rule.severity in ("critical", "warning", "info")
    assert re.fullmatch(r"[a-z][a-z_]+", rule.id)


@pytest.mark.parametrize("rule", RULES, ids=IDS)
def test_rule_thresholds_live_in_the_thresholds_module(rule):
    declared = [value for value in vars(thresholds).values() if isinstance(value, thresholds.Threshold)]
    if rule.family != "verdict":
        assert any(rule.thresholds is value for value in declared), f"{rule.id}: threshold declared outside thresholds.py"
    assert rule.thresholds.floor > 0
    # a bottleneck needs both a share and an absolute floor; a stopped job (hang) is a fact: a mismatch, a dead rank
    if rule.family not in ("measurement", "verdict", "hang"):
        assert rule.thresholds.share_pct is not None and rule.thresholds.share_pct > 0


def _negative(test: ast.expr) -> bool:
    """``assert not x``, ``assert a not in b``, ``assert x == []``: asserts that a finding is absent."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return True
    if isinstance(test, ast.Compare):
        if any(isinstance(op, ast.NotIn) for op in test.ops):
            return True
        return any(isinstance(side, (ast.List, ast.Tuple, ast.Set, ast.Dict)) and not getattr(side, "elts", None)
                   and not getattr(side, "keys", None) for side in test.comparators)  # fmt: skip
    return False


def _ids_in(node: ast.AST) -> set[str]:
    return {item.value for item in ast.walk(node) if isinstance(item, ast.Constant) and item.value in IDS}


def _asserted_ids(function: ast.FunctionDef) -> set[str]:
    """Finding ids a test asserts are present: in an assert that is not an absence check, as the argument of a
    finder (``_finding(report, "id")``, ``_found(...)``, which assert or unpack), or in a variable such an
    assert then reads (``found = [f for f in ... if f.id == "id"]; assert len(found) == 1``)."""
    asserts = [node for node in ast.walk(function) if isinstance(node, ast.Assert)]
    positive = [node.test for node in asserts if not _negative(node.test)]
    negative = {id(item) for node in asserts if _negative(node.test) for item in ast.walk(node.test)}
    ids = set().union(*(_ids_in(test) for test in positive)) if positive else set()
    read = {item.id for test in positive for item in ast.walk(test) if isinstance(item, ast.Name)}
    for node in ast.walk(function):
        if isinstance(node, ast.Call) and id(node) not in negative:
            name = getattr(node.func, "id", getattr(node.func, "attr", ""))
            if "find" in name or "found" in name:
                ids |= {value for arg in node.args for value in _ids_in(arg)}
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in read for t in node.targets):
            ids |= _ids_in(node.value)
    return ids


def _corpus_expectations() -> set[str]:
    """Ids that test_findings_corpus.py's table (``CASES``: path, {id: minimum severity}, absent...) expects present:
    ``test_expected_findings`` asserts each one is in the report at that severity or above."""
    tree = ast.parse((TESTS / "test_findings_corpus.py").read_text())
    (table,) = [node.value for node in tree.body if isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "CASES" for t in node.targets)]  # fmt: skip
    return {key.value for case in ast.walk(table) if isinstance(case, ast.Tuple) and len(case.elts) > 1
            and isinstance(case.elts[1], ast.Dict)
            for key in case.elts[1].keys if isinstance(key, ast.Constant)}  # fmt: skip


def _tests_asserting() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(TESTS.glob("test_*.py")):
        if path.name == Path(__file__).name:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                for finding_id in _asserted_ids(node):
                    found.setdefault(finding_id, []).append(f"{path.name}::{node.name}")
    for finding_id in _corpus_expectations():
        found.setdefault(finding_id, []).append("test_findings_corpus.py::test_expected_findings")
    return found


def test_every_rule_has_a_test_that_asserts_its_finding():
    """Not a mention (an id in a list of ignored findings counts for nothing): an assertion that it is there."""
    asserted = _tests_asserting()
    missing = [finding_id for finding_id in IDS if finding_id not in asserted]
    assert missing == [], f"no test asserts these findings are produced: {missing}"


def test_a_mention_or_an_absence_check_is_not_a_test_of_a_finding():
    source = """
def test_mentions():
    ignored = ("no_warmup", "cpu_contention")
    serious = [f for f in findings if f.id not in ignored]
    assert serious == []
    assert not [f for f in findings if f.id == "memory_spike"]
    assert _found(report, "gpu_idle") == []

def test_asserts():
    found = [f for f in findings if f.id == "memory_growth"]
    assert len(found) == 1
    assert "launch_bound" in ids
    (spike,) = _found(report, "allocator_churn")
"""
    mentions, asserts = [node for node in ast.parse(source).body]
    assert _asserted_ids(mentions) == set()
    assert _asserted_ids(asserts) == {"memory_growth", "launch_bound", "allocator_churn"}


def test_explain_lists_every_finding(capsys):
    assert main(["explain"]) == 0
    out = capsys.readouterr().out
    for finding_id in IDS:
        assert finding_id in out


def test_explain_one_finding_prints_docs_and_thresholds(capsys):
    assert main(["explain", "dataloader_bound"]) == 0
    out = capsys.readouterr().out
    for heading in DOC_HEADINGS:
        assert heading in out
    assert ">= 10% of the step and >= 5 ms/step" in out


def test_explain_json_and_redirects(capsys):
    assert main(["explain", "data_loader_bound", "--json"]) == 0  # a renamed id still answers
    data = json.loads(capsys.readouterr().out)
    assert data["id"] == "dataloader_bound"
    assert data["thresholds"]["share_pct"] == 10.0 and data["thresholds"]["floor"] == 5.0
    assert set(data["docs"]) == set(DOC_HEADINGS)
    assert main(["explain", "--json"]) == 0
    assert [item["id"] for item in json.loads(capsys.readouterr().out)] == IDS


def test_explain_unknown_id_is_a_one_line_error(capsys):
    assert main(["explain", "no_such_finding"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("skalpel: error: unknown finding id") and err.count("\n") == 1
