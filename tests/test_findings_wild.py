"""Findings on traces like those from the wild: unmarked traces, cold starts, allocator churn,
unrecorded device activity, SDPA's slow path, materialised broadcasts, tiny ops by source.

Each test plants one pattern in a small trace in today's Kineto schema (``tests/tracebuilder.py``)
and runs the real loader, analyses and rules; beside it, a look-alike must stay quiet.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from skalpel.api import analyze
from tests.tracebuilder import TraceBuilder, cpu_rank

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
    assert loader.evidence["judged_over"] == "6 iterations found from the loop, no steps marked"
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


# --- class 3: cold starts --------------------------------------------------------------------------


def _conv_loop(builder: TraceBuilder, *, context_ms: float, first_conv_ms: float, later_conv_ms: float = 2.0,
               iterations: int = 10) -> None:  # fmt: skip
    """No markers: device set-up, then a loop of convolutions (the first may search for its algorithm)."""
    builder.frame("train.py(8): <module>", 0, context_ms * 1000 + 20)
    builder.runtime("cudaFree", 10, context_ms * 1000)  # torch's first CUDA call: creates the context
    ts = context_ms * 1000 + 100
    for index in range(iterations):
        conv_us = (first_conv_ms if index == 0 else later_conv_ms) * 1000
        builder.frame("train.py(20): <module>", ts, conv_us + 10)
        external = builder.host("aten::cudnn_convolution", ts + 1, conv_us)
        builder.launch(ts + conv_us - 20, 10, work_ts=ts + conv_us - 5, work_dur=900, external=external)
        ts += conv_us + 1000


def test_cold_start_names_the_context_and_the_first_cudnn_call(tmp_path):
    builder = TraceBuilder()
    _conv_loop(builder, context_ms=300, first_conv_ms=200)
    report = _report(builder, tmp_path)
    (finding,) = _found(report, "cold_start")
    evidence = finding.evidence
    assert evidence["one_time_ms"] == pytest.approx(500, abs=1)
    assert evidence["share_pct"] == pytest.approx(100 * 500 / evidence["window_ms"], abs=0.1) and evidence["share_pct"] > 60
    assert evidence["largest"] == "cudaFree" and evidence["largest_is"].startswith("CUDA context creation")
    assert [cost["name"] for cost in evidence["costs"]] == ["cudaFree", "aten::cudnn_convolution"]
    assert evidence["costs"][1]["what"].startswith("first cuDNN")
    assert finding.severity == "critical"
    assert "warmup" in finding.fix
    assert any("train.py:8" in where for where in finding.locations)


@pytest.mark.parametrize("every_call_ms", [0.0, 200.0], ids=["warm", "always-slow"])
def test_cold_start_look_alikes_stay_quiet(tmp_path, every_call_ms):
    """A warm process (fast context, first conv as fast as the rest), or an op that is slow every time."""
    builder = TraceBuilder()
    _conv_loop(builder, context_ms=0.2, first_conv_ms=every_call_ms or 2.0, later_conv_ms=every_call_ms or 2.0)
    assert _found(_report(builder, tmp_path), "cold_start") == []


# --- class 4: allocator churn --------------------------------------------------------------------


def _allocating_steps(builder: TraceBuilder, *, churn_in_every_step: bool) -> None:
    for number in range(5):
        start = number * 10_000.0
        builder.step(number + 1, start, 9_999)
        builder.frame("train.py(50): train_step", start + 1, 9_990)
        builder.launch(start + 10, 5, work_ts=start + 20, work_dur=6000)
        if churn_in_every_step or number == 0:
            for index in range(3):  # what torch.cuda.empty_cache() in the loop or no caching makes the allocator do
                builder.runtime("cudaMalloc", start + 100 + index * 1500, 300)
                builder.runtime("cudaFree", start + 700 + index * 1500, 500)


def test_allocator_churn_in_steady_state_fires(tmp_path):
    builder = TraceBuilder()
    _allocating_steps(builder, churn_in_every_step=True)
    report = _report(builder, tmp_path)
    (finding,) = _found(report, "allocator_churn")
    evidence = finding.evidence
    assert evidence["calls"] == 24 and evidence["by_name"] == {"cudaMalloc": 12, "cudaFree": 12}  # steps 2-5
    assert evidence["ms"] == pytest.approx(4 * 3 * 0.8)
    assert evidence["share_pct"] == pytest.approx(100 * 9.6 / 40, abs=0.1)
    assert evidence["steady_state"] == "marked steps after the first"
    assert "empty_cache" in finding.fix and "expandable_segments" in finding.fix
    assert any("train.py:50" in where for where in finding.locations)


def test_allocator_growing_in_the_first_step_only_stays_quiet(tmp_path):
    builder = TraceBuilder()
    _allocating_steps(builder, churn_in_every_step=False)
    assert _found(_report(builder, tmp_path), "allocator_churn") == []


# --- class 5: device activity not recorded --------------------------------------------------------


def _host_side_of_a_gpu_run(builder: TraceBuilder, *, launches: bool) -> None:
    for number in range(3):
        start = number * 10_000.0
        builder.step(number + 1, start, 9_999)
        for index in range(20):
            builder.host("aten::addmm", start + 10 + index * 400, 300)
            if launches:
                builder.runtime("cudaLaunchKernel", start + 20 + index * 400, 8)


def test_gpu_run_without_kernels_is_named_and_labelled_a_gpu_run(tmp_path):
    builder = TraceBuilder()
    builder.device_properties = [{"id": 0, "name": "NVIDIA GeForce RTX 3090", "totalGlobalMem": 24 * 2**30}]
    _host_side_of_a_gpu_run(builder, launches=True)
    report = _report(builder, tmp_path)
    (finding,) = _found(report, "device_activity_missing")
    assert finding.evidence["launch_calls"] == 60 and finding.evidence["device_events"] == 0
    assert finding.evidence["missing_pct"] == 100 and finding.evidence["device"] == "NVIDIA GeForce RTX 3090"
    assert "ProfilerActivity.CUDA" in finding.fix and "CUPTI" in finding.fix
    assert report.source.device == "NVIDIA GeForce RTX 3090 (device activity not recorded)"
    notes = [f for f in report.findings if f.id == "not_judged" and "not recorded" in f.evidence["reason"]]
    assert notes and "gpu_idle" in notes[0].evidence["rules"]


def test_cpu_run_on_a_gpu_machine_stays_a_cpu_run_that_left_the_gpu_unused(tmp_path):
    """deviceProperties in the header but no launch call, GPU op or device memory: the run used the CPU only."""
    builder = TraceBuilder()
    _host_side_of_a_gpu_run(builder, launches=False)
    report = _report(builder, tmp_path)
    assert _found(report, "device_activity_missing") == []
    assert report.source.device == "cpu (Test GPU present but unused: all work ran on the CPU)"
    builder.device_properties = []  # the look-alike: no GPU in the header, a plain CPU run
    assert _report(builder, tmp_path).source.device == "cpu"


@pytest.mark.parametrize("sign", ["cudnn op", "device memory"])
def test_gpu_work_seen_only_from_the_host_names_the_gpu(tmp_path, sign):
    """activities=[CPU] on a GPU run: no launch call recorded, but cuDNN ops or CUDA allocations say a GPU worked."""
    builder = TraceBuilder()
    builder.device_properties = []
    _host_side_of_a_gpu_run(builder, launches=False)
    if sign == "cudnn op":
        builder.host("aten::cudnn_convolution", 50, 200)
    else:
        builder.memory(60, 4 * 2**20, 4 * 2**20, device_type=1)
    assert _report(builder, tmp_path).source.device == "gpu (device activity not recorded)"


# --- class 8: tiny ops grouped by their source -----------------------------------------------------


def _tiny_op_steps(builder: TraceBuilder, *, loader_ops: int, optimizer_ops: int, model_ops: int) -> None:
    """CPU-only steps of 600 tiny ops: some fetched sample by sample in the loader, some in the optimizer."""
    for number in range(3):
        start = number * 10_000.0
        builder.step(number + 1, start, 9_999)
        ts = start + 10
        for count, name, frame, annotation in (
            (loader_ops, "aten::select", "data.py(15): __getitem__", LOADER),
            (optimizer_ops, "aten::add_", "torch/optim/adam.py(300): _single_tensor_adam", "Optimizer.step#Adam.step"),
            (model_ops, "aten::relu", "model.py(40): forward", None),
        ):
            if count == 0:
                continue
            if annotation is not None:
                builder.host(annotation, ts, count * 5.0, cat="user_annotation")
            builder.frame(frame, ts, count * 5.0)
            for index in range(count):
                builder.host(name, ts + index * 5.0 + 0.5, 4.0)
            ts += count * 5.0 + 10


def _launch_bound(tmp_path: Path, **ops: int):
    builder = TraceBuilder()
    builder.device_properties = []  # a CPU run
    _tiny_op_steps(builder, **ops)
    (finding,) = _found(_report(builder, tmp_path), "launch_bound")
    return finding


def test_launch_bound_groups_tiny_ops_by_source_and_fixes_the_largest(tmp_path):
    finding = _launch_bound(tmp_path, loader_ops=1100, optimizer_ops=400, model_ops=200)
    by_source = finding.evidence["tiny_ops_by_source_pct"]
    assert by_source["data loading"] == pytest.approx(100 * 1100 / 1700, abs=0.5)
    assert by_source["optimizer step"] == pytest.approx(100 * 400 / 1700, abs=0.5)
    assert finding.fix.startswith("65% of the tiny ops come from the data loading") and "whole batches" in finding.fix
    assert any("data.py:15" in where for where in finding.locations)


def test_a_closure_run_inside_the_optimizer_step_is_the_models(tmp_path):
    """LBFGS (and Lightning) run forward and backward inside step(): only what follows the last backward op is the
    optimizer's, so its tiny ops are the model's, and the fix is not foreach (LBFGS has none)."""
    builder = TraceBuilder()
    builder.device_properties = []
    for number in range(3):
        start = number * 10_000.0
        builder.step(number + 1, start, 9_999)
        builder.host("Optimizer.step#LBFGS.step", start + 10, 9_000, cat="user_annotation")
        builder.frame("model.py(40): forward", start + 20, 6_000)
        for index in range(1200):
            builder.host("aten::sigmoid", start + 20 + index * 5.0, 4.0)
        builder.host("autograd::engine::evaluate_function: SigmoidBackward0", start + 6_100, 900)
        builder.frame("torch/optim/lbfgs.py(400): step", start + 7_100, 1_500)
        for index in range(200):
            builder.host("aten::dot", start + 7_100 + index * 5.0, 4.0)
    (finding,) = _found(_report(builder, tmp_path), "launch_bound")
    by_source = finding.evidence["tiny_ops_by_source_pct"]
    assert by_source["optimizer step"] == pytest.approx(100 * 200 / 1400, abs=0.5)  # the ops after the backward
    assert by_source["model and the rest"] > 80
    assert "torch.compile" in finding.fix and "foreach" not in finding.fix


def test_launch_bound_from_the_model_keeps_the_fusing_fix(tmp_path):
    finding = _launch_bound(tmp_path, loader_ops=0, optimizer_ops=300, model_ops=1400)
    assert finding.evidence["tiny_ops_by_source_pct"]["model and the rest"] > 80
    assert "torch.compile" in finding.fix and "whole batches" not in finding.fix
    assert any("model.py:40" in where for where in finding.locations)


# --- class 6: attention through SDPA's slow path ---------------------------------------------------

SDPA_DIMS = [[8, 12, 1024, 64], [8, 12, 1024, 64], [8, 12, 1024, 64], [8, 1, 1024, 1024], [], []]


def _sdpa_steps(builder: TraceBuilder, *, backend: str, dims: list) -> None:
    """Three steps: one SDPA call (its inner ops launch the attention kernels) and a 1 ms matmul."""
    for number in range(3):
        start = number * 10_000.0
        builder.step(number + 1, start, 9_999)
        builder.frame("model.py(88): forward", start + 5, 700)
        builder.host("aten::scaled_dot_product_attention", start + 10, 600, **{"Input Dims": dims})
        if backend == "math":
            builder.host("aten::_scaled_dot_product_attention_math", start + 20, 580)
            for offset, op, kernel in ((30, "aten::bmm", "gemm_qk"), (200, "aten::_softmax", "softmax_warp_forward"),
                                       (400, "aten::bmm", "gemm_pv")):  # fmt: skip
                external = builder.host(op, start + offset, 100)
                builder.launch(start + offset + 10, 5, work_ts=start + 1000 + offset * 10, work_dur=1500, external=external,
                               kernel=kernel)  # fmt: skip
        else:
            external = builder.host("aten::_scaled_dot_product_flash_attention", start + 20, 580)
            builder.launch(start + 30, 5, work_ts=start + 1000, work_dur=1200, external=external,
                           kernel="pytorch_flash::flash_fwd_kernel")  # fmt: skip
        external = builder.host("aten::addmm", start + 700, 50)
        builder.launch(start + 710, 5, work_ts=start + 7000, work_dur=1000, external=external, kernel="sm90_gemm")


def test_sdpa_math_path_names_the_backend_and_the_reasons(tmp_path):
    builder = TraceBuilder()
    _sdpa_steps(builder, backend="math", dims=SDPA_DIMS)
    report = _report(builder, tmp_path)
    (finding,) = _found(report, "attention_hotspot")
    evidence = finding.evidence
    assert evidence["backend"] == "math (eager fallback)" and finding.severity == "warning"
    assert evidence["share_pct"] == pytest.approx(100 * 4500 / 5500, abs=0.1)
    assert evidence["ms_per_step"] == pytest.approx(4.5) and evidence["calls"] == 3
    assert evidence["head_dim"] == 64 and evidence["explicit_mask"] is True
    assert any("attn_mask" in reason for reason in evidence["reasons"]) and "fp16/bf16" in finding.fix
    assert "math" in finding.title
    assert any("model.py:88" in where for where in finding.locations)


def test_sdpa_on_its_flash_kernel_stays_quiet(tmp_path):
    builder = TraceBuilder()
    _sdpa_steps(builder, backend="flash", dims=[[8, 12, 1024, 64], [8, 12, 1024, 64], [8, 12, 1024, 64], [], [], []])
    assert _found(_report(builder, tmp_path), "attention_hotspot") == []


# --- the new ids are explained with their thresholds -----------------------------------------------


@pytest.mark.parametrize(("finding_id", "fires_at"), [
    ("cold_start", ">= 20% of the recorded window in one-time work and >= 50 ms; critical at >= 50%"),
    ("allocator_churn", "in cudaMalloc/cudaFree (hipMalloc/hipFree) calls and >= 10 calls in steady state"),
    ("device_activity_missing", ">= 90% of the launch calls with no device work recorded and >= 10 launch calls"),
])  # fmt: skip
def test_explain_documents_the_new_findings(capsys, finding_id, fires_at):
    from skalpel.cli import main

    assert main(["explain", finding_id]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert fires_at in out and "How to fix" in out and "Known false positives" in out


def test_allocator_churn_in_an_unmarked_loop_is_judged_over_inferred_iterations(tmp_path):
    """No markers: iterations start at each DataLoader fetch; the calls recur in every one after the first."""
    builder = TraceBuilder()
    for iteration in range(6):
        start = iteration * 10_000.0
        builder.host(LOADER, start, 500, cat="user_annotation")
        builder.launch(start + 600, 5, work_ts=start + 620, work_dur=6000)
        for index in range(3):
            builder.runtime("cudaMalloc", start + 1000 + index * 1500, 300)
            builder.runtime("cudaFree", start + 1500 + index * 1500, 500)
    (finding,) = _found(_report(builder, tmp_path), "allocator_churn")
    assert finding.evidence["steady_state"].startswith("iterations after the first, inferred from DataLoader fetches")
    assert finding.evidence["calls"] == 30 and finding.evidence["spread_pct"] == 100


# --- class 10: the pre-Kineto exporter (torch <= 1.8 autograd profiler) -----------------------------


def _legacy_trace(path: Path, iterations: int = 5) -> Path:
    """What torch 1.7/1.8's EventList.export_chrome_trace wrote: a bare JSON list, no 'cat', pids
    "CPU functions" / "CUDA functions", and cpu_to_cuda flow arrows from an op to its kernels."""
    events, ts = [], 0
    for index in range(iterations):
        events += [
            {"name": "aten::conv2d", "ph": "X", "ts": ts, "dur": 900, "tid": 1, "pid": "CPU functions", "args": {}},
            {"name": "aten::convolution", "ph": "X", "ts": ts + 5, "dur": 880, "tid": 1, "pid": "CPU functions", "args": {}},
            {"name": "aten::add_", "ph": "X", "ts": ts + 950, "dur": 40, "tid": 1, "pid": "CPU functions", "args": {}},
            {"name": "aten::add_", "ph": "s", "ts": ts + 950, "tid": 1, "pid": "CPU functions", "id": index, "cat": "cpu_to_cuda", "args": {}},
            {"name": "aten::add_", "ph": "f", "ts": ts + 1000, "tid": 0, "pid": "CUDA functions", "id": index, "cat": "cpu_to_cuda", "args": {}},
            {"name": "vectorized_elementwise_kernel", "ph": "X", "ts": ts + 1000, "dur": 30, "tid": 0, "pid": "CUDA functions", "args": {}},
        ]  # fmt: skip
        ts += 1100
    path.write_text(json.dumps(events))
    return path


def test_pre_kineto_export_is_read(tmp_path):
    report = analyze(_legacy_trace(tmp_path / "legacy.json"))
    (rank,) = report.ranks
    assert {row.name: row.calls for row in rank.top_ops} == {"aten::conv2d": 5, "aten::convolution": 5, "aten::add_": 5}
    assert rank.step_breakdown_pct["cpu_exec"] > 80 and rank.step_breakdown_pct["other"] < 15
    assert rank.step_breakdown_pct["kernel"] > 2  # 30 us kernels, no longer "other 100%"
    assert [row.calls for row in rank.top_kernels] == [5]
    assert report.source.device == "gpu"


def test_events_without_a_category_elsewhere_stay_unclassified():
    """Only the legacy exporter's own pids carry a meaning; a modern event keeps its category."""
    from skalpel.trace.kinds import legacy_category

    assert legacy_category(None, "CPU functions") == "cpu_op" and legacy_category("", "CUDA functions") == "kernel"
    assert legacy_category(None, "Spans") is None and legacy_category(None, 1234) is None
    assert legacy_category("user_annotation", "CPU functions") == "user_annotation"


