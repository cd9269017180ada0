"""Precision (issue 37): the matmuls' dtypes, this machine's bf16 speed, and the two findings.

This project's CPU has AMX and AVX-512 BF16, so a bf16 matmul runs faster than an fp32 one here. A CPU without
them is the same CPU with oneDNN held below them (``ONEDNN_MAX_CPU_ISA=AVX512_CORE``, a Skylake's instruction
set): there bf16 converts around every matmul and runs several times slower. Both are real runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from skalpel.analysis.precision import Precision, RankPrecision, precision
from skalpel.analysis.steps import segment_steps
from skalpel.diagnose.precision import FAST_PRECISION_UNUSED, SLOW_LOW_PRECISION
from skalpel.diagnose.rule import NotJudged
from skalpel.trace import load
from skalpel.trace.opnames import is_fp32_simt_gemm
from tests.conftest import corpus
from tests.ledger_fixtures import ledger_context

ROOT = Path(__file__).resolve().parents[1]
SLOW_CPU = {"ms": {"fp32": 0.3, "bf16": 1.6}, "shape": [256, 256, 256], "threads": 1, "native_bf16": False,
            "flags": ["avx512f"], "onednn_max_isa": "AVX512_CORE"}  # fmt: skip
AMX_CPU = {"ms": {"fp32": 0.37, "bf16": 0.13}, "shape": [256, 256, 256], "threads": 1, "native_bf16": True,
           "flags": ["amx_bf16", "avx512_bf16"], "onednn_max_isa": None}  # fmt: skip


def _cpu_context(facts: RankPrecision, *, matmul_ms: float, other_ms: float):
    ctx = ledger_context(host={"compute": matmul_ms, "backward": other_ms})
    ctx.analyses.precision, ctx.analyses.has_device = Precision({0: facts}), False
    return ctx


def _facts(dtype: str, ms: float, measured: dict | None) -> RankPrecision:
    return RankPrecision(rank=0, units=4, matmul_ms={dtype: ms}, matmul_calls={dtype: 10.0}, untyped_ms=0.0,
                         measured=measured)  # fmt: skip


def test_bf16_matmuls_on_a_cpu_measured_slower_fire_with_the_ratio() -> None:
    ctx = _cpu_context(_facts("bf16", 60.0, SLOW_CPU), matmul_ms=60.0, other_ms=40.0)
    [finding] = SLOW_LOW_PRECISION.check(ctx, SLOW_LOW_PRECISION)
    assert finding.id == "slow_low_precision" and finding.severity == "critical"  # 60% of the step
    assert finding.evidence["measured_ratio"] == pytest.approx(1.6 / 0.3, abs=1e-4)  # evidence is rounded
    assert finding.evidence["share_pct"] == pytest.approx(60.0)
    assert "5.3x slower" in finding.title and "ONEDNN_MAX_CPU_ISA=AVX512_CORE" in finding.fix


def test_its_look_alikes_stay_quiet() -> None:
    quiet = [
        _cpu_context(_facts("fp32", 60.0, SLOW_CPU), matmul_ms=60.0, other_ms=40.0),  # fp32 on the same CPU
        _cpu_context(_facts("bf16", 60.0, AMX_CPU), matmul_ms=60.0, other_ms=40.0),  # bf16 where it is faster
        _cpu_context(_facts("bf16", 5.0, SLOW_CPU), matmul_ms=5.0, other_ms=95.0),  # a small share
    ]
    for ctx in quiet:
        assert SLOW_LOW_PRECISION.check(ctx, SLOW_LOW_PRECISION) == []
    unmeasured = SLOW_LOW_PRECISION.check(_cpu_context(_facts("bf16", 60.0, None), matmul_ms=60.0, other_ms=40.0),
                                          SLOW_LOW_PRECISION)  # fmt: skip
    assert isinstance(unmeasured, NotJudged) and "measurement" in unmeasured.reason


def test_fast_precision_unuseds_on_a_cpu_with_a_faster_bf16_path_get_an_info_note() -> None:
    ctx = _cpu_context(_facts("fp32", 60.0, AMX_CPU), matmul_ms=60.0, other_ms=40.0)
    [note] = FAST_PRECISION_UNUSED.check(ctx, FAST_PRECISION_UNUSED)
    assert note.id == "fast_precision_unused" and note.severity == "info"
    assert note.evidence["measured_ratio"] == pytest.approx(0.13 / 0.37, abs=1e-4) and "autocast" in note.fix
    assert FAST_PRECISION_UNUSED.check(_cpu_context(_facts("fp32", 60.0, SLOW_CPU), matmul_ms=60.0, other_ms=40.0),
                             FAST_PRECISION_UNUSED) == []  # fmt: skip


def _gpu_context(simt_ms: float, other_ms: float, major: int | None, device: str):
    facts = RankPrecision(rank=0, units=4, matmul_ms={}, matmul_calls={}, untyped_ms=0.0, measured=None,
                          device=device, compute_major=major, fp32_simt_ms=simt_ms,
                          fp32_simt_kernels=("ampere_sgemm_128x64_nn",), kernel_ms=simt_ms + other_ms)  # fmt: skip
    ctx = ledger_context(device={"compute": simt_ms + other_ms})
    ctx.analyses.precision, ctx.analyses.has_device = Precision({0: facts}), True
    return ctx


def test_fp32_gemms_on_the_cuda_cores_of_an_a100_get_the_tf32_fix_with_its_bound() -> None:
    [finding] = FAST_PRECISION_UNUSED.check(_gpu_context(25.0, 75.0, 8, "NVIDIA A100-SXM4-80GB"), FAST_PRECISION_UNUSED)
    assert finding.severity == "warning" and finding.evidence["share_pct"] == pytest.approx(25.0)
    assert finding.evidence["kernel_speedup_bound"] == pytest.approx(156.0 / 19.5)
    assert finding.evidence["step_gain_bound_pct"] == pytest.approx(25.0 * (1 - 19.5 / 156.0))
    assert "allow_tf32 = True" in finding.fix
    # a V100 (no TF32) and a small share stay quiet
    assert FAST_PRECISION_UNUSED.check(_gpu_context(25.0, 75.0, 7, "Tesla V100-SXM2-32GB"), FAST_PRECISION_UNUSED) == []
    assert FAST_PRECISION_UNUSED.check(_gpu_context(2.0, 98.0, 8, "NVIDIA A100-SXM4-80GB"), FAST_PRECISION_UNUSED) == []


def test_kernel_names_tell_fp32_on_cuda_cores_from_tensor_cores() -> None:
    for simt in ("ampere_sgemm_32x32_sliced1x4_tn", "volta_sgemm_128x64_nn",
                 "void cutlass::Kernel<cutlass_80_simt_sgemm_128x32_8x5_nn_align1>(cutlass_80_simt_sgemm_128x32)",
                 "sm90_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3"):  # fmt: skip
        assert is_fp32_simt_gemm(simt), simt
    for tensor in ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4>(x)",
                   "sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw",
                   "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "ampere_bf16_s16816gemm_bf16_128x64"):
        assert not is_fp32_simt_gemm(tensor), tensor


def test_a_stored_a100_trace_shows_its_fp32_gemms_on_the_cuda_cores() -> None:
    trace = load(corpus("hta/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz"))
    facts = precision(trace, segment_steps(trace)).for_rank(0)
    assert facts.compute_major == 8 and facts.peaks() == (19.5, 156.0)
    assert facts.fp32_simt_kernels[0] == "ampere_sgemm_32x32_sliced1x4_tn"
    assert 0.15 < facts.fp32_simt_ms / facts.kernel_ms < 0.35  # a quarter of AlexNet's device time
    assert facts.measured is None  # a stored trace: no measurement of a CPU


def _profiled(tmp_path: Path, autocast: bool) -> Path:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(4):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                out = model(torch.randn(32, 64))
            out.float().sum().backward()
            prof.step()
    path = tmp_path / f"trace-{autocast}.json"
    prof.export_chrome_trace(str(path))
    return path


def test_the_loader_keeps_the_matmuls_dtypes(tmp_path: Path) -> None:
    for autocast, dtype in ((True, "bf16"), (False, "fp32")):
        trace = load(_profiled(tmp_path, autocast))
        facts = precision(trace, segment_steps(trace)).for_rank(0)
        assert set(facts.matmul_ms) == {dtype} and facts.matmul_calls[dtype] > 0, facts.matmul_ms
        typed = [args["types"] for index, args in trace.extra.items()
                 if "types" in args and trace.name_of(index) in ("aten::mm", "aten::addmm")]  # fmt: skip
        assert typed and all(len(types) >= 2 for types in typed)  # a matmul's two operands at least


def test_the_machine_is_measured_once_and_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from skalpel.capture import precision as measuring

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = measuring.header_value(1)
    again = measuring.header_value(1)
    assert first["cached"] is False and again["cached"] is True and again["ms"] == first["ms"]
    assert first["ms"]["fp32"] > 0 and first["ms"]["bf16"] > 0 and first["shape"] == [256, 256, 256]
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    native = ("amx_bf16" in flags or "avx512_bf16" in flags) and not os.environ.get("ONEDNN_MAX_CPU_ISA")
    assert first["native_bf16"] == native


def _run(tmp_path: Path, name: str, dtype: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "MODULE_STEPS": "8", "MODULE_DTYPE": dtype,
           "ONEDNN_MAX_CPU_ISA": "AVX512_CORE", "XDG_CACHE_HOME": str(tmp_path / "cache")}  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "skalpel", "run", "--out", str(tmp_path / name),
                           "examples/scenarios/module_transformer.py"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads((tmp_path / name / "report.json").read_text())


@pytest.mark.slow
def test_a_bf16_run_on_a_cpu_without_a_native_path_is_named_slower_and_its_fp32_twin_is_not(tmp_path: Path) -> None:
    """Real skalpel runs of the transformer look-alike with oneDNN held to AVX-512 without BF16/AMX: under bf16
    autocast slow_low_precision names the measured ratio and the lines; the same script in fp32 stays quiet."""
    bf16 = _run(tmp_path, "bf16", "bf16")
    [slow] = [finding for finding in bf16["findings"] if finding["id"] == "slow_low_precision"]
    assert slow["severity"] in ("warning", "critical") and slow["evidence"]["measured_ratio"] >= 1.25
    assert slow["evidence"]["onednn_max_isa"] == "AVX512_CORE" and slow["evidence"]["share_pct"] >= 20
    assert any("module_transformer.py" in location for location in slow["locations"])
    fp32 = _run(tmp_path, "fp32", "fp32")
    ids = {finding["id"] for finding in fp32["findings"]}
    assert not ids & {"slow_low_precision", "fast_precision_unused"}, ids
    assert fp32["steps"]["median_ms"] < bf16["steps"]["median_ms"]  # the same model, several times faster
