"""memory_spike on real transients only: judged against the device's capacity and the footprint between steps.

Each planted transient is paired with a look-alike that must stay quiet: a cuBLAS workspace on a
141 GB GPU, an im2col buffer in a small CPU peak, weights allocated once and kept.
"""

from __future__ import annotations

import pytest

from skalpel.api import analyze

from .test_findings_rules import TraceBuilder

MIB, GIB = 2**20, 2**30
STEP_US = 10_000.0


def _spikes(builder: TraceBuilder, tmp_path):
    report = analyze(builder.write(tmp_path / "trace.json"))
    return [finding for finding in report.findings if finding.id == "memory_spike"]


def _transient_steps(builder: TraceBuilder, *, base: int, transient: int, op: str = "aten::bmm",
                     device_type: int = 1, kept: bool = False) -> None:  # fmt: skip
    """``base`` bytes held throughout (weights), then per step a temporary of ``transient`` bytes by ``op``.

    ``kept``: the 'temporary' is allocated in the first step and never freed (weights loaded late).
    """
    held = 0
    for _ in range(8):  # the weights: many tensors, each smaller than the temporary
        held += base // 8
        builder.memory(5, base // 8, held, device_type=device_type)
    for number in range(3):
        start = 100 + number * STEP_US
        builder.step(number + 1, start, STEP_US - 1)
        builder.frame("model.py(52): forward", start + 5, 400)
        builder.host(op, start + 10, 300)
        builder.host("aten::empty", start + 20, 10)
        if not kept or number == 0:
            held += transient
            builder.memory(start + 25, transient, held, device_type=device_type)
        builder.memory(start + 200, 4 * MIB, held + 4 * MIB, device_type=device_type)
        builder.memory(start + 5000, -4 * MIB, held, device_type=device_type)
        if not kept:
            held -= transient
            builder.memory(start + 6000, -transient, held, device_type=device_type)
        builder.launch(start + 100, 5, work_ts=start + 120, work_dur=3000)


def test_a_transient_that_fills_the_device_is_a_warning(tmp_path):
    builder = TraceBuilder()  # a 16 GiB device
    _transient_steps(builder, base=6 * GIB, transient=3 * GIB)
    (finding,) = _spikes(builder, tmp_path)
    assert finding.severity == "warning"
    evidence = finding.evidence
    assert evidence["alloc_mib"] == pytest.approx(3 * 1024) and evidence["steady_mib"] == pytest.approx(6 * 1024)
    assert evidence["capacity_mib"] == pytest.approx(16 * 1024) and evidence["peak_of_capacity_pct"] >= 50
    assert "aten::bmm" in finding.title and "16 GiB" in finding.title
    assert "chunks" in finding.fix and "expand" not in finding.fix  # no broadcast here: not the broadcast fix
    assert any("model.py:52" in where for where in finding.locations)


def test_a_large_transient_on_a_roomy_device_is_info(tmp_path):
    builder = TraceBuilder()
    builder.device_properties = [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 80 * GIB}]
    _transient_steps(builder, base=1 * GIB, transient=2 * GIB)
    (finding,) = _spikes(builder, tmp_path)
    assert finding.severity == "info" and finding.evidence["peak_of_capacity_pct"] < 5


def test_a_cublas_workspace_on_a_141_gb_gpu_is_no_finding(tmp_path):
    builder = TraceBuilder()
    builder.device_properties = [{"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150_754_820_096}]
    _transient_steps(builder, base=60 * MIB, transient=32 * MIB, op="aten::mm")  # 32 MiB of a 96 MiB peak
    assert _spikes(builder, tmp_path) == []


def test_an_im2col_buffer_in_a_cpu_peak_is_no_finding(tmp_path):
    builder = TraceBuilder()
    builder.device_properties = []
    _transient_steps(builder, base=68 * MIB, transient=35 * MIB, op="aten::convolution", device_type=0)  # 107 MiB peak
    assert _spikes(builder, tmp_path) == []


def test_weights_allocated_once_and_kept_are_not_a_transient(tmp_path):
    """As large a share of the tight device's peak, but never freed: the footprint between steps holds it."""
    builder = TraceBuilder()
    _transient_steps(builder, base=6 * GIB, transient=3 * GIB, op="aten::to", kept=True)
    assert _spikes(builder, tmp_path) == []
