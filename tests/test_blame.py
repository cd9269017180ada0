"""Blame on hand-built traces: each cause planted in a step is found with its number and location,
and a look-alike beside it is not blamed. Every result's causes add up to the idle time they explain."""

from __future__ import annotations

from pathlib import Path

import pytest

from skalpel.analysis.blame import CATEGORIES, UNTRACED
from skalpel.analysis.bundle import run_analyses
from skalpel.diagnose.rule import Context
from skalpel.trace.loader import load
from tests.tracebuilder import TraceBuilder

STEP_US = 10_000.0


def _blame(builder: TraceBuilder, tmp_path: Path):
    trace = load(builder.write(tmp_path / "trace.json"))
    analyses = run_analyses(trace)
    result = analyses.blame
    for rank in result.ranks.values():  # the causes add up to the idle time, step by step
        assert sum(rank.by_category_ms.values()) == pytest.approx(rank.idle_ms, abs=1e-9)
        for step in rank.steps:
            assert sum(step.by_category_ms.values()) == pytest.approx(step.idle_ms, abs=1e-9)
        device = analyses.step_device.for_rank(rank.rank)
        assert rank.idle_ms == pytest.approx(sum(device.idle_ms), abs=1e-6)  # the idle time step_device measures
    return result, Context(analyses)


def _ms(result, category: str) -> float:
    return result.ranks[0].by_category_ms[category]


def _top(result, category: str):
    found = result.ranks[0].top(category)
    assert found, f"no {category} contributor in {result.ranks[0].contributors}"
    return found[0]


def _steps(builder: TraceBuilder, count: int = 3) -> None:
    for number in range(count):
        builder.step(number + 1, number * STEP_US, STEP_US - 1)


def test_host_preprocessing_before_the_first_kernel_is_blamed_on_its_range(tmp_path):
    builder = TraceBuilder()
    _steps(builder)
    for number in range(3):
        start = number * STEP_US
        builder.host("preprocess", start + 10, 5990, cat="user_annotation")
        builder.frame("train.py(42): preprocess", start + 10, 5990)
        builder.launch(start + 6010, 5, work_ts=start + 6020, work_dur=3900)
    result, ctx = _blame(builder, tmp_path)
    top = _top(result, "host_compute")
    assert top.label == "preprocess"
    assert top.ms == pytest.approx(3 * 5.99)
    assert result.ranks[0].dominant == "host_compute"
    assert _ms(result, "sync") == 0.0
    assert "train.py:42 in preprocess" in ctx.locations(top.events)[0]


def test_a_no_op_sync_at_window_start_is_not_blamed_for_the_host_work_after_it(tmp_path):
    builder = TraceBuilder()
    _steps(builder)
    for number in range(3):
        start = number * STEP_US
        # the device has been idle since the step before: the sync returns at once, then the host preprocesses
        builder.runtime("cudaStreamSynchronize", start + 5, 4)
        builder.host("preprocess", start + 10, 5990, cat="user_annotation")
        builder.launch(start + 6010, 5, work_ts=start + 6020, work_dur=3900)
    result, _ = _blame(builder, tmp_path)
    assert _ms(result, "sync") == 0.0
    assert result.ranks[0].syncs_waited == () and result.ranks[0].syncs_charged == ()
    assert _top(result, "host_compute").label == "preprocess"


def test_a_sync_that_waited_takes_the_idle_after_it_capped_at_what_it_drained(tmp_path):
    builder = TraceBuilder()
    _steps(builder)
    for number in range(3):
        start = number * STEP_US
        builder.launch(start + 10, 5, work_ts=start + 20, work_dur=5000)
        builder.runtime("cudaDeviceSynchronize", start + 30, 4991)  # waits for the kernel: drains 4990 us
        builder.host("aten::add", start + 5025, 1000)
        builder.launch(start + 7000, 5, work_ts=start + 7010, work_dur=2900)
    result, _ = _blame(builder, tmp_path)
    # the idle from the kernel's end (5020) to the next launch (7000): the sync's, 1.98 ms per step
    assert _ms(result, "sync") == pytest.approx(3 * 1.98)
    assert _top(result, "sync").label == "cudaDeviceSynchronize"
    assert len(result.ranks[0].syncs_waited) == len(result.ranks[0].syncs_charged) == 3


