"""gpu_idle and launch_bound judge the steady state where the ledger found units after one-time work.

The shape of a V100 ResNet-50 trace recorded with the old autograd API (no ProfilerStep markers): in the first
iteration each convolution kernel's first launch loads its module (30 launches of 5 ms, 150 ms between device work,
~75% of the window), the later ones keep the device ~95% busy with 800 kernels each, most shorter than their launch.
cold_start reports the first iteration; gpu_idle and launch_bound must not read its 150 ms as a device starved by
launches. The twin launches the same number of tiny kernels only, so the device idles between them in every
iteration: genuinely launch bound, it still fires.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from skalpel.api import analyze
from skalpel.report.terminal import render_text
from tests.tracebuilder import TraceBuilder

LOADER = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"
ITERATIONS = 6
FIRST_LAUNCH_US = 5_000.0


def _loop(*, busy: bool) -> TraceBuilder:
    """Six unmarked iterations, each a fetch, 800 launches 12 us apart (8 us calls) and a sync; the first launches 30
    convolution kernels for the first time first. ``busy``: 300 of the kernels run 40 us (the device stays busy),
    else all 800 run 5 us."""
    builder = TraceBuilder()
    builder.device_properties = [{"id": 0, "name": "Tesla V100-SXM2-16GB", "totalGlobalMem": 16 * 2**30}]
    ts = 0.0
    for iteration in range(ITERATIONS):
        builder.host(LOADER, ts, 100, cat="user_annotation")
        ts += 110
        device = ts
        for first in range(30 if iteration == 0 else 0):  # each kernel's module loaded at its first launch (lazy)
            external = builder.host("aten::convolution", ts, FIRST_LAUNCH_US + 20)
            builder.launch(ts + 5, FIRST_LAUNCH_US, work_ts=ts + FIRST_LAUNCH_US + 10, work_dur=20, external=external,
                           kernel=f"implicit_convolve_sgemm_{first}")  # fmt: skip
            ts += FIRST_LAUNCH_US + 30
            device = ts
        for index in range(800):
            duration = 40.0 if busy and index % 8 in (0, 3, 5) else 5.0
            external = builder.host("aten::add", ts, 10)
            device = max(device, ts + 20)
            builder.launch(ts + 1, 8, work_ts=device, work_dur=duration, external=external, kernel="elementwise_add")
            device += duration + 1
            ts += 12
        builder.runtime("cudaStreamSynchronize", ts, max(device - ts, 0) + 5)
        ts = max(ts, device) + 10
    return builder


def _found(tmp_path: Path, busy: bool):
    report = analyze(_loop(busy=busy).write(tmp_path / "trace.json"), workers=1)
    return report, {f.id: f for f in report.findings if f.id != "not_judged"}


def test_a_cold_first_iteration_is_cold_start_not_idle_or_launch_bound(tmp_path: Path) -> None:
    report, found = _found(tmp_path, busy=True)
    said = [(f.id, f.severity, f.title) for f in report.findings]
    assert found["cold_start"].severity == "critical", said
    assert "gpu_idle" not in found and "launch_bound" not in found, said


def test_a_launch_bound_loop_after_the_same_cold_start_still_fires(tmp_path: Path) -> None:
    report, found = _found(tmp_path, busy=False)
    said = [(f.id, f.severity, f.title) for f in report.findings]
    assert "launch_bound" in found and "gpu_idle" in found, said
    idle = found["gpu_idle"]
    assert "iterations found from the loop after one-time work" in idle.title, idle.title
    assert idle.evidence["steps"] == ITERATIONS - 1  # the first, with the first launches, left out
    assert idle.evidence["idle_pct"] == pytest.approx(100.0 * 7 / 12, abs=8.0)  # 5 us kernels, a launch every 12 us
    assert idle.evidence["idle_ms_per_step"] < 10.0  # an iteration's, not the 150 ms of first launches
    assert found["launch_bound"].evidence["kernels_per_step"] == pytest.approx(800.0, rel=0.2)  # per iteration
    assert found["launch_bound"].evidence["gpu_idle_pct"] >= 30.0


def test_the_header_counts_the_iterations_the_findings_judge(tmp_path: Path) -> None:
    report, _ = _found(tmp_path, busy=False)
    text = " ".join(render_text(report).split())
    assert f"1 pseudo-step (no ProfilerStep markers; {report.loop_iterations()} iterations found from the loop)" in text
    assert report.loop_iterations() >= ITERATIONS