# --- class 7: a materialised broadcast -----------------------------------------------------------------

MIB = 2**20


def _pairwise_layer(builder: TraceBuilder, *, before: str, before_dims: list) -> None:
    """A pairwise layer: x[256, 1, 100] expanded to [256, 256, 100] and made contiguous (25 MiB of a 50 MiB peak)."""
    builder.memory(10, 20 * MIB, 20 * MIB)  # the weights
    for number in range(3):
        start = 1000 + number * 10_000.0
        builder.step(number + 1, start, 9_999)
        builder.frame("pairwise.py(31): forward", start + 5, 300)
        builder.host(before, start + 10, 5, **{"Input Dims": before_dims})
        builder.host("aten::contiguous", start + 20, 200, **{"Input Dims": [[256, 256, 100]]})
        builder.host("aten::clone", start + 25, 190, **{"Input Dims": [[256, 256, 100], []]})
        builder.host("aten::empty_like", start + 30, 20)
        builder.host("aten::empty", start + 32, 10)
        builder.memory(start + 35, 25 * MIB, 45 * MIB)
        builder.memory(start + 400, 5 * MIB, 50 * MIB)
        builder.memory(start + 5000, -30 * MIB, 20 * MIB)
        builder.launch(start + 100, 5, work_ts=start + 120, work_dur=3000)


