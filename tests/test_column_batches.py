"""The column builder's batch-wide shortcuts keep every event's own kind and fields.

``trace.columns`` classifies a batch's events through a table by name id (the category each
name first came with) and reads only the phases a batch holds; these tests plant what those
shortcuts could get wrong: one name in two categories, in either order and in later batches,
the profiler's own 'Trace' spans among ranges, and batches of one phase only.
"""

from __future__ import annotations

import json
from pathlib import Path

from skalpel.trace import load
from skalpel.trace.kinds import Kind

from .tracebuilder import DEVICE, HOST, STREAM, TraceBuilder

NAME = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"


def _kinds_of(trace, name: str) -> list[int]:
    """The kind of every event of that name, in trace order."""
    return [int(trace.kind[index]) for index in range(len(trace)) if trace.name_of(index) == name]


def test_one_name_in_two_categories_keeps_a_kind_per_category(tmp_path: Path) -> None:
    builder = TraceBuilder()
    for step in range(12_000):  # batches of 1 MB: the name comes back, in both categories, long after it was first seen
        ts = 100.0 * step
        cat, pid, tid = ("cpu_op", HOST, HOST) if step % 2 else ("kernel", DEVICE, STREAM)
        builder.events.append({"ph": "X", "cat": cat, "name": NAME, "pid": pid, "tid": tid, "ts": ts, "dur": 10.0,
                               "args": {"correlation": step + 1, "device": DEVICE, "stream": STREAM}})  # fmt: skip
    trace = load(builder.write(tmp_path / "two.json"), workers=1)
    kinds = _kinds_of(trace, NAME)
    assert len(kinds) == 12_000
    assert kinds[0::2] == [Kind.COMM_KERNEL] * 6000  # a kernel of NCCL: a collective on the device
    assert kinds[1::2] == [Kind.CPU_OP] * 6000  # the same name as a host op stays a host op


def test_profiler_spans_and_phases_a_batch_lacks(tmp_path: Path) -> None:
    builder = TraceBuilder()
    for step in range(10_000):
        builder.host("aten::mm", 50.0 * step, 20.0)
    builder.events.append({"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler",
                           "ts": 0.0, "dur": 1e6})  # fmt: skip
    for step in range(10_000):  # a run of instants alone, then flow starts alone: batches (of about 1 MB) of one phase
        builder.memory(50.0 * step + 1, 4096, 4096 * (step + 1))
    path = builder.write(tmp_path / "phases.json")
    document = json.loads(path.read_text())
    document["traceEvents"] += [{"ph": "s", "cat": "ac2g", "id": 7 + step, "pid": HOST, "tid": HOST, "ts": 50.0 * step}
                                for step in range(20_000)]  # fmt: skip
    path.write_text(json.dumps(document))
    trace = load(path, workers=1)
    assert len(trace) == 10_000 and {trace.name_of(index) for index in range(len(trace))} == {"aten::mm"}  # no Trace span
    assert len(trace.memory) == 10_000 and int(trace.memory.total_allocated.max()) == 4096 * 10_000
    assert not any("ignored" in warning or "skipped" in warning for warning in trace.warnings)
