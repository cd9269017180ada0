"""Host-device syncs and the memory curve, on stored real traces and on a real torch.profiler run."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from skalpel.analysis.memory import memory
from skalpel.analysis.steps import segment_steps
from skalpel.analysis.syncs import syncs
from skalpel.job.report_of import report_of_trace
from skalpel.result.report import Report
from skalpel.trace.kinds import Kind
from skalpel.trace.loader import load

from .conftest import corpus

LEAK_BYTES = 1 << 20


def _analyse(relative: str):
    trace = load([corpus(relative)])
    steps = segment_steps(trace)
    return trace, steps


def test_every_kind_of_sync_in_the_event_sync_trace():
    trace, steps = _analyse("hta/critical_path/cuda_event_sync/event_sync_trace.json.gz")
    result = syncs(trace, steps).for_rank(0)
    cats = result.categories
    assert cats["device_sync"].count == 4  # Stream Sync, 2x Event Sync, Context Sync
    assert sorted(trace.name_of(i) for i in cats["sync_call"].worst_events) == [
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
        "cudaStreamSynchronize",
    ]
    assert cats["item"].count == 1  # aten::item, not again for the _local_scalar_dense inside it
    assert trace.name_of(cats["item"].worst_events[0]) == "aten::item"
    assert cats["blocking_dtoh"].count == 1
    copy = cats["blocking_dtoh"].worst_events[0]
    assert trace.name_of(copy) == "Memcpy DtoH (Device -> Pageable)"
    assert trace.name_of(trace.launcher[copy]) == "cudaMemcpyAsync"
    # the ms figures are the host calls' own durations
    sync_calls = [i for i in range(len(trace)) if trace.kind[i] == Kind.RUNTIME and trace.name_of(i).endswith("Synchronize")]
    assert cats["sync_call"].total_ms == pytest.approx(trace.dur[sync_calls].sum() / 1000)
    assert 0 < result.blocked_ms_per_step <= sum(c.total_ms for k, c in cats.items() if k != "device_sync")


def test_blocking_copies_and_items_in_a_training_trace():
    """trace_diff/test: 30 .item() calls, 60 device-to-pageable copies, 6 steps."""
    trace, steps = _analyse("hta/trace_diff/test/test.json.gz")
    result = syncs(trace, steps).for_rank(trace.rank_ids[0])
    assert result.steps == 6
    assert result.categories["item"].count == 30
    assert result.categories["blocking_dtoh"].count == 60
    # nested calls are counted once in the blocked total
    item_ms = result.categories["item"].ms_per_step
    copy_ms = result.categories["blocking_dtoh"].ms_per_step
    assert max(item_ms, copy_ms) <= result.blocked_ms_per_step < item_ms + copy_ms
    worst = result.categories["blocking_dtoh"].worst_events
    durations = [trace.dur[trace.launcher[i]] for i in worst]
    assert durations == sorted(durations, reverse=True)


def test_pageable_host_to_device_copies():
    trace, steps = _analyse("hta/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz")
    pageable = syncs(trace, steps).for_rank(0).pageable_htod
    raw = json.load(gzip.open(corpus("hta/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz")))
    copies = [e for e in raw["traceEvents"] if e.get("name") == "Memcpy HtoD (Pageable -> Device)"]
    assert pageable.count == len(copies) == 16
    assert pageable.total_bytes == sum(e["args"]["bytes"] for e in copies)
    assert pageable.device_ms == pytest.approx(sum(e["dur"] for e in copies) / 1000)


def test_cpu_only_trace_has_no_syncs_and_no_memory():
    trace, steps = _analyse("hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")
    result = syncs(trace, steps).for_rank(trace.rank_ids[0])
    assert all(category.count == 0 for category in result.categories.values())
    assert memory(trace, steps) is None


@pytest.mark.slow
def test_memory_curve_with_total_allocated():
    trace, steps = _analyse("hta/df_index_resolver/df_index_resolver.json.gz")
    result = memory(trace, steps)
    cuda = result.main_device(trace.rank_ids[0])
    assert cuda.device == "cuda:1" and cuda.absolute
    on_device = (trace.memory.device_type == 1) & (trace.memory.device_id == 1)
    assert cuda.peak_bytes == int(trace.memory.total_allocated[on_device].max())
    assert len(cuda.curve) == 2000 < cuda.events
    assert max(value for _, value in cuda.curve) == cuda.peak_bytes  # downsampling keeps the peak
    assert cuda.growth_bytes_per_step == 0.0  # a steady training loop: no leak
    assert cuda.largest_alloc_bytes == int(trace.memory.nbytes[on_device].max())
    assert cuda.largest_alloc_op == "aten::mm"
    assert trace.name_of(cuda.largest_alloc_op_event) == "aten::mm"


def test_memory_curve_from_bytes_alone():
    """2021 traces have no Total Allocated: the curve is the running sum of Bytes, never below 0."""
    trace, steps = _analyse("kineto/tb_plugin/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz")
    result = memory(trace, steps)
    assert (trace.memory.total_allocated < 0).all()
    for device in result.devices:
        assert not device.absolute
        values = np.array([value for _, value in device.curve])
        assert values.min() >= 0 and device.peak_bytes == values.max()
    cuda = result.main_device(trace.rank_ids[0])
    assert cuda.device.startswith("cuda")
    assert cuda.peak_bytes > 0


def test_damaged_byte_counts_never_wrap_the_running_sum():
    """Bytes fields read as up to 2**63 (a damaged trace) count as 1 TiB each: the sum of millions of events cannot
    wrap round int64 into a negative or tiny peak."""
    trace, steps = _analyse("kineto/tb_plugin/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz")
    real = memory(trace, steps).main_device(trace.rank_ids[0]).peak_bytes
    rows = np.flatnonzero(trace.memory.device_type == trace.memory.device_type[np.argmax(trace.memory.nbytes)])[:4]
    trace.memory.nbytes[rows] = [2**63 - 1, 2**63 - 1, 2**63 - 1, -(2**63 - 1)]
    damaged = memory(trace, steps).main_device(trace.rank_ids[0])
    values = np.array([value for _, value in damaged.curve])
    assert values.min() >= 0 and 3 * 2**40 <= damaged.peak_bytes <= real + 3 * 2**40


@pytest.fixture(scope="module")
def leaking_run(tmp_path_factory):
    """A real torch.profiler run on CPU: six profiled steps, each leaking 1 MiB and calling .item()."""
    import torch  # a dependency of skalpel: never skipped
    path = tmp_path_factory.mktemp("leak") / "trace.json"
    torch.set_num_threads(1)
    kept = []
    weight = torch.randn(128, 128)
    schedule = torch.profiler.schedule(wait=0, warmup=1, active=6, repeat=1)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        profile_memory=True,
        schedule=schedule,
        on_trace_ready=lambda prof: prof.export_chrome_trace(str(path)),
    ) as prof:
        for _ in range(8):
            out = (torch.randn(32, 128) @ weight).relu()
            kept.append(torch.empty(LEAK_BYTES // 4))  # float32: 1 MiB kept alive per step
            out.sum().item()
            prof.step()
    return load([path])


@pytest.mark.slow
def test_leak_shows_as_growth_per_step(leaking_run):
    trace = leaking_run
    steps = segment_steps(trace)
    assert steps.marked and len(steps.steps) == 6
    host = memory(trace, steps).main_device(0)
    assert host.device == "cpu" and host.absolute
    assert host.growth_bytes_per_step == LEAK_BYTES
    assert host.largest_alloc_bytes == LEAK_BYTES
    assert host.largest_alloc_op == "aten::empty"
    result = syncs(trace, steps).for_rank(0)
    assert result.categories["item"].count == 6
    assert all(trace.name_of(i) == "aten::item" for i in result.categories["item"].worst_events)


@pytest.mark.slow
def test_report_carries_memory_and_sync_summaries(leaking_run):
    report = report_of_trace(leaking_run)
    rank = report.ranks[0]
    assert rank.gpu is None  # CPU-only: no device breakdown
    assert rank.memory.growth_bytes_per_step == LEAK_BYTES
    assert rank.memory.peak_bytes >= 6 * LEAK_BYTES
    assert rank.extra["syncs"]["item_count"] == 6
    assert "launch" not in rank.extra
    again = Report.from_json(report.to_json())
    assert again.ranks[0].memory == rank.memory
    assert again.ranks[0].extra == rank.extra
