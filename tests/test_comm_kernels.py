"""Communication written as kernels of its own is recognised by family, not by one library's namespace.

The names are as CUPTI writes them for the libraries' real kernels (deepseek-ai/DeepEP csrc/kernels/api.cuh and the
profile DeepSeek published of DeepSeek-V3's training, whose in-house build renames ``deep_ep::`` to ``dpsk::ep::``;
pplx-kernels; ROCm/mori's EpDispatch*/EpCombine*; torch's symmetric memory ops; NCCL/RCCL/MSCCL). A rank of a 64-rank
expert-parallel job whose only communication is such kernels, overlapped with compute, is not told that it never
communicates; where the kernels are unknown it is told only that no collective was recognised, with their names.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from skalpel.api import analyze
from skalpel.trace.kinds import Kind, classify
from tests.tracebuilder import TraceBuilder, gpu_rank

COMMUNICATING = (
    "void dpsk::ep::internode::dispatch<false, 8, true, 8>(int4*, float*, long*, float*, dpsk::ep::SourceMeta*)",
    "void dpsk::ep::internode::combine<false, 8, __nv_bfloat16, 8, 2, 16, 24>(int4*, float*, bool const*)",
    "void dpsk::ep::internode::cached_notify<false>(int, int, int, int, int*, int, int, int const*)",
    "void dpsk::ep::internode::notify_dispatch<false, 8>(int const*, long*, int, int const*, int*)",
    "void dpsk::ep::cuda::get_dispatch_layout<256, 32, 8>(long const*, int*, int*, int*, bool*, int, int)",
    "void deep_ep::internode_ll::dispatch<false, 3, 7168>(void*, float*, int*, long*, int*, int*, long*)",
    "void deep_ep::intranode::combine<__nv_bfloat16, 8, 768, 4096>(__nv_bfloat16*, float*)",
    "void hybrid_ep::dispatch_kernel<8>(hybrid_ep::DispatchParams)",
    "void pplx::(anonymous namespace)::dispatchKernel<8, true>(int, unsigned long, unsigned long)",
    "void mori::moe::EpDispatchInterNodeKernel<__hip_bfloat16>(mori::moe::EpDispatchCombineArgs<__hip_bfloat16>)",
    "void mori::moe::EpCombineIntraNodeKernel<float>(mori::moe::EpDispatchCombineArgs<float>)",
    "void nvshmemi_barrier_all_kernel()",
    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    "ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclWorkElem)",
    "void (anonymous namespace)::multimem_one_shot_reduce_kernel<c10::BFloat16, 8, 4>(c10::BFloat16*)",
    "void (anonymous namespace)::two_shot_all_reduce_kernel<float, 16, 8>(float**, unsigned long)",
    "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals)",
)
COMPUTING = (  # look-alikes: namespaces that share a word or a prefix with the ones above, and compute
    "void cutlass::device_kernel<dpsk::grouped_gemm::cuda::fp8_dptp128c_acc::GemmKernel>(dpsk::grouped_gemm::Params)",
    "void cuda::per_token_cast_to_fp8_with_channels<__nv_bfloat16, 128, false, 128, false>(__nv_bfloat16 const*)",
    "void cutlass::epilogue::threadblock::EpilogueVisitor<float>(cutlass::epilogue::Params)",
    "void at::native::step::kernel<float>(float*)",
    "triton_poi_fused_index_select_0",
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int, at::native::FillFunctor)",
)


@pytest.mark.parametrize("name", COMMUNICATING)
def test_a_communication_library_kernel_is_communication(name: str) -> None:
    assert classify("kernel", name, "X") is Kind.COMM_KERNEL


@pytest.mark.parametrize("name", COMPUTING)
def test_its_look_alike_computes(name: str) -> None:
    assert classify("kernel", name, "X") is Kind.KERNEL


GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel"
SIDE_STREAM = 27


def _overlapped_rank(exchange: str | None, *, gemm_us: float = 4_850, exchange_at_us: float = 600,
                     steps: int = 3) -> TraceBuilder:  # fmt: skip
    """Rank 0 of a 64-rank job, steps of 20 ms: four GEMMs a step on stream 7 (``gemm_us`` each; the default keeps
    the device busy); with ``exchange``, four 3 ms kernels of that name a step run on stream 27, each
    ``exchange_at_us`` after its layer's GEMM starts (by default beside it: DualPipe's overlap), launched from
    DeepEP's runtime without an aten op above them."""
    builder = gpu_rank(0, world_size=64)
    for number in range(steps):
        start = number * 20_000.0
        builder.step(number + 1, start, 19_990)
        for layer in range(4):
            host = start + 20 + layer * 400
            gemm_at = start + 100 + layer * 4_900
            external = builder.host("aten::mm", host, 60)
            builder.launch(host + 10, 8, work_ts=gemm_at, work_dur=gemm_us, external=external, kernel=GEMM)
            if exchange is not None:
                builder.launch(host + 100, 9, work_ts=gemm_at + exchange_at_us, work_dur=3_000,
                               name="cudaLaunchKernelExC", kernel=exchange, stream=SIDE_STREAM)  # fmt: skip
    return builder


