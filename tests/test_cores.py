"""skalpel.cores is the one answer to "how many cores may this process use"; the capture and the job pool ask it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from skalpel import cores
from skalpel.job import pool


def test_affinity_is_the_process_cpu_count() -> None:
    expected = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert cores.affinity_cores() == expected
    assert 1 <= cores.usable_cores() <= cores.affinity_cores()
    assert 1 <= cores.idle_cores() <= cores.usable_cores()


def test_runnable_tasks_reads_loadavg(tmp_path: Path) -> None:
    loadavg = tmp_path / "loadavg"
    loadavg.write_text("0.50 0.40 0.30 7/300 12345\n")
    assert cores.runnable_tasks(loadavg) == 7
    loadavg.write_text("0.50 0.40\n")
    assert cores.runnable_tasks(loadavg) is None
    assert cores.runnable_tasks(tmp_path / "missing") is None


def test_the_job_pool_defaults_to_the_affinity(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --workers, the ranks are reduced by as many processes as the affinity has cores (not the quota)."""
    seen = []
    monkeypatch.setattr(pool, "affinity_cores", lambda: 1)  # one core: in this process, one rank after another
    results = pool.summarize_all([object(), object()], task=lambda request, report: seen.append(os.getpid()) or request)
    assert len(results) == 2 and seen == [os.getpid(), os.getpid()]


def test_capture_facts_take_their_cores_from_skalpel_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    from skalpel.capture import cpu

    monkeypatch.setattr(cores, "cgroup_quota_cores", lambda: 1.23456)
    monkeypatch.setattr(cores, "affinity_cores", lambda: 3)
    start = cpu.snapshot()
    facts = cpu.facts(start, cpu.snapshot(), steps=1)
    assert facts["cores_available"] == 3 and facts["cpu_quota_cores"] == 1.23  # recorded to 2 decimals
    monkeypatch.setattr(cores, "cgroup_quota_cores", lambda: None)
    assert cpu.facts(start, cpu.snapshot(), steps=1)["cpu_quota_cores"] is None
