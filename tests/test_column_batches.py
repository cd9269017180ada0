"""The column builder's batch-wide shortcuts keep every event's own kind and fields.

``trace.columns`` classifies a batch's events through a table by name id (the category each
name first came with) and reads only the phases a batch holds; these tests plant what those
shortcuts could get wrong: one name in two categories, in either order and in later batches,
the profiler's own 'Trace' spans among ranges, and batches of one phase only. Events are decoded
into a struct per phase (``trace.events``) or, in a batch that does not fit those, into loose
events with every field: both build the same columns.
"""

from __future__ import annotations

import json
from pathlib import Path

import orjson

from skalpel.trace import load
from skalpel.trace.columns import ColumnBuilder
from skalpel.trace.events import Event, decode_events, event_from_dict
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


_MIXED = [
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": HOST, "tid": HOST, "ts": 10.0, "dur": 5.0,
     "args": {"External id": 7, "Input Dims": [[2, 3], [3, 4]], "flops": 48}},
    {"ph": "X", "cat": "kernel", "name": "gemm", "pid": DEVICE, "tid": STREAM, "ts": 12.0, "dur": 2.0,
     "args": {"correlation": 9, "External id": 7, "device": 0, "stream": 7, "grid": [1, 1, 1]}},
    {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "pid": DEVICE, "tid": STREAM, "ts": 14.0, "dur": 1.0,
     "args": {"correlation": 10, "bytes": 4096, "memory bandwidth (GB/s)": 3.5}},
    {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": 11, "pid": DEVICE, "tid": STREAM, "ts": 16.0, "bp": "e"},
    {"ph": "s", "cat": "ac2g", "name": 5, "id": [1], "pid": 1.5, "tid": HOST, "ts": "x"},  # wrong types, phase not read
    {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": HOST, "tid": HOST, "ts": 17.0, "s": "t",
     "args": {"Bytes": 512, "Total Allocated": 1024, "Total Reserved": 2048, "Device Type": 1, "Device Id": 0}},
    {"ph": "I", "name": "[memory]", "tid": HOST, "ts": 18.0, "args": {"Bytes": -512, "Addr": 99}},
    {"ph": "i", "name": "mark", "tid": HOST, "ts": 19.0},
    {"ph": "M", "name": "process_name", "pid": HOST, "args": {"name": {"nested": [1, 2]}}},
    {"ph": "B", "name": "begin", "pid": HOST, "tid": HOST, "ts": 20.0},
]  # fmt: skip


def _built(events: list) -> tuple:
    builder = ColumnBuilder()
    builder.add(events)
    columns, memory = builder.finish()
    return ({key: values.tolist() for key, values in columns.items()}, {key: values.tolist() for key, values in memory.items()},
            builder.extra, builder.names, builder.skipped, builder.unknown_phases)  # fmt: skip


def test_phase_structs_build_what_loose_events_build() -> None:
    """Each read phase is decoded into a struct of its own fields (the others skipped); a batch that does not fit
    them becomes ``Event``s with every field: both must give the same columns."""
    batch = orjson.dumps(_MIXED)
    typed, not_events = decode_events(batch)
    assert not_events == 0 and not any(isinstance(event, Event) for event in typed)  # the phases' own structs
    loose = [event_from_dict(item) for item in _MIXED]
    assert _built(typed) == _built(loose)
    columns, memory, extra, names, skipped, unknown = _built(typed)
    assert len(columns["ts"]) == 3 and memory["nbytes"] == [512, -512] and memory["addr"] == [-1, 99]
    assert extra[0] == {"flops": 48.0} and extra[2]["bytes"] == 4096 and skipped == 0 and not unknown


def test_a_phase_the_format_lacks_reads_the_batch_as_loose_events() -> None:
    batch = orjson.dumps([*_MIXED, {"ph": "Q", "name": "odd", "ts": 1.0}, {"name": "no phase", "ts": 2.0}])
    events, not_events = decode_events(batch)
    assert not_events == 0 and all(isinstance(event, Event) for event in events)
    columns, memory, extra, names, skipped, unknown = _built(events)
    assert _built(events[: len(_MIXED)])[:4] == (columns, memory, extra, names) and unknown == {"Q": 1}