def _said(report) -> str:
    return " | ".join(f"{f.id} {f.severity}: {f.title}" for f in report.findings)


def test_an_overlapped_expert_parallel_all_to_all_is_communication_hidden_behind_compute(tmp_path: Path) -> None:
    """DeepSeek's dispatch kernels take 60% of the step, all of it under compute: communication, told as hidden
    (info, the step pays nothing for it), never "never communicates" nor "wrap in DistributedDataParallel"."""
    report = analyze(_overlapped_rank(COMMUNICATING[0]).write(tmp_path / "rank0.json"), workers=1)
    said = _said(report)
    assert "never communicate" not in said and "DistributedDataParallel" not in said, said
    (bound,) = [f for f in report.findings if f.id == "communication_bound"]
    assert bound.severity == "info" and "hidden behind compute" in bound.title, said
    assert bound.evidence["share_pct"] == pytest.approx(60.0, abs=1.0)
    assert bound.evidence["exposed_ms_per_step"] == pytest.approx(0.0, abs=0.05)
    assert "all_to_all" in bound.evidence["collectives"]


def test_the_same_time_exposed_is_still_communication_bound(tmp_path: Path) -> None:
    """Twin: the same 60% of all-to-all with no compute beside it (the GEMMs are 1 ms, each exchange starts after
    its GEMM) bounds the step: critical."""
    builder = _overlapped_rank(COMMUNICATING[0], gemm_us=1_000, exchange_at_us=1_050)
    report = analyze(builder.write(tmp_path / "rank0.json"), workers=1)
    (bound,) = [f for f in report.findings if f.id == "communication_bound"]
    assert bound.severity == "critical" and "hidden" not in bound.title, _said(report)


def test_unknown_kernels_beside_compute_are_named_not_told_to_wrap_in_ddp(tmp_path: Path) -> None:
    """An in-house exchange skalpel does not know: no collective recognised, said as such with the kernel's name,
    and no advice to wrap the model in DistributedDataParallel."""
    exchange = "void acme::moe::exchange_tokens<8>(int4*, float*, int const*, int)"
    report = analyze(_overlapped_rank(exchange).write(tmp_path / "rank0.json"), workers=1)
    said = _said(report)
    (note,) = [f for f in report.findings if f.id == "communication_bound"]
    assert note.severity == "info" and "No collective recognised on rank 0 of 64" in note.title, said
    assert "acme::moe::exchange_tokens" in note.title and note.evidence["collectives"] == 0
    assert "DistributedDataParallel" not in said and "never communicate" not in said, said
    unjudged = [f.title for f in report.findings if f.id == "not_judged"]
    assert any("no collective recognised" in title and "low_comm_overlap" in title for title in unjudged), unjudged


def test_a_rank_with_one_stream_and_no_collective_is_still_told_it_never_communicates(tmp_path: Path) -> None:
    """Twin: the same rank with no side stream at all: nothing hints at communication, the DDP note stays."""
    report = analyze(_overlapped_rank(None).write(tmp_path / "rank0.json"), workers=1)
    (note,) = [f for f in report.findings if f.id == "communication_bound"]
    assert "Rank 0 of 64 never communicates" in note.title and "DistributedDataParallel" in note.title