def test_memory_spike_names_a_materialised_broadcast_below_the_floor(tmp_path):
    builder = TraceBuilder()
    _pairwise_layer(builder, before="aten::expand", before_dims=[[256, 1, 100], []])
    (finding,) = _found(_report(builder, tmp_path), "memory_spike")
    evidence = finding.evidence
    assert evidence["alloc_mib"] == pytest.approx(25) and evidence["share_pct"] == pytest.approx(50)
    assert evidence["op"] == "aten::contiguous"
    assert evidence["broadcast_from"] == [256, 1, 100] and evidence["broadcast_to"] == [256, 256, 100]
    assert evidence["broadcast_ratio"] == pytest.approx(256)
    assert "materialises a broadcast" in finding.title and "expand" in finding.fix
    assert any("pairwise.py:31" in where for where in finding.locations)


def test_memory_spike_of_the_same_size_without_a_broadcast_stays_quiet(tmp_path):
    """25 MiB copied from a permuted view: no broadcast, below the generic 32 MiB floor."""
    builder = TraceBuilder()
    _pairwise_layer(builder, before="aten::permute", before_dims=[[256, 100, 256], []])
    assert _found(_report(builder, tmp_path), "memory_spike") == []


# --- class 8: ranks with identical work taking turns are not stragglers -------------------------------