def test_a_sync_that_waited_6_us_is_not_charged_with_the_host_work_after_it(tmp_path):
    builder = TraceBuilder()
    _steps(builder)
    for number in range(3):
        start = number * STEP_US
        builder.launch(start + 10, 5, work_ts=start + 20, work_dur=16)
        builder.runtime("cudaStreamSynchronize", start + 30, 7)  # the kernel ends at 36: it drains 6 us
        builder.host("preprocess", start + 40, 5960, cat="user_annotation")
        builder.launch(start + 6000, 5, work_ts=start + 6010, work_dur=3900)
    result, _ = _blame(builder, tmp_path)
    assert _ms(result, "sync") == pytest.approx(3 * 0.006)
    assert _top(result, "host_compute").label == "preprocess"
    assert _top(result, "host_compute").ms == pytest.approx(3 * 5.96, abs=0.01)  # all but the sync's 6 us


def test_the_dataloader_fetch_is_data_loading(tmp_path):
    builder = TraceBuilder()
    _steps(builder)
    for number in range(3):
        start = number * STEP_US
        builder.host("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", start + 10, 5990)
        builder.launch(start + 6010, 5, work_ts=start + 6020, work_dur=3900)
    result, _ = _blame(builder, tmp_path)
    assert _top(result, "data_loading").ms == pytest.approx(3 * 5.99)
    assert result.ranks[0].dominant == "data_loading"


def test_a_compile_range_inside_the_window_is_compile_not_user_code(tmp_path):
    builder = TraceBuilder()
    _steps(builder)
    start = 0.0
    builder.host("_compile.compile_inner (dynamo_timed)", start + 10, 7990)
    builder.host("aten::mm", start + 100, 50)  # an op traced inside the compilation (fake tensors) is compile too
    builder.launch(start + 8010, 5, work_ts=start + 8020, work_dur=1900)
    for number in (1, 2):  # the look-alike: the same host time in the user's own range, in later steps
        start = number * STEP_US
        builder.host("forward", start + 10, 7990, cat="user_annotation")
        builder.launch(start + 8010, 5, work_ts=start + 8020, work_dur=1900)
    result, _ = _blame(builder, tmp_path)
    assert _top(result, "compile").label == "_compile.compile_inner (dynamo_timed)"
    assert _ms(result, "compile") == pytest.approx(7.99)
    assert result.ranks[0].steps[0].by_category_ms["compile"] == pytest.approx(7.99)
    assert result.ranks[0].steps[1].by_category_ms["compile"] == 0.0
    assert _top(result, "host_compute").label == "forward"


def test_cudnn_autotune_syncs_inside_the_first_convolution_are_one_time_work(tmp_path):
    builder = TraceBuilder()
    step = 40_000.0
    for number in range(3):
        builder.step(number + 1, number * step, step - 1)
    # first convolution: 30 ms of algorithm search, whose event syncs wait on its trial kernels
    builder.host("aten::cudnn_convolution", 10, 30_000)
    builder.launch(20, 5, work_ts=30, work_dur=1000)
    builder.runtime("cudaEventSynchronize", 40, 1000)
    builder.launch(30_020, 5, work_ts=30_030, work_dur=9000)
    for number in (1, 2):  # later convolutions are fast
        start = number * step
        builder.host("aten::cudnn_convolution", start + 10, 100)
        builder.launch(start + 20, 5, work_ts=start + 30, work_dur=39_000)
    result, _ = _blame(builder, tmp_path)
    assert _ms(result, "sync") == 0.0 and result.ranks[0].syncs_waited == ()  # the autotuning's syncs are its own
    assert _ms(result, "one_time_init") == pytest.approx(28.99, abs=0.01)
    assert _top(result, "one_time_init").label == "aten::cudnn_convolution"


