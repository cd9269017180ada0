"""hot_op: one op holding the step, or a fallback kernel on the hot path (issue 35).

The threshold tests write small Kineto traces (tests/tracebuilder.py) and run the real loader, analyses and rules:
each side of the dominant-op share, its floor, the fallback share, a matrix multiply dominating (an info note on a
CPU, nothing on a device), a fallback convolution's kernels on a device. The scenario tests run
examples/scenarios/sort_for_topk.py and float64_conv.py under `skalpel run`, planted and fixed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from skalpel.analysis.bundle import run_analyses
from skalpel.analysis.op_sources import MODEL
from skalpel.api import analyze
from skalpel.diagnose import lookup, thresholds
from skalpel.trace.loader import load
from skalpel.trace.opnames import FALLBACK_KERNELS
from tests.tracebuilder import TraceBuilder

REPO = Path(__file__).resolve().parent.parent
STEP_US = 10_000.0
LIMITS = thresholds.HOT_OP


def _cpu_steps(ops: list[tuple[str, float]], *, count: int = 4, step_us: float = STEP_US) -> TraceBuilder:
    """A CPU-only trace of ``count`` steps, each running these (op, microseconds) back to back from its start."""
    builder = TraceBuilder()
    builder.device_properties = []
    for number in range(count):
        start = number * step_us
        builder.step(number + 1, start, step_us - 1)
        at = start + 5
        for name, dur in ops:
            builder.host(name, at, dur)
            at += dur + 2
    return builder


def _hot(builder: TraceBuilder, tmp_path: Path):
    report = analyze(builder.write(tmp_path / "trace.json"))
    return [finding for finding in report.findings if finding.id == "hot_op"], report


@pytest.mark.parametrize(("share", "fires"), [(0.6, True), (0.4, False)])
def test_one_op_over_half_the_step_leads_the_verdict(tmp_path, share, fires):
    """One op taking 60% of each 10 ms step leads the verdict (no "no bottleneck"); at 40% the others are not
    judged and the verdict stays no_bottleneck."""
    rest = (1 - share) * STEP_US * 0.9 / 3
    found, report = _hot(_cpu_steps([("aten::sort", share * STEP_US), ("aten::add", rest), ("aten::mul", rest),
                                     ("aten::sub", rest)]), tmp_path)  # fmt: skip
    serious = [finding for finding in found if finding.severity != "info"]
    if not fires:
        assert serious == [] and report.findings[0].id == "no_bottleneck"
        return
    assert report.findings[0].id == "hot_op", [f.id for f in report.findings]
    assert "no_bottleneck" not in [finding.id for finding in report.findings]
    evidence = found[0].evidence
    assert evidence["op"] == "aten::sort" and evidence["kind"] == "dominant"
    assert evidence["share_pct"] == pytest.approx(60, abs=1)
    assert evidence["ms_per_step"] == pytest.approx(6.0, abs=0.1)
    assert evidence["calls_per_step"] == 1
    assert evidence["next_ops"][0]["share_pct"] < 20
    assert "topk" in found[0].fix  # the cheaper formulation known for a sort


def test_a_short_step_is_under_the_floor(tmp_path):
    """60% of a 1 ms step is 0.6 ms: under the floor, no warning."""
    found, _ = _hot(_cpu_steps([("aten::sort", 600.0), ("aten::add", 100.0)], step_us=1000.0), tmp_path)
    assert LIMITS.floor > 0.6
    assert [finding for finding in found if finding.severity != "info"] == []


def test_a_matrix_multiply_holding_a_cpu_step_is_an_info_note(tmp_path):
    """A CPU step dominated by aten::mm is the model's compute: an info note, and no_bottleneck still leads."""
    found, report = _hot(_cpu_steps([("aten::mm", 8000.0), ("aten::add", 500.0)]), tmp_path)
    assert len(found) == 1 and found[0].severity == "info" and found[0].evidence["kind"] == "compute"
    assert report.findings[0].id == "no_bottleneck"


ACCUMULATE = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"


def _steps_with_one_stalled(stall_us: dict[int, float], *, count: int = 4) -> TraceBuilder:
    """A compiled loop's CPU steps of 2.7 ms: CompiledFunction 1 ms, aten::mm 0.6 ms, six 3 us AccumulateGrad calls;
    in the steps of ``stall_us`` (position: microseconds) one AccumulateGrad call runs that long and its step grows
    by as much: a CI beside busy loops kept the process off its core inside it for 16.4 ms."""
    builder = TraceBuilder()
    builder.device_properties = []
    start = 0.0
    for position in range(count):
        stall = stall_us.get(position, 0.0)
        length = 2_700.0 + stall
        builder.step(position + 1, start, length - 1)
        at = start + 5
        for name, dur in [("CompiledFunction", 1_000.0), ("aten::mm", 600.0)]:
            builder.host(name, at, dur)
            at += dur + 2
        for call in range(6):
            dur = stall if call == 4 and stall else 3.0
            builder.host(ACCUMULATE, at, dur)
            at += dur + 2
        start += length
    return builder


