"""One large uncompressed trace decoded by several processes gives exactly the serial load's Trace."""

from __future__ import annotations

import dataclasses
import os
import re
import signal
from pathlib import Path

import numpy as np
import pytest

from skalpel.trace import fastsplit, loader, parallel, source
from skalpel.trace.model import Trace

from .conftest import uncompressed_copy


def assert_same_trace(serial: Trace, split: Trace) -> None:
    """Every column (values and dtype), the name table, the ranks, the kept args and the warnings."""
    assert split.names == serial.names
    for field in dataclasses.fields(Trace):
        if field.name.startswith("_"):
            continue
        mine, theirs = getattr(split, field.name), getattr(serial, field.name)
        if isinstance(theirs, np.ndarray):
            _assert_same_column(mine, theirs, field.name)
        elif field.name == "memory":
            for column in dataclasses.fields(theirs):
                _assert_same_column(getattr(mine, column.name), getattr(theirs, column.name), f"memory.{column.name}")
        elif field.name == "extra":
            assert list(mine.items()) == list(theirs.items())  # in the same order too
        else:
            assert repr(mine) == repr(theirs), field.name


def _assert_same_column(mine: np.ndarray, theirs: np.ndarray, name: str) -> None:
    assert mine.dtype == theirs.dtype, name
    assert np.array_equal(mine, theirs, equal_nan=theirs.dtype.kind == "f"), name