def test_a_host_collective_blocks_and_a_queued_collective_kernel_waits_for_its_peers(tmp_path):
    builder = TraceBuilder()
    _steps(builder)
    builder.host("gloo:all_reduce", 10, 5990)
    builder.launch(6010, 5, work_ts=6020, work_dur=3900)
    start = STEP_US  # a collective queued in time that starts late: its peer arrived late
    builder.launch(start + 10, 5, work_ts=start + 4000, work_dur=5900, kernel="ncclDevKernel_AllReduce_Sum_f32_RING_LL")
    start = 2 * STEP_US  # the look-alike: the same queued work, a compute kernel, waits on another stream
    builder.launch(start + 10, 5, work_ts=start + 4000, work_dur=5900)
    result, _ = _blame(builder, tmp_path)
    steps = result.ranks[0].steps
    assert steps[0].by_category_ms["collective_wait"] == pytest.approx(5.99)
    assert steps[1].by_category_ms["collective_wait"] == pytest.approx(3.985)  # from the launch call's end
    assert steps[2].by_category_ms["collective_wait"] == 0.0
    assert steps[2].by_category_ms["other_stream"] == pytest.approx(3.985)


def test_python_between_ops_is_host_compute_located_at_the_next_launch(tmp_path):
    builder = TraceBuilder()
    _steps(builder)
    for number in range(3):
        start = number * STEP_US
        builder.launch(start + 6010, 5, work_ts=start + 6020, work_dur=3900)
    result, _ = _blame(builder, tmp_path)
    top = _top(result, "host_compute")
    # 6.01 ms before each kernel, and the 79 us after each step's kernel (the next step's Python, or the end's)
    assert top.label == UNTRACED and top.ms == pytest.approx(3 * 6.01 + 3 * 0.079)


def test_broken_links_leave_the_time_unexplained_with_a_note(tmp_path):
    builder = TraceBuilder()
    _steps(builder)
    # a kernel with no correlation, one whose launch is not in the trace, one that starts before its launch
    kernel = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 6000, "dur": 3900,
              "args": {"device": 0, "stream": 7}}  # fmt: skip
    builder.events.append(kernel)
    builder.events.append({**kernel, "ts": STEP_US + 6000, "args": {**kernel["args"], "correlation": 424242}})
    builder.launch(2 * STEP_US + 6010, 5, work_ts=2 * STEP_US + 5000, work_dur=4900)
    builder.runtime("cudaLaunchKernel", 100, 5)  # a launch with no kernel
    for number in range(3):  # an op in each step, so that no step is left out as empty
        builder.host("aten::mm", number * STEP_US + 200, 100)
    result, _ = _blame(builder, tmp_path)
    rank = result.ranks[0]
    assert len(rank.steps) == 3
    # each step's idle before its kernel, and the tails of steps 1 and 2 (the next kernel is broken); the last
    # step's tail has no next kernel: the thread that launched the one before it is charged
    assert rank.by_category_ms["unexplained"] == pytest.approx(6.0 + 6.0 + 5.0 + 2 * 0.099)
    assert any("no launch call" in note for note in rank.notes)
    assert any("clock skew" in note for note in rank.notes)


GLOO = 300  # gloo's own thread, where a CPU job's all_reduce runs


def _cpu_blame(builder: TraceBuilder, tmp_path: Path):
    """Blame of a CPU-only trace: the main thread's time outside its ops, charged; the causes add up to it."""
    builder.device_properties = []
    trace = load(builder.write(tmp_path / "trace.json"))
    result = run_analyses(trace).blame
    assert result.applies
    for rank in result.ranks.values():
        assert rank.waits_on == "main thread" and rank.to_dict()["waits_on"] == "main thread"
        assert sum(rank.by_category_ms.values()) == pytest.approx(rank.idle_ms, abs=1e-9)
        for step in rank.steps:
            assert sum(step.by_category_ms.values()) == pytest.approx(step.idle_ms, abs=1e-9)
    return result