STEP = 40_000.0


def _two_ranks(tmp_path: Path, late_rank_of_step, *, outside_ops: bool = False,
               core_waits_ms: tuple[float, float] | None = None) -> Path:
    """Two gloo ranks on one host, 6 steps of 40 ms: each computes (aten::mm), then all_reduces 4 MB on gloo's
    thread; the late rank of a step arrives 16 ms after the other, by a slower aten::mm (identical work) or,
    with ``outside_ops``, by 16 ms of Python outside any op before the same aten::mm (extra work). ``core_waits_ms``:
    each rank's script thread's wait for a core over the window, as skalpel's capture writes it in the header."""
    folder = tmp_path / "job"
    folder.mkdir(parents=True)
    for rank in (0, 1):
        builder = cpu_rank(rank)
        if core_waits_ms is not None:
            builder.header["skalpel_run_queue"] = {"main_thread_wait_s": core_waits_ms[rank] / 1000, "wall_s": 6 * STEP / 1e6}
        for number in range(6):
            start = number * STEP
            late = late_rank_of_step(number) == rank
            builder.step(number + 1, start, STEP - 1)
            mm_start = start + 10 + (16_000 if late and outside_ops else 0)
            mm_us = 24_000 if late and not outside_ops else 8_000
            builder.host("aten::mm", mm_start, mm_us)
            arrive = mm_start + mm_us
            builder.gloo_all_reduce(arrive, start + 26_010 + 2_000 - arrive)
        builder.write(folder / f"trace-rank{rank}.json")
    return folder