@pytest.fixture
def handovers(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records how each parallel decode ended: 'all' (every batch), 'none' (not worth it) or 'part'."""
    seen: list[str] = []
    real = loader.decode_in_parallel

    def recording(data, layout, *args):
        at = real(data, layout, *args)
        seen.append("all" if at == layout.stop else "none" if at == layout.start else "part")
        return at

    monkeypatch.setattr(loader, "decode_in_parallel", recording)
    return seen


@pytest.fixture
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches of 64 KiB, every file mapped and split: small corpus traces then cross many process boundaries."""
    monkeypatch.setattr(fastsplit.next_cut, "__defaults__", (64 << 10,))  # the serial loader's batches too
    monkeypatch.setattr(source, "MAP_FROM_BYTES", 1)
    monkeypatch.setattr(parallel, "PARALLEL_FROM_BYTES", 0)


def test_df_index_resolver_loads_the_same_in_two_processes(
    tmp_path: Path, handovers: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = uncompressed_copy(tmp_path, "hta/df_index_resolver/df_index_resolver.json.gz")  # 51 MiB, 1 MiB batches
    assert plain.stat().st_size > parallel.PARALLEL_FROM_BYTES
    serial = loader.load(plain, workers=1)
    assert handovers == ["none"]
    split = loader.load(plain, workers=2, while_decoding=lambda: None)  # this process's share is then the smaller
    assert handovers == ["none", "all"]
    assert_same_trace(serial, split)
    assert len(split) == 123378 and len(split.memory) > 0 and split.extra


def test_while_decoding_runs_once_while_the_children_work(
    tmp_path: Path, handovers: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Called after forking and before this process decodes its own, smaller, share; else after a serial load."""
    plain = uncompressed_copy(tmp_path, "hta/df_index_resolver/df_index_resolver.json.gz")
    seen: list[str] = []
    fork, decode_group = parallel._fork, parallel._decode_group
    monkeypatch.setattr(parallel, "_fork", lambda *args: seen.append("fork") or fork(*args))
    monkeypatch.setattr(parallel, "_decode_group", lambda *args: seen.append("decode") or decode_group(*args))
    loader.load(plain, workers=2, while_decoding=lambda: seen.append("meanwhile"))
    assert seen == ["fork", "meanwhile", "decode"]  # the child's own decode_group runs in the child
    seen.clear()
    loader.load(plain, workers=1, while_decoding=lambda: seen.append("meanwhile"))
    assert seen == ["meanwhile"] and handovers == ["all", "none"]


def test_this_process_takes_a_smaller_share_when_it_has_work_meanwhile() -> None:
    batches = [parallel.Batch(start, start + 10, start + 10) for start in range(0, 100, 10)]
    assert [len(group) for group in parallel._groups(batches, 2)] == [5, 5]
    assert [len(group) for group in parallel._groups(batches, 2, lighter=30)] == [4, 6]
    assert [len(group) for group in parallel._groups(batches, 3, lighter=20)] == [2, 4, 4]
    assert [len(group) for group in parallel._groups(batches, 2, lighter=1000)] == [1, 9]  # never empty


def test_busy_cores_do_not_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process on a busy core only adds the cost of joining: /proc/loadavg's running tasks (this one too) count."""
    from skalpel import cores

    monkeypatch.setattr(cores, "usable_cores", lambda: 4)
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    loadavg = tmp_path / "loadavg"
    for running, idle in ((1, 4), (2, 3), (4, 1), (9, 1)):
        loadavg.write_text(f"0.50 0.40 0.30 {running}/300 12345\n")
        assert cores.idle_cores(loadavg) == idle
    loadavg.write_text("garbage")
    assert cores.idle_cores(loadavg) == 4
    monkeypatch.setattr(os, "cpu_count", lambda: 64)  # a container's share of a bigger machine: the count says nothing
    loadavg.write_text("0.50 0.40 0.30 40/300 12345\n")
    assert cores.idle_cores(loadavg) == 4


@pytest.mark.parametrize(
    "name",
    [
        "extra/AMD-AGI__TraceLens/tests/traces/b200/eager_trace.json.gz",  # string tids: labels remapped on joining
        "hta/nccl_parser_config/nccl_data.json.gz",  # collectives: their args kept in extra, by event index
        "hta/trace_filter/sampled_rank-0.json.gz",
        "kineto/tb_plugin/samples/resnet50_num_workers_0/worker0.1623143566756.pt.trace.json.gz",  # memory events
        "hta/mtia_inference_trace/mtia_inference_rank_0.json.gz",
    ],
)
def test_corpus_traces_load_the_same_split_in_small_batches(
    name: str, tmp_path: Path, small_batches: None, handovers: list[str]
) -> None:
    plain = uncompressed_copy(tmp_path, name)
    serial = loader.load(plain, workers=1)
    split = loader.load(plain, workers=3)
    assert handovers[-1] in ("all", "part")  # part: a header after the events, as serially, sends the end to jsonscan
    assert_same_trace(serial, split)


def test_header_after_the_events_hands_over_to_the_exact_scanner(
    tmp_path: Path, small_batches: None, handovers: list[str]
) -> None:
    """TraceLens traces put header keys (deviceProperties) after traceEvents: the last batch fails, as serially."""
    plain = uncompressed_copy(tmp_path, "extra/AMD-AGI__TraceLens/tests/traces/h100/gaunernst_bert-small-uncased__1016001.json.gz")
    serial = loader.load(plain, workers=1)
    split = loader.load(plain, workers=3)
    assert handovers[-1] == "part"
    assert_same_trace(serial, split)
    assert split.ranks[0].device_names  # read from the header after the events


def test_a_cut_inside_a_name_hands_over_to_the_serial_loader(
    tmp_path: Path, small_batches: None, handovers: list[str]
) -> None:
    """Names starting with '},{' put some guessed cuts inside a string: that batch and the rest go the serial way."""
    plain = uncompressed_copy(tmp_path, "hta/trace_filter/sampled_rank-0.json.gz")
    text = re.sub(rb'"name": "', b'"name": "},{', plain.read_bytes())
    plain.write_bytes(text)
    serial = loader.load(plain, workers=1)
    split = loader.load(plain, workers=3)
    assert handovers[-1] == "part"
    assert_same_trace(serial, split)
    assert any(name.startswith("},{aten::") for name in split.names)


def test_a_child_that_dies_leaves_its_range_to_the_serial_loader(
    tmp_path: Path, small_batches: None, handovers: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the children build a _RangeBuilder: each one killed at its start, as the OOM killer would."""
    plain = uncompressed_copy(tmp_path, "hta/trace_filter/sampled_rank-0.json.gz")
    serial = loader.load(plain, workers=1)

    def killed(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    monkeypatch.setattr(parallel._RangeBuilder, "__init__", killed)
    split = loader.load(plain, workers=3)
    assert handovers[-1] == "part"  # this process's own range, then serially from the first dead child's
    assert_same_trace(serial, split)


def test_a_cut_off_file_loads_serially(tmp_path: Path, handovers: list[str]) -> None:
    """A cut-off document has no closing bracket to guess from: the exact scanner reads it, in this process."""
    plain = uncompressed_copy(tmp_path, "hta/df_index_resolver/df_index_resolver.json.gz", keep=0.7)
    serial = loader.load(plain, workers=1)
    split = loader.load(plain, workers=2)
    assert handovers == []  # not even tried
    assert_same_trace(serial, split)
    assert any("cut off" in warning for warning in split.warnings)


def test_small_files_and_one_process_stay_serial(tmp_path: Path, handovers: list[str]) -> None:
    plain = uncompressed_copy(tmp_path, "hta/trace_filter/sampled_rank-0.json.gz")
    loader.load(plain, workers=4)
    assert handovers in ([], ["none"])  # read whole (below MAP_FROM_BYTES), or mapped but below the threshold


def test_process_count_follows_workers_then_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(parallel.PROCESSES_ENV, "1")
    assert parallel.process_count() == 1
    assert parallel.process_count(3) == 3  # --workers wins
    monkeypatch.setenv(parallel.PROCESSES_ENV, "")
    from skalpel import cores

    monkeypatch.setattr(cores, "usable_cores", lambda: 2)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(cores.idle_cores, "__defaults__", (Path("/nonexistent"),))  # unreadable: every core counts
    assert parallel.process_count() == 2


def _events_file(path: Path, count: int, tail: list[bytes]) -> Path:
    """An uncompressed trace of ``count`` small CPU ops, then the ``tail`` events (raw JSON): the tail lands in the
    last child's range once the file is split in 64 KiB batches between 3 processes."""
    events = [
        b'{"ph": "X", "cat": "cpu_op", "name": "aten::op_%d", "pid": 1, "tid": 2, "ts": %d, "dur": 3, "args": {}}'
        % (i % 50, 10 * i)
        for i in range(count)
    ]
    path.write_bytes(b'{"schemaVersion": 1, "traceEvents": [\n' + b",\n".join(events + tail) + b"\n]}\n")
    return path


def test_bytes_that_are_not_utf8_in_a_childs_range_are_repaired_and_said(
    tmp_path: Path, small_batches: None, handovers: list[str]
) -> None:
    """The child's repairs count as the serial load's do: the warning is there (and the names the same)."""
    tail = [b'{"ph": "X", "cat": "cpu_op", "name": "aten::bad_\xff\xfe_%d", "pid": 1, "tid": 2, "ts": %d, "dur": 3}'
            % (i, 10**6 + i) for i in range(3)]  # fmt: skip
    plain = _events_file(tmp_path / "trace.json", 6000, tail)
    serial = loader.load(plain, workers=1)
    split = loader.load(plain, workers=3)
    assert handovers[-1] == "all"  # every batch decoded in parallel, the repaired ones in the last child
    assert any("not UTF-8" in warning for warning in serial.warnings)
    assert_same_trace(serial, split)
    assert any(name.startswith("aten::bad_\ufffd") for name in split.names)


def test_a_child_with_labels_and_negative_pids_hands_its_range_to_the_serial_loader(
    tmp_path: Path, small_batches: None, handovers: list[str]
) -> None:
    """A label tid ("Spans": -1 - its name id) and a negative integer pid in one child's columns cannot be told
    apart on joining: that range goes the serial way, and the trace is the serial load's."""
    tail = [b'{"ph": "X", "cat": "kernel", "name": "gemm_%d", "pid": %d, "tid": "%s", "ts": %d, "dur": 3}'
            % (i, -3 - i % 4, b"Spans" if i % 2 else b"7", 10**6 + i) for i in range(40)]  # fmt: skip
    plain = _events_file(tmp_path / "trace.json", 6000, tail)
    serial = loader.load(plain, workers=1)
    split = loader.load(plain, workers=3)
    assert handovers[-1] == "part"  # the last child's range, decoded again serially
    assert_same_trace(serial, split)
    assert set(serial.pid[-40:].tolist()) == {-3, -4, -5, -6}