def test_a_cpu_only_trace_blames_the_main_threads_waits(tmp_path):
    """Each 10 ms step: a 3 ms fetch (collate ops inside it are data loading, not compute), 2 ms of forward ops,
    1 ms of Python inside the optimizer's range, a 3 ms all_reduce on gloo's thread the main thread waits for."""
    builder = TraceBuilder()
    _steps(builder)
    for number in range(3):
        start = number * STEP_US
        builder.host("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", start, 3000, cat="user_annotation")
        builder.host("aten::stack", start + 2000, 900)  # collate, inside the fetch
        builder.host("aten::mm", start + 3000, 2000)
        builder.host("Optimizer.step#SGD.step", start + 5000, 1500, cat="user_annotation")
        builder.host("aten::add_", start + 5000, 500)
        builder.host("gloo:all_reduce", start + 6500, 3000, tid=GLOO)
        builder.host("aten::mul", start + 9500, 499)
    result = _cpu_blame(builder, tmp_path)
    rank = result.ranks[0]
    assert rank.idle_ms == pytest.approx(3 * (3.0 + 1.0 + 3.0))
    assert _top(result, "data_loading").ms == pytest.approx(9.0)
    assert _top(result, "collective_wait").label == "gloo:all_reduce" and _ms(result, "collective_wait") == pytest.approx(9.0)
    assert _top(result, "host_compute").label == "Optimizer.step#SGD.step" and _ms(result, "host_compute") == pytest.approx(3.0)


def test_a_collective_behind_the_main_threads_compute_is_no_wait(tmp_path):
    """The look-alike: the same all_reduce on gloo's thread while the main thread computes (overlapped)."""
    builder = TraceBuilder()
    _steps(builder)
    for number in range(3):
        start = number * STEP_US
        builder.host("aten::mm", start, 9000)
        builder.host("gloo:all_reduce", start + 2000, 3000, tid=GLOO)
    result = _cpu_blame(builder, tmp_path)
    assert _ms(result, "collective_wait") == 0.0
    assert result.ranks[0].idle_ms == pytest.approx(3 * 0.999)  # the step's last ms: Python after the op
    assert _top(result, "host_compute").label == UNTRACED


def test_every_category_has_words():
    from skalpel.analysis.blame import CATEGORY_WORDS

    assert set(CATEGORY_WORDS) == set(CATEGORIES)


# --- the findings read the blame ------------------------------------------------------------------


def _findings(builder: TraceBuilder, tmp_path: Path, finding_id: str):
    from skalpel.api import analyze

    report = analyze(builder.write(tmp_path / "trace.json"))
    return [finding for finding in report.findings if finding.id == finding_id]


def test_gpu_idle_leads_with_the_host_work_that_holds_the_device_back(tmp_path):
    builder = TraceBuilder()
    _steps(builder)
    for number in range(3):
        start = number * STEP_US
        builder.runtime("cudaStreamSynchronize", start + 5, 4)  # a no-op sync: not the culprit
        builder.host("preprocess", start + 10, 5990, cat="user_annotation")
        builder.frame("train.py(42): preprocess", start + 10, 5990)
        builder.launch(start + 6010, 5, work_ts=start + 6020, work_dur=3900)
    (idle,) = _findings(builder, tmp_path, "gpu_idle")
    culprit = idle.evidence["culprits"][0]
    assert culprit["category"] == "host_compute" and culprit["label"] == "preprocess"
    assert culprit["ms_per_step"] == pytest.approx(5.99) and "train.py:42" in culprit["location"]
    assert "host work before the next launch (preprocess)" in idle.title
    assert "preprocess at train.py:42" in idle.fix
    assert any("train.py:42" in where for where in idle.locations)
    assert idle.evidence["blame_ms_per_step"]["host_compute"] >= 5.99  # and the untraced Python around it
    assert "sync" not in idle.evidence["blame_ms_per_step"]
    assert _findings(builder, tmp_path, "host_device_sync") == []  # the sync returned at once


def test_gpu_idle_leads_with_compilation_inside_the_window(tmp_path):
    builder = TraceBuilder()
    _steps(builder)
    for number in range(3):
        start = number * STEP_US
        builder.host("_compile.compile_inner (dynamo_timed)", start + 10, 7990)
        builder.launch(start + 8010, 5, work_ts=start + 8020, work_dur=1900)
    (idle,) = _findings(builder, tmp_path, "gpu_idle")
    assert "in torch.compile compilation" in idle.title and "warm the compiled model up" in idle.fix