def test_one_call_stalled_by_the_scheduler_is_no_op_holding_the_step(tmp_path):
    """One AccumulateGrad call stretched to 16.4 ms by preemption in one step of four makes 53% of the window's
    time: no warning, the op holds one step and ~0.7% of the others (the median unit). Twin: the same 16.4 ms call
    in every step holds the step, and fires."""
    (tmp_path / "stalled").mkdir(), (tmp_path / "held").mkdir()
    found, report = _hot(_steps_with_one_stalled({1: 16_400.0}), tmp_path / "stalled")
    assert [finding for finding in found if finding.severity != "info"] == [], [f.title for f in report.findings]
    (held,), _ = _hot(_steps_with_one_stalled({0: 16_400.0, 1: 16_400.0, 2: 16_400.0, 3: 16_400.0}), tmp_path / "held")
    assert held.severity != "info" and held.evidence["op"] == ACCUMULATE
    assert held.evidence["typical_share_pct"] == pytest.approx(held.evidence["share_pct"], abs=1)
    assert held.evidence["typical_share_pct"] >= LIMITS.share_pct


@pytest.mark.parametrize(("share", "fires"), [(0.3, True), (0.1, False)])
def test_a_fallback_kernel_counts_from_a_smaller_share(tmp_path, share, fires):
    """A reference convolution fires from fallback_share_pct of the step (20%), well under the dominant op's 50%."""
    rest = (1 - share) * STEP_US * 0.9 / 3
    found, _ = _hot(_cpu_steps([("aten::_slow_conv2d_forward", share * STEP_US), ("aten::add", rest),
                                ("aten::mul", rest), ("aten::sub", rest)]), tmp_path)  # fmt: skip
    serious = [finding for finding in found if finding.severity != "info"]
    if not fires:
        assert serious == []
        return
    assert len(serious) == 1 and serious[0].evidence["kind"] == "fallback"
    assert serious[0].evidence["share_pct"] == pytest.approx(100 * share, abs=1)
    assert LIMITS.param("fallback_share_pct") <= 100 * share < LIMITS.share_pct
    assert "float32" in serious[0].fix and "float64" in serious[0].fix


def _device_steps(op: str) -> TraceBuilder:
    """Three 10 ms GPU steps; ``op`` launches one kernel filling 9 ms of each."""
    builder = TraceBuilder()
    for number in range(3):
        start = number * STEP_US
        builder.step(number + 1, start, STEP_US - 1)
        external = builder.host(op, start + 5, 100)
        builder.launch(start + 10, 5, work_ts=start + 200, work_dur=9000, external=external)
    return builder


def test_a_gemm_holding_the_device_is_healthy(tmp_path):
    found, _ = _hot(_device_steps("aten::mm"), tmp_path)
    assert found == []


def test_a_fallback_convolution_on_the_device_is_named(tmp_path):
    found, _ = _hot(_device_steps("aten::_slow_conv2d_forward"), tmp_path)
    assert len(found) == 1
    evidence = found[0].evidence
    assert evidence["kind"] == "fallback" and evidence["time"] == "device" and evidence["calls_per_step"] == 1
    assert evidence["share_pct"] == pytest.approx(90, abs=2) and found[0].severity == "critical"
    assert "cudnn" in found[0].fix.lower()


def test_held_ops_leave_one_time_work_out_and_count_calls_outermost(tmp_path):
    """The analysis hot_op reads: a slow first sort (one-time work) and the sort inside it are not the op's time;
    a sort run inside its overload is one call; the heavier calls are the ones located."""
    builder = TraceBuilder()
    builder.device_properties = []
    for number in range(4):
        start = number * 60_000.0
        builder.step(number + 1, start, 59_000)
        outer = 50_000.0 if number == 0 else 5_000.0  # the first call is ten times the later ones: one-time work
        builder.host("aten::sort", start + 5, outer)
        builder.host("aten::sort", start + 10, 4_000)  # its overload, inside it
        builder.host("aten::mm", start + outer + 20, 1_000)
    analyses = run_analyses(load(builder.write(tmp_path / "trace.json")))
    held = analyses.held_ops.for_rank(0)
    assert [op.name for op in held.ops] == ["aten::sort", "aten::mm"]
    assert held.ops[0].self_ms == pytest.approx(3 * 5.0)  # outer 1 ms + inner 4 ms self, the first step's left out
    assert held.ops[1].library_compute and not held.ops[0].library_compute
    assert not any(op.reference for op in held.ops) and held.reference is None
    assert held.top.ops == ("aten::sort",) and held.top.calls == 3 and held.top.source == MODEL
    assert len(held.top.located) == 3  # the inner sorts: 4 ms of self time each against the outer ones' 1 ms
    assert (analyses.trace.dur[held.top.located] == 4_000).all()


