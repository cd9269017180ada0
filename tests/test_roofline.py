"""The roofline per op (issue 37): FLOPs and bytes from shapes and dtypes, the roofs, the labels, and why not.

On stored GPU traces the roofs are the datasheet's; on a CPU-only skalpel run they are the machine's own
measurement. A microbenchmark under skalpel run (benchmarks/roofline_micro.py) times each op by hand and labels
it against the same roofs: the labels must agree.
"""

from __future__ import annotations

import dataclasses
import io
import sys
from pathlib import Path

import pytest

from skalpel.analysis.roofline import _work, roofline
from skalpel.analysis.steps import segment_steps
from skalpel.trace import load
from tests.conftest import corpus

ROOT = Path(__file__).resolve().parents[1]
H100_QWEN = "extra/AMD-AGI__TraceLens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"


def test_flops_and_bytes_per_op_type() -> None:
    assert _work("matmul", [[64, 32], [32, 16]], 4, [2.0 * 64 * 32 * 16]) == (2.0 * 64 * 32 * 16,
                                                                                4.0 * (64 * 32 + 32 * 16 + 64 * 16))
    flops, moved = _work("matmul", [[16], [64, 32], [32, 16], [], []], 2, [65536.0])
    assert flops == 65536.0 and moved == 2.0 * (16 + 64 * 32 + 32 * 16 + 64 * 16)
    assert _work("elementwise", [[8, 1024], [1024], []], 4, [None]) == (8192.0, 4.0 * (8192 + 1024 + 1 + 8192))
    assert _work("softmax", [[128, 256], [], []], 2, [None]) == (5.0 * 128 * 256, 2.0 * 2 * 128 * 256)
    conv_flops = 2.0 * 8 * 64 * (32 * 32) * (16 * 3 * 3)  # N·O·pixels·(C/g)·kernel, from the backward twin
    flops, moved = _work("convolution", [[8, 16, 32, 32], [64, 16, 3, 3], [64]], 4, [conv_flops])
    assert flops == conv_flops and moved == 4.0 * (8 * 16 * 32 * 32 + 64 * 16 * 3 * 3 + 8 * 64 * 32 * 32)
    assert _work("convolution", [[8, 16, 32, 32], [64, 16, 3, 3]], 4, [None]) == (None, None)  # no output size
    assert _work("matmul", [["a"], [1]], 4, [None]) == (None, None)


def test_a_stored_h100_trace_gets_the_datasheet_roofs_and_labels() -> None:
    trace = load(corpus(H100_QWEN))
    rank = roofline(trace, segment_steps(trace)).for_rank(0)
    assert rank.roofs == "datasheet peaks (NVIDIA H100 80GB HBM3)"
    judged = [row for row in rank.rows if row.label != "not judged"]
    assert len(judged) >= 6
    big_mm = next(row for row in judged if row.op == "aten::mm" and row.shapes == "[[8944,1024],[1024,2816]]")
    assert big_mm.dtype == "bf16" and big_mm.peak_gflops == pytest.approx(989.4e3) and big_mm.peak_gbps == 3350.0
    assert big_mm.label == "compute-bound" and big_mm.intensity > big_mm.peak_gflops / big_mm.peak_gbps
    elementwise = [row for row in judged if row.op in ("aten::mul", "aten::add", "aten::silu")]
    assert elementwise and all(row.label == "memory-bound" and row.intensity < 1 for row in elementwise)
    assert all(row.peak_gflops == pytest.approx(67.0e3) for row in elementwise)  # the FP32 vector peak
    for row in judged:
        assert 0 < row.roof_pct <= 100.0 + 1e-6, row  # no op beats its roof
        assert row.achieved_gflops == pytest.approx(row.flops / (row.ms / row.calls / 1e3) / 1e9)


def test_a_device_missing_from_the_peak_table_is_not_judged() -> None:
    trace = load(corpus(H100_QWEN))
    trace.ranks = (dataclasses.replace(trace.ranks[0], device_names=("Mystery GPU 9000",)),)
    rows = roofline(trace, segment_steps(trace)).for_rank(0).rows
    assert rows and all(row.label == "not judged" and row.roof_pct is None for row in rows)
    assert all(row.why == "no memory bandwidth for Mystery GPU 9000 in the peak table" for row in rows)
    assert all(row.flops and row.bytes for row in rows if row.op == "aten::mm")  # counted, but no roof to judge by


def test_missing_shapes_unknown_dtypes_and_unmeasured_cpus_say_why(tmp_path: Path) -> None:
    import torch

    def profiled(shapes: bool) -> Path:
        a, b, d, n = torch.randn(64, 64), torch.randn(64, 64), torch.randn(1 << 18).double(), torch.arange(1 << 18)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=shapes) as prof:
            for _ in range(3):
                torch.mm(a, b), torch.add(d, 1.0), torch.add(n, n)  # fp32, fp64 and int64
                prof.step()
        path = tmp_path / f"trace-{shapes}.json"
        prof.export_chrome_trace(str(path))
        return path

    for shapes in (True, False):
        trace = load(profiled(shapes))
        rows = {(row.op, row.dtype): row for row in roofline(trace, segment_steps(trace)).for_rank(0).rows}
        assert rows and all(row.label == "not judged" for row in rows.values())
        if not shapes:
            assert {row.why for row in rows.values()} == {"no input shapes recorded (record_shapes)"}
            continue
        assert rows[("aten::mm", "fp32")].why.startswith("no measured fp32 roof for this CPU")  # no skalpel run
        assert rows[("aten::add", "fp64")].why.startswith("no measured fp64 roof")
        assert rows[("aten::add", None)].why.startswith("its dtype was not recorded or is not one of")  # int64