@pytest.mark.parametrize(("late_rank", "last_arrivals"), [(lambda number: number % 2, {"0": 3, "1": 3}),
                                                          (lambda number: 1, {"0": 0, "1": 6})], ids=["turns", "same-rank"])
def test_ranks_with_identical_work_on_one_machine_are_not_stragglers(tmp_path, late_rank, last_arrivals):
    """Taking turns, or one rank running the same ops slower on a shared machine: its load, not the code."""
    report = analyze(_two_ranks(tmp_path, late_rank))
    assert not [(f.id, f.severity) for f in report.findings if f.severity != "info"]
    (note,) = _found(report, "straggler_rank")
    assert note.title.startswith("No straggler") and "identical work" in note.title
    assert note.evidence["last_arrivals_by_rank"] == last_arrivals
    assert note.evidence["wait_ms_per_step"] == pytest.approx(16 * last_arrivals["1"] / 6, abs=0.5)
    assert set(note.evidence["comm_share_with_waits_pct_by_rank"]) == {"0", "1"}


def test_a_rank_doing_extra_work_is_the_straggler(tmp_path):
    report = analyze(_two_ranks(tmp_path, lambda number: 1, outside_ops=True))
    (finding,) = _found(report, "straggler_rank", serious=True)
    assert finding.evidence["rank"] == 1 and finding.evidence["last_arrival_pct"] == 100
    assert finding.evidence["extra_time_in"].startswith("(host time outside any op")
    assert finding.evidence["comm_share_max_pct"] > 40  # the waiting rank's collectives, never hidden