# --- real runs ------------------------------------------------------------------------------------------------

SCENARIOS = REPO / "examples" / "scenarios"
QUICK = ("--wait", "0", "--warmup", "1", "--active", "4", "--stop-after-capture")
RUNS = {"sort": ("sort_for_topk.py",), "topk": ("sort_for_topk.py", "--topk"), "float64": ("float64_conv.py",),
        "float32": ("float64_conv.py", "--float32")}  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The four runs, started at once; each test waits for its own."""
    root = tmp_path_factory.mktemp("hot_op")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    processes = {}
    for name, (script, *args) in RUNS.items():
        log = open(root / f"{name}.log", "wb")
        processes[name] = subprocess.Popen([sys.executable, "-m", "skalpel", "run", *QUICK, "--out", str(root / name),
                                            str(SCENARIOS / script), *args], cwd=REPO, env=env, stdout=log,
                                           stderr=subprocess.STDOUT)  # fmt: skip

    def report(name: str) -> dict:
        status = processes[name].wait(timeout=900)
        assert status == 0, (root / f"{name}.log").read_text(errors="replace")[-3000:]
        return json.loads((root / name / "report.json").read_text())

    yield report
    for process in processes.values():
        if process.poll() is None:
            process.kill()


def _code_findings(report: dict) -> list[dict]:
    """The findings about the code, in the report's order (the machine's measurement findings left out)."""
    return [finding for finding in report["findings"] if lookup(finding["id"]).family != "measurement"]


def _planted_line(script: str) -> int:
    return next(number for number, line in enumerate((SCENARIOS / script).read_text().splitlines(), 1)
                if "# PLANTED" in line)  # fmt: skip


@pytest.mark.slow
def test_a_sort_where_topk_would_do_leads_the_verdict(runs):
    report = runs("sort")
    lead = _code_findings(report)[0]
    assert lead["id"] == "hot_op" and lead["severity"] in ("warning", "critical"), lead
    assert "no_bottleneck" not in [finding["id"] for finding in report["findings"]]
    evidence = lead["evidence"]
    assert evidence["op"] == "aten::sort" and evidence["kind"] == "dominant"
    assert evidence["share_pct"] >= 50 and evidence["ms_per_step"] > LIMITS.floor
    assert evidence["calls_per_step"] >= 1 and evidence["input_shapes"].startswith("[[256,4096]")
    line = _planted_line("sort_for_topk.py")
    assert Path(lead["locations"][0]).name == f"sort_for_topk.py:{line} in best_scores", lead["locations"]
    assert "topk" in lead["fix"] and "sort_for_topk.py" in lead["fix"]


@pytest.mark.slow
def test_a_float64_convolution_is_named_as_a_fallback_kernel(runs):
    report = runs("float64")
    lead = _code_findings(report)[0]
    assert lead["id"] == "hot_op" and lead["severity"] in ("warning", "critical"), lead
    evidence = lead["evidence"]
    assert evidence["kind"] == "fallback" and set(evidence["ops"]) <= FALLBACK_KERNELS
    assert {"aten::_slow_conv2d_forward", "aten::_slow_conv2d_backward"} <= set(evidence["ops"])
    assert evidence["share_pct"] >= 50 and evidence["calls_per_step"] >= 6  # 3 convolutions, forward and backward
    assert any(Path(location).name.startswith("float64_conv.py:") and location.endswith("in train_step")
               for location in lead["locations"]), lead["locations"]  # fmt: skip
    assert "float32" in lead["fix"] and "float64" in lead["fix"]
    # the forward's kernels run in the model's three Conv2d modules (the backward's outside any module)
    assert evidence["module"] == "Sequential > Conv2d" and evidence["module_instances"] == 3, evidence
    assert evidence["module_op"] in evidence["ops"] and evidence["module_share_pct"] >= 90
    assert "in Sequential > Conv2d ×3" in lead["title"] and "float64_conv.py" in evidence["module_location"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["topk", "float32"])
def test_the_fixed_twins_raise_no_hot_op_warning(runs, name):
    """The same scripts with topk, and in float32 on oneDNN: matmuls or convolutions hold the step, the model's
    compute; at most an info note says so, and no fallback kernel runs."""
    report = runs(name)
    found = [finding for finding in report["findings"] if finding["id"] == "hot_op"]
    assert all(finding["severity"] == "info" and finding["evidence"]["kind"] == "compute" for finding in found), found
    ops = {row["name"] for row in report["ranks"][0]["top_ops"]}
    assert not ops & FALLBACK_KERNELS
    assert "aten::sort" not in ops or name != "topk"