@pytest.mark.slow
def test_labels_agree_with_a_hand_timed_microbenchmark(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import roofline_micro
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    rows = {op: (label, hand) for op, label, hand, _, _ in roofline_micro.run(tmp_path)}
    assert set(rows) == {"aten::mm", "aten::convolution", "aten::add", "aten::_softmax", "tiny"}, rows
    for op, (label, hand) in rows.items():
        assert label == hand, (op, label, hand)
    assert rows["aten::mm"][0] == rows["aten::convolution"][0] == "compute-bound"
    # The add's 1/12 FLOP a byte puts it under the memory roof; whether it reaches 10% of that roof is the machine's
    # speed at the time (beside busy loops both skalpel and the hand timing read it overhead-bound, and agree).
    assert rows["aten::add"][0] in ("memory-bound", "overhead-bound") and rows["tiny"][0] == "overhead-bound"


def test_a_modules_roofline_sums_its_ops_and_holds_its_subtrees_on_a_stored_h100_trace() -> None:
    """Per module: the judged op calls it ran (its subtree's included) together, against their roofs together."""
    trace = load(corpus(H100_QWEN))
    rank = roofline(trace, segment_steps(trace)).for_rank(0)
    assert rank.modules_why is None and rank.modules
    root = rank.modules[0]
    assert root.path == ("Qwen2Model_0",)  # the heaviest: it holds every layer
    expected = 0.0
    for row, members in zip(rank.rows, rank.members):
        if row.label != "not judged":
            in_module = int(((trace.module[members] >= 0) | (trace.backward_module[members] >= 0)).sum())
            expected += row.flops * in_module / (len(members) / row.calls)  # per unit
    assert 0 < root.flops == pytest.approx(expected, rel=1e-9)
    layers = [item for item in rank.modules if len(item.path) == 2 and item.path[1].startswith("Qwen2DecoderLayer_")]
    assert len(layers) >= 10 and sum(layer.flops for layer in layers) <= root.flops * (1 + 1e-9)
    peaks = [row.peak_gflops for row in rank.rows if row.label != "not judged"]
    for item in rank.modules:
        assert 0 < item.roof_pct <= 100.0 + 1e-6, item  # no module beats its ops' roofs together
        assert min(peaks) <= item.peak_gflops <= max(peaks) * (1 + 1e-9)
        assert item.intensity == pytest.approx(item.flops / item.bytes)
        compute = item.intensity >= item.peak_gflops / item.peak_gbps
        assert item.label == "overhead-bound" or item.label == ("compute-bound" if compute else "memory-bound")


def test_no_module_is_judged_where_no_op_is() -> None:
    trace = load(corpus(H100_QWEN))
    trace.ranks = (dataclasses.replace(trace.ranks[0], device_names=("Mystery GPU 9000",)),)
    rank = roofline(trace, segment_steps(trace)).for_rank(0)
    assert rank.modules == () and rank.modules_why.startswith("not judged: none of the heavy op groups is judged")


def test_the_modules_roofline_goes_through_json() -> None:
    import json
    from importlib import resources

    import jsonschema

    from skalpel.api import analyze
    from skalpel.result.report import Report

    report = analyze(corpus(H100_QWEN))
    document = json.loads(report.to_json())
    schema = json.loads(resources.files("skalpel.result").joinpath("report.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(document)
    modules = document["ranks"][0]["extra"]["roofline"]["modules"]
    assert modules[0]["path"] == ["Qwen2Model_0"] and modules[0]["label"] in ("compute-bound", "memory-bound")
    assert Report.from_json(report.to_json()).ranks[0].roofline == report.ranks[0].roofline


def _rendered(roof) -> str:
    from rich.console import Console

    from skalpel.report.terminal_roofline import roofline_table

    console = Console(width=80, record=True, file=io.StringIO())
    console.print(roofline_table(roof))
    return console.export_text()


def _unjudged(op: str, why: str):
    from skalpel.result.sections import RooflineOp

    return RooflineOp(op, "[[2048,512],[512,128]]", "fp32", 1.0, 5.0, None, None, None, None, None, None, None,
                      "not judged", None, why)  # fmt: skip


def test_a_reason_every_op_shares_is_said_once_and_leaves_the_op_column_readable() -> None:
    from skalpel.result.sections import RooflineSummary

    why = ("no measured fp32 roof for this CPU (skalpel run measures fp32 and bf16 matmuls and a copy; a stored "
           "trace has none)")  # fmt: skip
    text = _rendered(RooflineSummary("none", tuple(_unjudged(op, why) for op in ("aten::bmm", "aten::addmm"))))
    assert "aten::bmm" in text and "aten::addmm" in text  # an 80-column terminal squeezed them to nothing
    assert " ".join(text.split()).count("a stored trace has none") == 1
    mixed = _rendered(RooflineSummary("none", (_unjudged("aten::bmm", why), _unjudged("aten::div", "no shapes"))))
    assert "aten::bmm" in mixed and "aten::div" in mixed and "no shapes" in mixed