def test_a_rank_kept_off_the_cores_is_no_straggler(tmp_path):
    """The same extra time outside ops, while its script thread waited 96 ms more for a core than the other's (16 ms a
    step, as skalpel's capture measures it): the machine's load, not the rank's work (a CI beside busy loops read
    such a rank as a critical straggler). A rank that sleeps waits for no core: the test above, and here with the
    figures recorded and alike."""
    report = analyze(_two_ranks(tmp_path / "preempted", lambda number: 1, outside_ops=True, core_waits_ms=(4.0, 100.0)))
    assert not [(f.id, f.severity) for f in report.findings if f.severity != "info"]
    (note,) = _found(report, "straggler_rank")
    assert note.title.startswith("No straggler")
    sleeping = analyze(_two_ranks(tmp_path / "sleeping", lambda number: 1, outside_ops=True, core_waits_ms=(4.0, 6.0)))
    (finding,) = _found(sleeping, "straggler_rank", serious=True)
    assert finding.evidence["rank"] == 1


def test_ranks_that_all_reduce_the_same_buckets_in_another_order_do_identical_work(tmp_path):
    """DDP all-reduces each gradient bucket once a step; gloo's thread may record them in another order on each rank.
    Ranked by call count the buckets tie: which one was recorded first must not make the ranks' work differ (a
    real 2-rank gloo run on a loaded machine read as a critical straggler, identical work slowed by the load)."""
    folder = tmp_path / "job"
    folder.mkdir()
    for rank in (0, 1):
        builder = cpu_rank(rank)
        buckets = [525_312, 1_059_850] if rank == 0 else [1_059_850, 525_312]
        for number in range(6):
            start = number * STEP
            builder.step(number + 1, start, STEP - 1)
            mm_us = 24_000 if rank == 1 else 8_000  # the same op, slower on the loaded rank
            builder.host("aten::mm", start + 10, mm_us)
            arrive = start + 10 + mm_us
            for offset, nelems in enumerate(buckets):
                builder.host("gloo:all_reduce", arrive + offset * 1_000, 1_000, tid=200, **{
                    "Input Dims": [[nelems]], "In msg nelems": nelems, "Out msg nelems": nelems, "dtype": "Float",
                    "Group size": 2})  # fmt: skip
            builder.gloo_all_reduce(arrive + 2_000, start + 30_000 - arrive)
        builder.write(folder / f"trace-rank{rank}.json")
    report = analyze(folder)
    (note,) = _found(report, "straggler_rank")
    assert note.severity == "info" and note.title.startswith("No straggler") and "identical work" in note.title


def test_a_cpu_lstm_that_asks_whether_cudnn_applies_stays_a_cpu_run(tmp_path):
    """A real CPU-only run of an nn.LSTM: it calls aten::cudnn_is_acceptable on the CPU, which is no sign of a GPU
    (it read "device: gpu (device activity not recorded)" and device_activity_missing on three public scripts)."""
    import torch

    torch.set_num_threads(1)
    model, batch = torch.nn.LSTM(8, 16), torch.randn(5, 2, 8)
    path = tmp_path / "lstm.json"
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                schedule=torch.profiler.schedule(wait=0, warmup=1, active=3),
                                on_trace_ready=lambda prof: prof.export_chrome_trace(str(path))) as prof:  # fmt: skip
        for _ in range(4):
            model(batch)[0].sum().backward()
            prof.step()
    assert "aten::cudnn_is_acceptable" in path.read_text()
    report = analyze(path)
    assert report.source.device == "cpu", report.source
    assert not _found(report, "device_activity_missing")
