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


@pytest.mark.parametrize(("usable", "threads", "workers", "set_threads"), [
    (1, 1, None, None),  # one core: a worker would only compete with training
    (2, 1, 2, None),  # the starving loop: 2 workers measured 1.7x, 1 worker slower than none (skalpel run said 1)
    (2, 2, 2, 1),  # the threads fill both cores: one given back to the workers
    (4, 1, 4, None),
    (16, 8, 4, None),  # at most MAX_LOADER_WORKERS; 8 threads leave cores free
    (2.5, 4, 2, 1),  # a fractional quota counts its whole cores
])  # fmt: skip
def test_loader_workers_one_per_core_and_threads_that_fill_the_cores_give_one_back(usable, threads, workers,
                                                                                   set_threads) -> None:  # fmt: skip
    assert cores.loader_workers(usable) == workers
    assert cores.threads_beside_workers(usable, threads) == set_threads


def test_run_and_tune_size_the_workers_alike() -> None:
    """skalpel run's DataLoader advice names the num_workers that skalpel tune's candidate tries."""
    from skalpel.diagnose.input import loader_plan
    from skalpel.tune import candidates

    for usable, threads in ((2, 1), (2, 2), (4, 1), (8, 2), (16, 8)):
        plan = loader_plan({"cores_available": usable, "intra_op_threads": threads}, wait_ms=30.0, step_ms=40.0,
                           single=True, device=False, min_speedup=1.0)  # fmt: skip
        tried = candidates.BY_NAME["num_workers"].fix({"threads": threads, "loaders": [{"num_workers": 0}]}, usable)
        assert f"DataLoader(num_workers={tried['dataloader']['num_workers']}," in plan.fix, (usable, threads, plan.fix)
        if "threads" in tried:
            assert f"torch.set_num_threads({tried['threads']})" in plan.fix, (usable, threads, plan.fix)
        else:
            assert "set_num_threads" not in plan.fix, (usable, threads, plan.fix)


def test_the_trace_export_is_left_out_of_the_cpu_window_with_the_waits_of_its_threads() -> None:
    """The export runs between the window's two snapshots: its wall, CPU and run-queue delay all come off. Its
    delay left in made a 0.1 s window of one thread wait 1.8 s (95% contention at load 1.2, 354 ms a 22 ms step)."""
    from skalpel.capture import cpu

    start = cpu.Snapshot(0.0, 0.0, {"1": 100})
    before = cpu.Snapshot(0.1, 0.05, {"1": 200})
    after = cpu.Snapshot(2.1, 0.25, {"1": 1_800_000_200, "2": 50})  # thread 2: born in the export
    end = cpu.left_out(cpu.Snapshot(2.2, 0.3, {"1": 1_800_000_300, "2": 70}), [(before, after)])
    assert (round(end.wall_s, 9), round(end.cpu_s, 9), end.waits_ns) == (0.2, 0.1, {"1": 300, "2": 20})
    assert cpu.facts(start, end, steps=2)["run_queue_wait_s"] == round(220 / 1e9, 4)
    assert cpu.left_out(end, []) == end
