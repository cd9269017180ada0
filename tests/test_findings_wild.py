"""Findings on traces like those from the wild: unmarked traces, cold starts, allocator churn,
unrecorded device activity, SDPA's slow path, materialised broadcasts, tiny ops by source.

Each test plants one pattern in a small trace in today's Kineto schema (``tests/tracebuilder.py``)
and runs the real loader, analyses and rules; beside it, a look-alike must stay quiet.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from skalpel.api import analyze
from tests.tracebuilder import TraceBuilder

LOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def _report(builder: TraceBuilder, tmp_path: Path):
    return analyze(builder.write(tmp_path / "trace.json"))


def _found(report, finding_id: str, *, serious: bool = False) -> list:
    return [f for f in report.findings if f.id == finding_id and (not serious or f.severity != "info")]


# --- class 2: traces without ProfilerStep markers ------------------------------------------------


def _unmarked_loop(builder: TraceBuilder, loader_us: float, iterations: int = 6) -> None:
    """A training loop without markers: fetch a batch, then 3 ms of device work launched by one op."""
    ts = 0.0
    for _ in range(iterations):
        builder.frame("train.py(30): <module>", ts, loader_us + 3200)
        builder.host(LOADER, ts + 1, loader_us - 2, cat="user_annotation")
        builder.frame("data.py(12): __getitem__", ts + 2, loader_us - 4)
        ts += loader_us
        external = builder.host("aten::mm", ts + 10, 50)
        builder.launch(ts + 20, 10, work_ts=ts + 40, work_dur=3000, external=external)
        ts += 3200


def test_unmarked_trace_judges_the_loader_over_the_whole_window(tmp_path):
    builder = TraceBuilder()
    _unmarked_loop(builder, loader_us=6000)
    report = _report(builder, tmp_path)
    assert report.steps.marked is False
    (loader,) = _found(report, "dataloader_bound")
    assert loader.evidence["judged_over"].startswith("the whole window")
    assert loader.evidence["share_pct"] == pytest.approx(100 * 6 / 9.2, abs=2)
    assert loader.severity == "critical"
    assert any("data.py:12" in where for where in loader.locations)
    (idle,) = _found(report, "gpu_idle")
    assert idle.evidence["judged_over"].startswith("the device's span")
    assert idle.evidence["idle_in_dataloader_pct"] > 90
    assert "DataLoader.__next__" in idle.title and "num_workers" in idle.fix
    assert any("train.py:30" in where or "data.py:12" in where for where in idle.locations)
    assert not [f for f in report.findings if f.id == "not_judged" and "dataloader_bound" in f.evidence["rules"]]


def test_unmarked_trace_with_a_fast_loader_stays_quiet(tmp_path):
    builder = TraceBuilder()
    _unmarked_loop(builder, loader_us=100)
    report = _report(builder, tmp_path)
    assert _found(report, "dataloader_bound") == []
    assert all("DataLoader" not in f.title for f in _found(report, "gpu_idle"))
