"""The registry keeps its conventions: every finding id declared once, documented, thresholded and tested."""

from __future__ import annotations

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
    if rule.family not in ("measurement", "verdict"):  # a bottleneck needs both a share and an absolute floor
        assert rule.thresholds.share_pct is not None and rule.thresholds.share_pct > 0


@pytest.mark.parametrize("rule", RULES, ids=IDS)
def test_rule_has_a_scenario_or_corpus_test(rule):
    texts = "".join(
        path.read_text()
        for path in TESTS.glob("test_*.py")
        if path.name in ("test_scenarios.py", "test_findings_corpus.py", "test_findings_rules.py")
        or path.name.startswith(("test_distributed", "test_findings"))
    )
    assert f'"{rule.id}"' in texts, f"{rule.id} is checked by no scenario, corpus or rule test"


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
