"""Issue 33's failure classes on their look-alikes (``tests/ledger_lookalikes.py``): each planted case gets the
engineer's verdict and its twin stays as it should, every ledger lane adds up to its units, and no finding quotes a
number larger than the unit it is a part of."""

from __future__ import annotations

from pathlib import Path

import pytest

from skalpel.api import analyze
from tests.ledger_fixtures import assert_no_number_exceeds_its_unit
from tests.ledger_lookalikes import CASES, write

ORDER = ("info", "warning", "critical")
# case -> ({finding id: lowest severity it must have}, ids that must not appear at warning or above)
VERDICTS = {
    "1-unmarked-comm-heavy": ({"communication_bound": "warning", "low_comm_overlap": "warning"}, ()),
    "1-unmarked-comm-light": ({}, ("communication_bound", "low_comm_overlap")),
    "2a-first-calls-only": ({"cold_start": "critical"}, ("gpu_idle", "launch_bound", "host_device_sync", "host_bound")),
    "2b-cuda-only-first-launch": ({"cold_start": "critical"}, ("gpu_idle", "launch_bound", "host_bound")),
    "2c-init-cudafree-then-steps": ({"cold_start": "critical"}, ("gpu_idle", "allocator_churn")),
    "2-twin-allocator-churn": ({"allocator_churn": "warning"}, ("cold_start",)),
    "3-gloo-blocked-in-backward": ({"communication_bound": "warning"}, ("host_bound",)),
    "3-twin-python-busy": ({"host_bound": "warning"}, ("communication_bound",)),
    "4-moe-deepep-4-ranks": ({"communication_bound": "warning"}, ()),
    "4-twin-single-process": ({}, ("communication_bound", "low_comm_overlap")),
    "5-loader-under-queued-work": ({"dataloader_bound": "warning"}, ()),
    "5-twin-loader-fast": ({}, ("dataloader_bound",)),
    "6-bookkeeping-gaps": ({}, ("host_bound",)),
    "6-twin-user-python": ({"host_bound": "warning"}, ()),
    "7-collectives-overlap-each-other": ({"communication_bound": "warning"}, ()),
    "7-twin-one-after-another": ({"communication_bound": "warning"}, ()),
    "8-cublas-workspace": ({}, ("memory_spike",)),
    "8-twin-expand-contiguous": ({"memory_spike": "warning"}, ()),
}


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict:
    folder = tmp_path_factory.mktemp("lookalikes")
    return {case.name: analyze(write(case.build(), folder, case.name), workers=1) for case in CASES}


def test_every_case_has_a_verdict() -> None:
    assert set(VERDICTS) == {case.name for case in CASES}


@pytest.mark.parametrize("name", list(VERDICTS))
def test_the_verdict_is_the_engineers(reports: dict, name: str) -> None:
    report = reports[name]
    expect, absent = VERDICTS[name]
    found: dict[str, list] = {}
    for finding in report.findings:
        found.setdefault(finding.id, []).append(finding)
    said = [(f.id, f.severity, f.title) for f in report.findings if f.id != "not_judged"]
    for finding_id, least in expect.items():
        assert finding_id in found, f"{finding_id} expected: {said}"
        assert max(ORDER.index(f.severity) for f in found[finding_id]) >= ORDER.index(least), said
    for finding_id in absent:
        assert not [f for f in found.get(finding_id, ()) if f.severity != "info"], f"{finding_id} unexpected: {said}"
    assert not any("never communicate" in f.title for f in report.findings if name.startswith("4-moe")), said


@pytest.mark.parametrize("name", list(VERDICTS))
def test_no_number_exceeds_its_unit(reports: dict, name: str) -> None:
    assert_no_number_exceeds_its_unit(reports[name])


def test_the_loader_share_is_the_hosts_wait(reports: dict) -> None:
    """The fetch holds 30% of each step on the host (the GPU still runs queued work for part of it)."""
    finding = next(f for f in reports["5-loader-under-queued-work"].findings if f.id == "dataloader_bound")
    assert finding.evidence["share_pct"] == pytest.approx(30.0, abs=1.5)


def test_the_expert_parallel_all_to_all_is_named(reports: dict) -> None:
    finding = next(f for f in reports["4-moe-deepep-4-ranks"].findings if f.id == "communication_bound")
    assert "all_to_all" in finding.title and finding.evidence["share_pct"] == pytest.approx(44.0, abs=2.0)


def test_a_window_of_one_time_work_says_what_it_did_not_judge(reports: dict) -> None:
    notes = [f for f in reports["2b-cuda-only-first-launch"].findings if f.id == "not_judged"]
    assert any("one-time work" in note.title and "gpu_idle" in note.title for note in notes)


def test_tests_write_where_they_are_told(tmp_path: Path) -> None:
    assert write(CASES[0].build(), tmp_path, "job").is_dir()
