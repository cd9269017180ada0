"""The op table (against torch's own key_averages) and the kernel table, on real traces."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np
import pytest

from skalpel.analysis.kernels import kernel_table
from skalpel.analysis.ops import _NESTING, _parents, op_table, self_times
from skalpel.trace import Kind, load
from skalpel.trace.nesting import innermost_enclosing

from .conftest import corpus
from .tracebuilder import HOST, TraceBuilder

_NW0 = "kineto/tb_plugin/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"


@functools.lru_cache(maxsize=None)
def _load(relative: str):
    return load(corpus(relative))


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """A small real CPU training run under torch.profiler: (exported trace path, key_averages by name)."""
    import torch  # a dependency of skalpel: never skipped
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    inputs, labels = torch.randn(32, 64), torch.randint(0, 10, (32,))
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
        for _ in range(5):
            with torch.profiler.record_function("train_step"):
                loss = torch.nn.functional.cross_entropy(model(inputs), labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            prof.step()
    path = tmp_path_factory.mktemp("ops") / "trace.json"
    prof.export_chrome_trace(str(path))
    return path, {event.key: event for event in prof.key_averages()}


def test_op_table_agrees_with_key_averages(profiled):
    path, averages = profiled
    table = op_table(load(path)).ranks[0]
    assert table.sorted_by == "self_ms"  # CPU-only run
    ours = {row.name: row for row in table.rows}
    top = sorted(averages.values(), key=lambda event: -event.self_cpu_time_total)[:10]
    assert any(event.key == "aten::addmm" for event in top)
    for event in top:
        row = ours[event.key]
        assert row.calls == event.count, event.key
        assert row.self_ms * 1000 == pytest.approx(event.self_cpu_time_total, rel=0.01, abs=2.0), event.key
        assert row.total_ms * 1000 == pytest.approx(event.cpu_time_total, rel=0.01, abs=2.0), event.key
    addmm = ours["aten::addmm"]
    assert addmm.input_shapes is not None and "[32,64]" in addmm.input_shapes.replace(" ", "")


def test_rows_sorted_by_self_time_without_device():
    table = op_table(_load("hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")).ranks[0]
    assert table.sorted_by == "self_ms"
    assert table.rows[0].name == "gloo:all_reduce"
    assert table.rows[0].calls == 10
    self_ms = [row.self_ms for row in table.rows]
    assert self_ms == sorted(self_ms, reverse=True)
    assert all(row.device_ms == 0 for row in table.rows)


@pytest.mark.slow
def test_device_time_rolls_up_to_the_innermost_op():
    trace = _load(_NW0)
    table = op_table(trace).ranks[0]
    assert table.sorted_by == "device_ms"
    device_ms = [row.device_ms for row in table.rows]
    assert device_ms == sorted(device_ms, reverse=True)
    device = np.isin(trace.kind, [Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET])
    attributed = device & (trace.op_of_event >= 0)
    assert attributed.sum() > 0.99 * device.sum()
    assert sum(device_ms) == pytest.approx(trace.dur[attributed].sum() / 1000, rel=1e-9)
    # Self device time: wrapper ops launch nothing themselves, the cudnn op underneath does.
    rows = {row.name: row for row in table.rows}
    assert table.rows[0].name.startswith("aten::cudnn_convolution")
    assert rows["aten::convolution"].device_ms == 0
    assert all(row.self_ms <= row.total_ms + 1e-9 for row in table.rows)


def test_device_time_found_by_nesting_when_external_ids_do_not_link():
    """HTA's sampled traces rewrite the runtime's External id; the enclosing op on the thread stands in."""
    trace = _load("hta/trace_filter/sampled_rank-0.json.gz")
    launches = np.flatnonzero(trace.kind == Kind.RUNTIME)
    ops = np.flatnonzero(np.isin(trace.kind, [Kind.CPU_OP, Kind.USER_ANNOTATION]))
    named = np.isin(trace.external_id[launches], trace.external_id[ops]) & (trace.external_id[launches] != 0)
    assert not named.any()  # the External id link is broken in this file
    found = trace.op_of_event[launches[trace.dur[launches] > 0]]
    assert (found >= 0).mean() > 0.5
    assert np.isin(trace.kind[found[found >= 0]], [Kind.CPU_OP, Kind.COMM_OP, Kind.USER_ANNOTATION]).all()
    table = op_table(trace).ranks[0]
    device = np.isin(trace.kind, [Kind.KERNEL, Kind.COMM_KERNEL, Kind.MEMCPY, Kind.MEMSET])
    assert sum(row.device_ms for row in table.rows) == pytest.approx(trace.dur[device].sum() / 1000, rel=1e-9)
    assert table.rows[0].name.startswith("nccl:")


@pytest.mark.slow
def test_nesting_fallback_agrees_with_external_ids():
    """Where the External ids are right (torch 1.9's ResNet-50), the innermost op around each launch call is the
    op its id names: the fallback for broken ids names the op Kineto would have named."""
    trace = _load(_NW0)
    calls = np.unique(trace.launcher[trace.launcher >= 0])
    nesting = np.flatnonzero(np.isin(trace.kind, _NESTING))
    enclosing = innermost_enclosing(trace.rank, trace.pid, trace.tid, trace.ts, trace.dur, nesting, calls)
    by_id = {int(trace.external_id[op]): op for op in np.flatnonzero(np.isin(trace.kind, [Kind.CPU_OP]))}
    named = np.array([by_id.get(int(trace.external_id[call]), -1) for call in calls])
    assert (named >= 0).all()
    np.testing.assert_array_equal(enclosing, named)
    np.testing.assert_array_equal(trace.op_of_event[calls], named)


def _sgemm_under_addmm(tmp_path, named: str | None):
    """An ``aten::addmm`` whose 200 us sgemm is launched inside it, and beside it an ``aten::relu`` with a 50 us
    kernel, linked the usual way. ``named``: the op that the sgemm's launch call names instead, by carrying its
    correlation id as External id (as some exporters write it): an ``aten::as_strided`` earlier on the thread, or
    an ``aten::dropout`` on another thread that spans the call."""
    builder = TraceBuilder()
    builder.step(1, 0, 1000)
    ids = {"aten::as_strided": builder.host("aten::as_strided", 20, 5),
           "aten::dropout": builder.host("aten::dropout", 150, 100, tid=HOST + 1)}  # fmt: skip
    builder.host("aten::linear", 100, 300)
    addmm = builder.host("aten::addmm", 150, 200)
    builder.launch(200, 10, work_ts=400, work_dur=200, external=addmm)
    relu = builder.host("aten::relu", 450, 60)
    builder.launch(460, 10, work_ts=610, work_dur=50, external=relu, kernel="relu_kernel")
    if named is not None:
        call = next(event for event in builder.events if event["args"].get("external id") == addmm)
        call["args"]["external id"] = call["args"]["correlation"]
        op = next(event for event in builder.events if event["args"].get("External id") == ids[named])
        op["args"]["External id"] = call["args"]["correlation"]
    return load(builder.write(tmp_path / "addmm.json"))


@pytest.mark.parametrize("named", [None, "aten::as_strided", "aten::dropout"])
def test_device_time_goes_to_the_op_around_the_launch_not_to_the_op_its_id_names(tmp_path, named):
    """An External id whose op does not lie around the launch call on its thread is not believed: the kernel
    counts for the innermost op around the call (its look-alike: the same trace with right ids, same table)."""
    trace = _sgemm_under_addmm(tmp_path, named)
    names = [trace.names[i] for i in trace.name]
    sgemm = names.index("volta_sgemm_128x64_nn")
    assert names[trace.op_of_event[sgemm]] == "aten::addmm"
    assert names[trace.op_of_event[trace.launcher[sgemm]]] == "aten::addmm"
    device_ms = {row.name: row.device_ms for row in op_table(trace).ranks[0].rows}
    assert device_ms["aten::addmm"] == pytest.approx(0.2)
    assert device_ms["aten::relu"] == pytest.approx(0.05)
    assert device_ms["aten::as_strided"] == device_ms["aten::dropout"] == device_ms["aten::linear"] == 0


def test_innermost_enclosing_steps_over_calls_inside_calls_and_keeps_instants():
    """A driver call inside its runtime call finds the op around both; a zero-length call finds the op it lies in;
    a call outside every op finds none."""
    ts = np.array([0.0, 10.0, 12.0, 20.0, 50.0])
    dur = np.array([30.0, 8.0, 2.0, 0.0, 5.0])  # op, runtime call, driver call in it, instant call, call outside
    zeros = np.zeros(5, dtype=np.int64)
    found = innermost_enclosing(zeros, zeros, zeros, ts, dur, np.array([0]), np.array([1, 2, 3, 4]))
    np.testing.assert_array_equal(found, [0, 0, 0, -1])


@pytest.mark.slow
def test_self_time_matches_a_plain_stack_walk():
    trace = _load(_NW0)
    events = np.flatnonzero(np.isin(trace.kind, [Kind.CPU_OP, Kind.USER_ANNOTATION, Kind.DATALOADER, Kind.STEP]))
    expected = _stack_walk_self_times(trace, events)
    np.testing.assert_allclose(self_times(trace, events), expected, atol=1e-6)


def _stack_walk_self_times(trace, events: np.ndarray) -> np.ndarray:
    """Reference: the textbook per-thread stack walk (a Python loop; fine on one small trace)."""
    result = trace.dur[events].astype(float).copy()
    by_thread: dict[tuple, list[int]] = {}
    for position, index in enumerate(events):
        by_thread.setdefault((trace.rank[index], trace.pid[index], trace.tid[index]), []).append(position)
    for positions in by_thread.values():
        positions.sort(key=lambda p: (trace.ts[events[p]], -trace.dur[events[p]]))
        stack: list[int] = []
        for position in positions:
            index = events[position]
            if trace.dur[index] <= 0:
                result[position] = 0.0
                continue
            while stack and trace.ts[events[stack[-1]]] + trace.dur[events[stack[-1]]] <= trace.ts[index]:
                stack.pop()
            if stack:
                result[stack[-1]] -= trace.dur[index]
            stack.append(position)
    return np.maximum(result, 0.0)


@pytest.mark.slow
def test_kernel_table_types_and_shares():
    trace = _load(_NW0)
    table = kernel_table(trace).ranks[0]
    assert sum(row.share_pct for row in table.rows) == pytest.approx(100.0)
    totals = [row.total_ms for row in table.rows]
    assert totals == sorted(totals, reverse=True)
    types = {row.type for row in table.rows}
    assert types == {"COMP", "MEMORY"}
    memory = [row for row in table.rows if row.type == "MEMORY"]
    assert all(row.name.lower().startswith(("memcpy", "memset")) for row in memory)
    assert sum(row.calls for row in table.rows) == int(np.isin(trace.kind, [Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET]).sum())
    top = table.rows[0]
    assert top.mean_us == pytest.approx(top.total_ms * 1000 / top.calls)
    assert table.ms_by_type["COMP"] + table.ms_by_type["MEMORY"] == pytest.approx(table.device_ms)


def test_collective_kernels_are_comm():
    table = kernel_table(_load("hta/trace_filter/sampled_rank-0.json.gz")).ranks[0]
    comm = [row for row in table.rows if row.type == "COMM"]
    assert comm and all("nccl" in row.name.lower() for row in comm)
    assert table.ms_by_type["COMM"] > 0


def test_cpu_only_trace_has_no_kernel_table():
    trace = _load("hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")
    assert kernel_table(trace).ranks == ()


def test_parents_follow_their_definition_on_ties_and_overlaps():
    """Random ranges on a few threads, with equal starts, equal ends and ranges that overlap without nesting:
    ``_parents`` (sorts that exploit time order) against the definition it implements, computed pair by pair."""
    rng = np.random.default_rng(7)
    for _ in range(200):
        count = int(rng.integers(1, 60))
        trace = SimpleNamespace(
            ts=rng.integers(0, 30, count) + 0.5 * (rng.random(count) < 0.3),
            dur=rng.integers(1, 12, count) + 0.25 * (rng.random(count) < 0.2),
            rank=rng.integers(0, 2, count).astype(np.int32),
            pid=rng.integers(0, 2, count).astype(np.int64),
            tid=rng.integers(0, 3, count).astype(np.int64),
        )
        events = rng.permutation(count)[: int(rng.integers(1, count + 1))]
        np.testing.assert_array_equal(_parents(trace, events), _parents_by_definition(trace, events))


def _parents_by_definition(trace, events: np.ndarray) -> np.ndarray:
    """Per thread, in (start, longer first, position) order: an event's depth is the events before it less those
    ended by its start; its parent is the nearest earlier one a level up, if still open at its start."""
    key = [(trace.rank[e], trace.pid[e], trace.tid[e], trace.ts[e], -(trace.ts[e] + trace.dur[e]), p)
           for p, e in enumerate(events)]  # fmt: skip
    order = sorted(range(len(events)), key=lambda p: key[p])
    start = {p: trace.ts[events[p]] for p in order}
    end = {p: trace.ts[events[p]] + trace.dur[events[p]] for p in order}
    depth, parent = {}, np.full(len(events), -1)
    for at, p in enumerate(order):
        same = [q for q in order if key[q][:3] == key[p][:3]]
        before = [q for q in order[:at] if key[q][:3] == key[p][:3]]
        depth[p] = len(before) - sum(1 for q in same if end[q] <= start[p])
        up = [q for q in before if depth[q] == depth[p] - 1]
        if depth[p] > 0 and up and end[up[-1]] > start[p]:
            parent[p] = up[-1]
    return parent