def _item_steps(builder: TraceBuilder, *, on_device: bool) -> None:
    """Each step: a 5 ms kernel, then .item(): on a device tensor it syncs; on a CPU step counter it does not."""
    _steps(builder)
    for number in range(3):
        start = number * STEP_US
        builder.launch(start + 10, 5, work_ts=start + 20, work_dur=5000)
        builder.host("aten::item", start + 30, 4995)
        builder.host("aten::_local_scalar_dense", start + 31, 4993)
        if on_device:
            builder.launch(start + 32, 3, work_ts=start + 5021, work_dur=2, name="cudaMemcpyAsync",
                           kernel="Memcpy DtoH (Device -> Pageable)", cat="gpu_memcpy", nbytes=4)  # fmt: skip
            builder.runtime("cudaStreamSynchronize", start + 36, 4987)
        builder.launch(start + 8000, 5, work_ts=start + 8010, work_dur=1900)


def test_item_on_a_device_tensor_is_a_sync_that_waited(tmp_path):
    builder = TraceBuilder()
    _item_steps(builder, on_device=True)
    (sync,) = _findings(builder, tmp_path, "host_device_sync")
    assert sync.evidence["item_count"] == 3 and sync.evidence["sync_call_count"] == 0
    assert sync.evidence["idle_after_ms_per_step"] == pytest.approx(2.98, abs=0.02)
    assert sync.severity == "warning"
    assert sync.evidence["sync_calls"] == ["cudaStreamSynchronize"]


def test_item_on_a_cpu_step_counter_is_no_sync(tmp_path):
    builder = TraceBuilder()
    _item_steps(builder, on_device=False)
    assert _findings(builder, tmp_path, "host_device_sync") == []


def test_cudnn_autotune_syncs_are_no_host_device_sync(tmp_path):
    builder = TraceBuilder()
    step = 40_000.0
    for number in range(3):
        builder.step(number + 1, number * step, step - 1)
    builder.host("aten::cudnn_convolution", 10, 30_000)
    builder.launch(20, 5, work_ts=30, work_dur=1000)
    builder.runtime("cudaEventSynchronize", 40, 1000)
    builder.launch(30_020, 5, work_ts=30_030, work_dur=9000)
    for number in (1, 2):
        start = number * step
        builder.host("aten::cudnn_convolution", start + 10, 100)
        builder.launch(start + 20, 5, work_ts=start + 30, work_dur=39_000)
    assert _findings(builder, tmp_path, "host_device_sync") == []


@pytest.mark.parametrize("blocked_in_gloo", [False, True])
def test_cpu_launch_bound_counts_no_collective_wait_and_names_no_cuda_graphs(tmp_path, blocked_in_gloo):
    """800 tiny host ops per 10 ms step on a CPU-only job: framework overhead, unless most of the rest of the step
    is spent blocked in a gloo all_reduce (waiting for peers, not dispatching ops)."""
    builder = TraceBuilder()
    _steps(builder)
    for number in range(3):
        start = number * STEP_US
        for op in range(800):
            builder.host("aten::add", start + 10 + 5 * op, 4)
        if blocked_in_gloo:
            builder.host("gloo:all_reduce", start + 4100, 5800)
    found = _findings(builder, tmp_path, "launch_bound")
    if blocked_in_gloo:
        assert found == []
    else:
        (finding,) = found
        assert "CUDA graph" not in finding.fix and "reduce-overhead" not in finding.fix
        assert finding.evidence["collective_ms_per_step"] == 0.0


