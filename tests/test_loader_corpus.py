"""Every stored trace variant loads into the columnar model."""

from __future__ import annotations

import numpy as np
import pytest

from skalpel.trace import Kind, load

from .conftest import corpus

CASES = {
    "kineto/tb_plugin/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz": {"device": True, "memory": True},
    "hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz": {"device": True},
    "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz": {"device": True},
    "hta/mtia_inference_trace/mtia_inference_rank_0.json.gz": {"device": True},
    "hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz": {"device": False, "rank": 34},
    "extra/AMD-AGI__TraceLens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz": {"device": True, "memory": True},
    "extra/AMD-AGI__TraceLens/tests/traces/inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz": {"device": True},
}


@pytest.mark.parametrize("relative", sorted(CASES))
def test_corpus_trace_loads(relative: str) -> None:
    expected = CASES[relative]
    trace = load(corpus(relative))
    assert len(trace) > 0
    assert trace.has_device == expected["device"]
    assert (len(trace.memory) > 0) == expected.get("memory", False)
    assert trace.rank_ids == [expected.get("rank", 0)]
    assert np.all(trace.dur >= 0)
    assert trace.ts.min() == 0.0
    # every name id points into the interned table
    assert trace.name.max() < len(trace.names)


def test_device_events_link_to_their_launch() -> None:
    trace = load(corpus("hta/critical_path/cuda_event_sync/event_sync_trace.json.gz"))
    kernels = np.flatnonzero(trace.kind == Kind.KERNEL)
    launchers = trace.launcher[kernels]
    assert (launchers >= 0).all()
    assert set(trace.kind[launchers].tolist()) <= {Kind.RUNTIME, Kind.DRIVER}
    # the launch precedes the kernel
    assert (trace.ts[launchers] <= trace.ts[kernels]).all()


def test_mtia_device_events_correlate_through_flows() -> None:
    trace = load(corpus("hta/mtia_inference_trace/mtia_inference_rank_0.json.gz"))
    device = trace.kind == Kind.KERNEL
    assert (trace.correlation[device] != 0).mean() > 0.5


def test_two_rank_folder_loads_both_ranks() -> None:
    trace = load(corpus("hta/trace_filter"))
    assert trace.rank_ids == [0, 1]
    assert trace.ranks[0].world_size == 128


def test_flops_counts_stay_on_their_own_op(tmp_path) -> None:
    """with_flops writes a count on some ops: each loaded op keeps its own count, wherever it is in the file."""
    from tests.tracebuilder import TraceBuilder

    builder = TraceBuilder()
    builder.step(1, 0, 1000)
    for number in range(5):
        builder.host("aten::add", 10 + 100 * number, 50)
        builder.host("aten::mm", 60 + 100 * number, 30, flops=1000 * (number + 1))
    trace = load(builder.write(tmp_path / "rank.json"))
    ops = sorted((i for i in range(len(trace)) if trace.kind[i] == Kind.CPU_OP), key=lambda i: trace.ts[i])  # file order
    counts = [(trace.name_of(i), trace.args_of(i).get("flops")) for i in ops]
    assert counts == [item for number in range(5) for item in (("aten::add", None), ("aten::mm", 1000.0 * (number + 1)))]
