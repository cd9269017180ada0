"""torch.compile events: compiled regions, compile ids, recompilation, Triton kernels."""

from __future__ import annotations

import warnings

import pytest

from skalpel.analysis.compile import compile_events
from skalpel.analysis.steps import segment_steps
from skalpel.job.report_of import report_of_trace
from skalpel.trace.loader import load

from .conftest import corpus
from .tracebuilder import TraceBuilder


def _compile(relative: str):
    trace = load([corpus(relative)])
    return trace, compile_events(trace, segment_steps(trace))


def test_triton_example():
    _, result = _compile("hta/triton_example/triton_example.json.gz")
    assert result.regions == 1
    assert result.compile_ids == ("0/0",)
    assert result.recompiles == 0
    assert result.cache_lookups == 1
    assert result.triton_kernels == 1 and result.triton_share_pct == 100.0
    assert result.compilations == 0  # compiled before profiling started


def test_region_id_shows_an_earlier_recompilation():
    """vLLM on B200 runs `Torch-Compiled Region: 0/1`: frame 0 was compiled a second time."""
    _, result = _compile("extra/AMD-AGI__TraceLens/tests/traces/b200/eager_trace.json.gz")
    assert result.compile_ids == ("0/1",)
    assert result.frames == 1 and result.recompiles == 1


@pytest.mark.slow
def test_triton_heavy_trace():
    trace, result = _compile("extra/AMD-AGI__TraceLens/tests/traces/inference/xdit_sd_3.5/profile_trace_rank_0.json.gz")
    assert result.regions == 4 and result.compile_ids == ("0/0",)
    assert result.triton_kernel_names == 26
    assert result.triton_kernels == 856 + 608 + 612  # triton_poi_ + triton_red_ + triton_per_ launches
    assert 0 < result.triton_share_pct < 100


def test_aot_autograd_functions_without_dynamo():
    _, result = _compile("hta/trace_diff/test/test.json.gz")
    assert result.compiled_functions > 0 and result.compiled_function_ms > 0
    assert result.regions == 0 and result.compile_ids == ()


def test_no_compile_in_an_eager_trace():
    _, result = _compile("hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")
    assert not result.used


@pytest.fixture(scope="module")
def recompiling_run(tmp_path_factory):
    """A real run: torch.compile (aot_eager, no C++ compiler needed), recompiling at step 3 on a new shape."""
    import torch  # a dependency of skalpel: never skipped
    path = tmp_path_factory.mktemp("compile") / "trace.json"
    torch.set_num_threads(1)
    torch._dynamo.reset()

    def function(x):
        return torch.sin(x) + torch.cos(x) * 2

    compiled = torch.compile(function, backend="aot_eager", dynamic=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Profiler won't be using warmup": compiling in step 1 is the point
        schedule = torch.profiler.schedule(wait=0, warmup=0, active=4, repeat=1)
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            schedule=schedule,
            on_trace_ready=lambda prof: prof.export_chrome_trace(str(path)),
        ) as prof:
            for step in range(5):
                compiled(torch.randn(8 if step < 2 else 16))
                prof.step()
    torch._dynamo.reset()
    return load([path])


@pytest.mark.slow
def test_recompilation_in_steady_state(recompiling_run):
    trace = recompiling_run
    result = compile_events(trace, segment_steps(trace))
    assert result.compile_ids == ("0/0", "0/1")
    assert result.frames == 1 and result.recompiles == 1
    assert result.compilations == 2
    assert result.compilations_after_first_step == 1
    assert [trace.name_of(i) for i in result.compile_events] == ["dynamo", "dynamo"]
    assert result.compile_ms > 0
    assert result.regions >= 3 and result.cache_lookups >= 3


@pytest.mark.slow
def test_compile_summary_in_report(recompiling_run):
    extra = report_of_trace(recompiling_run).ranks[0].extra
    assert extra["compile"]["recompiles"] == 1
    assert extra["compile"]["compilations_after_first_step"] == 1
    assert all(isinstance(value, (int, float)) for value in extra["compile"].values())


def test_compiled_region_groups_its_triton_kernels():
    """TraceLens's torch.compile trace (GPU): the region's device work and Triton kernels are grouped back to it."""
    from skalpel.analysis.compiled_regions import compiled_regions

    trace = load([corpus("extra/AMD-AGI__TraceLens/tests/traces/torch_compile_triton/trace.json.gz")])
    (row,) = compiled_regions(trace, trace.rank_ids[0])
    assert row.region == "0/0" and row.calls == 1
    assert row.kernels == 12 and row.triton_kernels == 4 and row.device_ms > row.host_ms > 0
    assert row.function is None  # no compile log in a trace from elsewhere: the region cannot be named


def _region_trace(tmp_path, *, launch_first: bool, unlinked: bool):
    """A compiled region that launches one Triton kernel of 30 us; optionally a device copy no launch call links to."""
    builder = TraceBuilder()
    if launch_first:  # the file's first event: index 0 of the loaded trace
        builder.launch(100, 5, work_ts=110, work_dur=30, kernel="triton_poi_fused_add_0")
    if unlinked:  # a device event of its own duration (70 us) with no launch call: not the region's work
        builder.events.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0,
                               "tid": 7, "ts": 60, "dur": 70, "args": {"device": 0, "stream": 7}})  # fmt: skip
    builder.host("Torch-Compiled Region: 0/0", 100, 50)
    if not launch_first:
        builder.launch(100, 5, work_ts=110, work_dur=30, kernel="triton_poi_fused_add_0")
    builder.step(1, 90, 100)
    return load([builder.write(tmp_path / "region.json")])


@pytest.mark.parametrize("launch_first, unlinked", [(True, False), (False, True), (True, True)])
def test_compiled_region_counts_only_the_kernels_it_launched(tmp_path, launch_first: bool, unlinked: bool):
    """The region's device time is its Triton kernel's 30 us, whether the launch is the trace's first event or a
    device copy no launch call links to comes first."""
    from skalpel.analysis.compiled_regions import compiled_regions

    trace = _region_trace(tmp_path, launch_first=launch_first, unlinked=unlinked)
    (row,) = compiled_regions(trace, trace.rank_ids[0])
    assert (row.kernels, row.triton_kernels) == (1, 1)
    assert row.device_ms == pytest.approx(0.030)
