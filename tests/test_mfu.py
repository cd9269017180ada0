"""MFU: the peak table, the arithmetic, and achieved FLOP/s from a real with_flops capture (no MFU on a CPU)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from skalpel.analysis.mfu import PEAK_TFLOPS, peak_tflops, utilisation
from skalpel.result.report import Report


@pytest.mark.parametrize(
    ("device", "label", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM", 989.4),
        ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe", 756.5),
        ("NVIDIA H200", "NVIDIA H200", 989.4),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA A100", 312.0),
        ("NVIDIA B200", "NVIDIA B200", 2250.0),
        ("AMD Instinct MI300X", "AMD Instinct MI300X", 1307.4),
    ],
)
def test_peak_table_names_the_device(device, label, peak):
    assert peak_tflops(device, "bf16") == (label, peak)


def test_peak_table_has_no_entry_for_unknown_devices_or_dtypes():
    assert peak_tflops("Test GPU") is None and peak_tflops(None) is None
    assert peak_tflops("Tesla V100-SXM2-16GB", "bf16") is None  # no bf16 on a V100
    assert peak_tflops("Tesla V100-SXM2-16GB", "fp16") == ("NVIDIA V100", 125.0)
    assert all(peaks and all(value > 0 for value in peaks.values()) for _, _, peaks in PEAK_TFLOPS)


def test_utilisation_arithmetic():
    result = utilisation(0, "NVIDIA A100-SXM4-80GB", flops_per_step=156e12 * 0.5, step_s=0.5, dtype="bf16")
    assert result.achieved_tflops == pytest.approx(156.0) and result.mfu_pct == pytest.approx(50.0)
    unknown = utilisation(0, "Test GPU", 1e12, 1.0, "bf16")
    assert unknown.mfu_pct is None and "Test GPU" in unknown.note
    cpu = utilisation(0, None, 1e9, 1.0, "bf16", has_device=False)
    assert cpu.mfu_pct is None and cpu.peak_tflops is None and "CPU" in cpu.note


def test_cpu_capture_with_flops_reports_achieved_flops_and_no_mfu(tmp_path):
    import torch  # a dependency of skalpel: never skipped

    import skalpel

    torch.set_num_threads(1)
    a, b = torch.randn(128, 256), torch.randn(256, 64)
    with skalpel.profile(wait=0, warmup=1, active=3, with_flops=True, with_stack=False, out=tmp_path) as run:
        for _ in range(4):
            torch.mm(a, b)
            run.step()
    mfu = run.report().ranks[0].mfu
    assert mfu is not None and mfu.flops_per_step == pytest.approx(2 * 128 * 256 * 64)  # one mm per step
    assert mfu.achieved_tflops > 0 and mfu.mfu_pct is None and "CPU" in mfu.note
    document = json.loads((tmp_path / "report.json").read_text())
    from importlib import resources

    schema = json.loads(resources.files("skalpel.result").joinpath("report.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(document)
    assert Report.from_dict(document).ranks[0].mfu == mfu  # reads back
    assert "GFLOP/s achieved, no MFU" in (tmp_path / "summary.txt").read_text()
    assert "Model FLOP utilisation" in (tmp_path / "report.html").read_text()


def _matmul_steps(tmp_path, bad_args: dict):
    """Three steps of two aten::mm calls each on an A100: one with readable shapes, one with ``bad_args``."""
    from skalpel.api import analyze
    from tests.tracebuilder import TraceBuilder

    builder = TraceBuilder()
    builder.device_properties = [{"id": 0, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 80 * 2**30}]
    for step in range(3):
        start = step * 1000.0
        builder.step(step, start, 1000.0)
        good = builder.host("aten::mm", start + 10, 100, **{"Input Dims": [[64, 128], [128, 32]]})
        builder.launch(start + 20, 5, work_ts=start + 30, work_dur=400, external=good)
        bad = builder.host("aten::mm", start + 500, 100, **bad_args)
        builder.launch(start + 510, 5, work_ts=start + 520, work_dur=400, external=bad)
    return analyze(builder.write(tmp_path / "trace.json")).ranks[0].mfu


@pytest.mark.parametrize("bad_args", [
    {"Input Dims": 1.5},  # found by field fuzzing: a float where the list of shapes goes
    {"Input Dims": "[[64, 128]"},
    {"Input Dims": [["64", "128"], [128, 32]]},
    {"Input Dims": [[64, 128], [128, 32]], "flops": "many"},  # a bad count: counted from the shapes instead
])  # fmt: skip
def test_a_bad_count_field_costs_that_ops_flops_with_a_note_not_the_report(tmp_path, bad_args):
    mfu = _matmul_steps(tmp_path, bad_args)
    per_call = 2.0 * 64 * 128 * 32
    if "Input Dims" in bad_args and "flops" in bad_args:  # its shapes are readable: both calls counted
        assert mfu.flops_per_step == 2 * per_call and mfu.note == "FLOPs counted for aten::mm"
        return
    assert mfu.flops_per_step == per_call  # the good call of each step
    assert mfu.mfu_pct is not None  # the MFU is still there, of the FLOPs that could be counted
    assert mfu.note == "FLOPs counted for aten::mm; 3 op(s) with an unreadable 'Input Dims' or 'flops' field left out of the FLOP count"


def test_cpu_convolutions_are_counted_from_their_shapes_and_named(tmp_path):
    """A conv layer trained without with_flops: forward 2·N·O·H·W·C·k·k, backward twice that, and the note names them."""
    import torch

    import skalpel

    torch.set_num_threads(1)
    conv = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)  # 16x16 -> 8x8: the output size is not in the forward's dims
    images = torch.randn(4, 3, 16, 16)
    with skalpel.profile(wait=0, warmup=1, active=3, with_stack=False, out=tmp_path) as run:
        for _ in range(4):
            conv(images).sum().backward()
            run.step()
    mfu = run.report().ranks[0].mfu
    forward = 2 * 4 * 8 * (8 * 8) * 3 * 3 * 3
    assert mfu is not None and mfu.flops_per_step == pytest.approx(3 * forward)  # forward + the two gradients
    assert "aten::convolution" in mfu.note and "aten::convolution_backward" in mfu.note


def test_a_convolution_without_a_backward_is_left_out(tmp_path):
    """Inference: no backward gives the output size, so the forward is not guessed."""
    import torch

    import skalpel

    torch.set_num_threads(1)
    conv, a, b = torch.nn.Conv2d(3, 8, 3, stride=2), torch.randn(4, 3, 16, 16), torch.randn(32, 32)
    with torch.no_grad(), skalpel.profile(wait=0, warmup=1, active=3, with_stack=False, out=tmp_path) as run:
        for _ in range(4):
            conv(a)
            torch.mm(b, b)
            run.step()
    mfu = run.report().ranks[0].mfu
    assert mfu is not None and mfu.flops_per_step == pytest.approx(2 * 32 * 32 * 32)
    assert "aten::mm" in mfu.note and "convolution" not in mfu.note