def test_explain_lists_the_blame_categories(capsys):
    from skalpel.cli import main

    assert main(["explain", "blame"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in CATEGORIES)
    assert main(["explain"]) == 0 and "skalpel explain blame" in capsys.readouterr().out


def test_the_report_carries_each_steps_blame_and_the_terminal_shows_it(tmp_path):
    from skalpel.api import analyze
    from skalpel.report import terminal

    builder = TraceBuilder()
    _steps(builder)
    for number in range(3):
        start = number * STEP_US
        builder.host("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", start + 10, 5990)
        builder.launch(start + 6010, 5, work_ts=start + 6020, work_dur=3900)
    report = analyze(builder.write(tmp_path / "trace.json"))
    blamed = report.ranks[0].extra["blame"]
    assert [step["number"] for step in blamed["steps"]] == [1, 2, 3]
    for step in blamed["steps"]:
        assert sum(step["ms"].values()) == pytest.approx(step["idle_ms"], abs=1e-3)
    assert blamed["ms_per_step"]["data_loading"] == pytest.approx(5.99)
    assert blamed["top"][0]["label"].startswith("enumerate(DataLoader)")
    out = " ".join(terminal.render_text(report, width=200).split())
    assert "idle by cause: data_loading 9" in out


def test_at_equal_severity_the_cause_is_listed_before_the_symptom(tmp_path):
    from skalpel.api import analyze

    builder = TraceBuilder()
    _steps(builder)
    for number in range(3):  # the loader holds 60% of each step: dataloader_bound and gpu_idle, both critical
        start = number * STEP_US
        builder.host("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", start + 10, 5990)
        builder.launch(start + 6010, 5, work_ts=start + 6020, work_dur=3900)
    ids = [(finding.severity, finding.id) for finding in analyze(builder.write(tmp_path / "trace.json")).findings]
    assert ids.index(("critical", "dataloader_bound")) < ids.index(("critical", "gpu_idle"))


def test_without_markers_each_inferred_iteration_is_blamed(tmp_path):
    builder = TraceBuilder()
    for number in range(4):  # an unmarked loop: a 6 ms fetch, then a 4 ms kernel
        start = number * STEP_US
        builder.host("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", start + 10, 5990)
        builder.launch(start + 6010, 5, work_ts=start + 6020, work_dur=3900)
    result, _ = _blame(builder, tmp_path)
    rank = result.ranks[0]
    assert rank.unit == "iteration" and [step.number for step in rank.steps] == [1, 2, 3, 4]
    assert all(step.by_category_ms["data_loading"] == pytest.approx(5.99) for step in rank.steps)


def test_a_slow_cudamalloc_is_named_not_the_range_around_it(tmp_path):
    """The caching allocator growing (cudaMalloc) inside the user's range is the cause HTA's critical path names
    too; the same range without it stays charged to the range."""
    builder = TraceBuilder()
    _steps(builder)
    for number in range(3):
        start = number * STEP_US
        builder.host("forward", start + 10, 7990, cat="user_annotation")
        builder.host("aten::empty", start + 20, 6000)
        if number == 0:
            builder.runtime("cudaMalloc", start + 30, 5900)
        builder.launch(start + 8010, 5, work_ts=start + 8020, work_dur=1900)
    result, _ = _blame(builder, tmp_path)
    malloc = [item for item in result.ranks[0].top("host_compute") if item.label == "cudaMalloc"]
    assert malloc and malloc[0].ms == pytest.approx(5.9)
    assert _top(result, "host_compute").label == "forward"  # steps 1 and 2, and step 0 outside the cudaMalloc


def test_python_between_ops_is_named_by_the_users_function_that_ran_it(tmp_path):
    """Host work no op records (numpy augmentation, tokenizing in Python) is named by the user's innermost
    function around it, each with its own time; a library frame inside it (numpy) does not take the name, and
    the Python outside any user function stays "host code between recorded ops"."""
    builder = TraceBuilder()
    _steps(builder)
    for number in range(3):
        start = number * STEP_US
        builder.frame("train.py(50): <module>", start + 1, STEP_US - 2)
        builder.frame("train.py(12): augment", start + 10, 3990)
        builder.frame("numpy/core/fromnumeric.py(3100): mean", start + 100, 1000)
        builder.frame("train.py(30): tokenize", start + 4010, 1990)
        builder.launch(start + 6010, 5, work_ts=start + 6020, work_dur=3900)
    result, ctx = _blame(builder, tmp_path)
    named = {item.label: item for item in result.ranks[0].top("host_compute")}
    assert named["augment() in train.py:12"].ms == pytest.approx(3 * 3.99)
    assert named["tokenize() in train.py:30"].ms == pytest.approx(3 * 1.99)
    assert "numpy" not in " ".join(named)
    # the module's own code: 9 us before augment, 10 after it, 10 after tokenize, and the step's 79 us tail
    assert named["module level of train.py"].ms == pytest.approx(3 * (0.009 + 0.010 + 0.010 + 0.079))
    assert ctx.locations(named["augment() in train.py:12"].events)[0] == "train.py:12 in augment"
    (idle,) = _findings(builder, tmp_path, "gpu_idle")
    assert "host work before the next launch (augment() in train.py:12)" in idle.title
    assert idle.fix.startswith("the host runs augment() in train.py:12 while the device waits")  # its line once


@pytest.mark.parametrize("stacks", [True, False], ids=["with-stacks", "no-stacks"])
def test_host_bound_names_the_python_outside_the_ops_of_a_cpu_step(tmp_path, stacks):
    """A CPU-only step: 6 ms of augment() with no op in it, 3 ms of ops. With Python stacks the finding names the
    function and its share of the step (a warning); without, the time has no name (a sleep, I/O and a lock look
    the same): an info note that says how to name it."""
    builder = TraceBuilder()
    builder.device_properties = []
    _steps(builder)
    for number in range(3):
        start = number * STEP_US
        if stacks:
            builder.frame("train.py(12): augment", start + 10, 6000)
        builder.host("aten::mm", start + 6500, 3000)
    (found,) = _findings(builder, tmp_path, "host_bound")
    assert found.evidence["outside_ops_pct"] == pytest.approx(100 * 7.0 / 9.999, abs=0.1)
    lead = found.evidence["culprits"][0]
    if stacks:
        assert found.severity == "critical"  # 70% of the step
        assert lead["label"] == "augment() in train.py:12" and lead["share_pct"] == pytest.approx(60.0, abs=0.1)
        assert "60% of the step in augment() in train.py:12" in found.title and "DataLoader workers" in found.fix
    else:
        assert found.severity == "info" and lead["label"] == UNTRACED and "with_stack=True" in found.fix


def _item_iterations(builder: TraceBuilder, count: int = 5) -> None:
    """Unmarked iterations of 10 ms (an SGD step each, from which the loop is found): a 5 ms kernel, then .item() on
    its result, which syncs; the device idles ~3 ms after each sync until the next launch."""
    for number in range(count):
        start = number * STEP_US
        builder.launch(start + 10, 5, work_ts=start + 20, work_dur=5000)
        builder.host("aten::item", start + 30, 4995)
        builder.host("aten::_local_scalar_dense", start + 31, 4993)
        builder.launch(start + 32, 3, work_ts=start + 5021, work_dur=2, name="cudaMemcpyAsync",
                       kernel="Memcpy DtoH (Device -> Pageable)", cat="gpu_memcpy", nbytes=4)  # fmt: skip
        builder.runtime("cudaStreamSynchronize", start + 36, 4987)
        builder.launch(start + 8000, 5, work_ts=start + 8010, work_dur=1900)
        builder.host("Optimizer.step#SGD.step", start + 9000, 900, cat="user_annotation")


@pytest.mark.parametrize("marked", [True, False])
def test_without_markers_a_sync_is_counted_per_iteration_not_per_window(tmp_path, marked):
    """Five iterations, one .item() sync each: "1 sync per step", ~3 ms idle per step and ~30% of it, with step
    markers or without (per iteration found from the loop), never "5 syncs per step" over the whole window."""
    builder = TraceBuilder()
    if marked:
        _steps(builder, count=5)
    _item_iterations(builder)
    (sync,) = _findings(builder, tmp_path, "host_device_sync")
    assert sync.evidence["syncs_per_step"] == pytest.approx(1.0, abs=0.25), sync.title
    assert sync.evidence["idle_after_ms_per_step"] == pytest.approx(2.98, abs=0.7), sync.title
    assert sync.evidence["share_pct"] == pytest.approx(30, abs=8), sync.title
