"""Long captures stay usable, writes stay whole, and Kineto's chatter is filtered: on real profiler output."""

from __future__ import annotations

import gzip
import json
import os
import signal
from pathlib import Path

import pytest
import torch

from skalpel.api import analyze
from skalpel.capture import bounded, export, kineto_noise, runfolder
from skalpel.capture.settings import CaptureSettings, profiler_kwargs
from skalpel.capture.signals import Terminated, deferred
from skalpel.report import flamegraph
from skalpel.report.evidence import evidence_text
from skalpel.result.report import OpRow
from skalpel.trace.loader import load

STEPS = 14


@pytest.fixture(scope="module")
def plain_trace(tmp_path_factory) -> Path:
    """A real trace of 14 recorded steps with Python stacks, as the profiler writes it (plain JSON)."""
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path_factory.mktemp("bounds") / "trace.json"
    schedule = torch.profiler.schedule(wait=0, warmup=1, active=STEPS, repeat=1)
    ready = lambda prof: prof.export_chrome_trace(str(path))  # noqa: E731
    with torch.profiler.profile(schedule=schedule, on_trace_ready=ready, **profiler_kwargs(CaptureSettings())) as prof:
        for _ in range(STEPS + 2):
            optimizer.zero_grad()
            model(torch.randn(8, 16)).sum().backward()
            optimizer.step()
            prof.step()
    return path


def _events(path: Path) -> list[dict]:
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)["traceEvents"]


def _steps(events: list[dict]) -> list[dict]:
    return sorted((e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: e["ts"])


def test_a_trace_within_the_budget_is_left_whole(plain_trace: Path) -> None:
    assert bounded.stack_cut(str(plain_trace), plain_trace.stat().st_size) is None


def test_a_long_trace_keeps_stacks_for_its_first_steps_and_every_op(plain_trace: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(bounded.ENV_BUDGET, "0.01")
    cut = bounded.stack_cut(str(plain_trace), plain_trace.stat().st_size)
    assert cut is not None and cut[1] == STEPS
    out = tmp_path / "bounded.json"
    with open(plain_trace, "rb") as source, open(out, "wb") as target:
        written = bounded.copy_bounded(source, target, cut[0])
    assert written == out.stat().st_size < plain_trace.stat().st_size
    before, after = _events(plain_trace), _events(out)  # still valid JSON
    steps = _steps(after)
    assert len(steps) == STEPS and cut[0] == pytest.approx(steps[bounded.STACK_STEPS - 1]["ts"] + steps[bounded.STACK_STEPS - 1]["dur"])
    ops = [e for e in before if e.get("cat") == "cpu_op"]
    assert len([e for e in after if e.get("cat") == "cpu_op"]) == len(ops)  # every op, every step
    python_before = [e for e in before if e.get("cat") == "python_function"]
    python_after = [e for e in after if e.get("cat") == "python_function"]
    assert python_after == [e for e in python_before if e["ts"] < cut[0]]
    assert any(e["ts"] >= cut[0] for e in python_before) and not any(e["ts"] >= cut[0] for e in python_after)
    late_ops = [e for e in after if e.get("cat") == "cpu_op" and e["ts"] >= cut[0]]
    assert late_ops and not any("Call stack" in e.get("args", {}) for e in late_ops)
    report = analyze(str(out))  # skalpel reads it, all steps
    assert report.steps.count == STEPS


class _Exported:
    """Stands in for the profiler object: its export writes the real plain trace (what Kineto would)."""

    def __init__(self, source: Path) -> None:
        self.source = source

    def export_chrome_trace(self, path: str) -> None:
        Path(path).write_bytes(self.source.read_bytes())


def test_export_writes_a_whole_gzip_and_no_partial_file(plain_trace: Path, tmp_path: Path) -> None:
    path = tmp_path / runfolder.trace_file_name(0)
    assert export.export_trace(_Exported(plain_trace), path) is None
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    assert len(_steps(_events(path))) == STEPS
    assert load(path).warnings == []


def test_export_of_a_cut_file_says_so_and_leaves_nothing_named_partial(plain_trace: Path, tmp_path: Path) -> None:
    class Cut(_Exported):
        def export_chrome_trace(self, path: str) -> None:
            Path(path).write_bytes(self.source.read_bytes()[: self.source.stat().st_size // 2])  # a failed C++ write

    with pytest.raises(export.ExportError) as raised:
        export.export_trace(Cut(plain_trace), tmp_path / runfolder.trace_file_name(0))
    kept = tmp_path / "trace-rank0.truncated.json"
    assert raised.value.kept == kept and f"kept as {kept}" in str(raised.value)
    assert [p.name for p in tmp_path.iterdir()] == [kept.name]  # what was written, named as cut short
    assert load(kept).warnings  # the loader reads it, and says it is cut


def test_a_signal_during_a_deferred_write_waits_for_the_file() -> None:
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    written = []  # each "write" after a signal: a signal not held would raise before it
    with deferred() as held:
        os.kill(os.getpid(), signal.SIGTERM)
        written.append("after SIGTERM")
        os.kill(os.getpid(), signal.SIGINT)  # a second press: held too
        written.append("after SIGINT")
    assert written == ["after SIGTERM", "after SIGINT"] and held.signum == signal.SIGTERM  # the first is kept
    assert {signum: signal.getsignal(signum) for signum in before} == before  # the handlers are put back
    with pytest.raises(Terminated):
        held.reraise()


def test_speedscope_is_capped_with_balanced_events(plain_trace: Path, monkeypatch) -> None:
    monkeypatch.setattr(flamegraph, "SPEEDSCOPE_EVENTS", 400)
    document = json.loads(flamegraph.render_speedscope(load(plain_trace)))
    assert "capped" in document["name"]
    for profile in document["profiles"]:
        kinds = [event["type"] for event in profile["events"]]
        assert kinds.count("O") == kinds.count("C") and len(kinds) <= 400 + 64


def test_kineto_noise_lines_are_dropped_and_everything_else_passes_at_once() -> None:
    now, held = kineto_noise.filter_chunk(b"", b"USDT:2026-12-03 1:1 SyncActivityProfilerHandler.cpp:52] profiler_start\nloss 0.5\n")
    assert (now, held) == (b"loss 0.5\n", b"")
    now, held = kineto_noise.filter_chunk(b"", b"ERROR:2026 CudaDeviceProperties.cpp:26] gpuGetDeviceCount failed with code 35\n 40%|####\r")
    assert now == b" 40%|####\r" and held == b""  # a progress bar's partial line is not held back
    now, held = kineto_noise.filter_chunk(b"", b"ERROR:2026 output_json.cpp:977] Failed to write to log file!\nUSD")
    assert now.startswith(b"ERROR:") and held == b"USD"  # a real Kineto error is kept


def test_a_partial_step_is_left_out_of_the_written_trace(plain_trace: Path, tmp_path: Path) -> None:
    """The memory budget stopped the recording inside the last step: nothing from its start on is written."""
    path = tmp_path / runfolder.trace_file_name(0)
    partial: list[bounded.PartialStep] = []
    assert export.export_trace(_Exported(plain_trace), path, partial=partial) is None
    before, after = _events(plain_trace), _events(path)  # still valid JSON
    (step,) = partial
    last = _steps(before)[-1]
    assert step.start == pytest.approx(last["ts"]) and step.steps == STEPS
    assert step.ops == len([e for e in before if e.get("cat") == "cpu_op"])
    assert [e["name"] for e in _steps(after)] == [e["name"] for e in _steps(before)[:-1]]
    assert not [e for e in after if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "python_function")
                and e["ts"] >= last["ts"]]  # fmt: skip
    ops_before = [e for e in before if e.get("cat") == "cpu_op" and e["ts"] < last["ts"]]
    assert len([e for e in after if e.get("cat") == "cpu_op"]) == len(ops_before)  # the whole steps' ops all stay
    report = analyze(str(path))
    assert report.steps.count == STEPS - 1


def test_the_profilers_c10_warnings_are_dropped_in_a_rank_too_and_its_errors_kept() -> None:
    allocator = (b"[W1203 20:21:14.249660984 CPUAllocator.cpp:245] Memory block of unknown size was allocated before "
                 b"the profiling started, profiler results will not include the deallocation event")  # fmt: skip
    collection = b"[W1203 20:21:15.001 collection.cpp:1041] Warning: python frame /usr/lib/python3.11/_weakrefset.py(39)"
    for line in (allocator, b"[rank1]:" + allocator, collection, b"[rank0]:" + collection):
        assert kineto_noise.is_noise(line + b"\n"), line
    kept = (
        b"[E1203 20:21:15.001 collection.cpp:1041] an error of the profiler",  # an error, not a warning
        b"[W1203 20:21:15.001 ProcessGroupGloo.cpp:514] Warning: Unable to resolve hostname",  # not the profiler's
        b"[rank0]: Traceback (most recent call last):",  # a rank's traceback
        b"RuntimeError: CPUAllocator.cpp:245 Memory block of unknown size",
        b"loss 0.5 collection.cpp:1",
    )
    for line in kept:
        assert not kineto_noise.is_noise(line), line
    chunk = b"[rank0]:" + collection + b"\n[rank0]: Traceback (most recent call last):\n[rank1]:[W1203"
    now, held = kineto_noise.filter_chunk(b"", chunk)
    assert now == b"[rank0]: Traceback (most recent call last):\n" and held == b"[rank1]:[W1203"  # may be noise: held
    now, held = kineto_noise.filter_chunk(held, b" 20:21:14.2 CPUAllocator.cpp:245] Memory block of unknown size was "
                                          b"allocated before the profiling started\n")  # fmt: skip
    assert (now, held) == (b"", b"")


def test_evidence_prints_words_and_numbers_not_python_dicts() -> None:
    text = evidence_text({"median_step_ms": 0.379, "breakdown_pct": {"cpu_exec": 48.29, "other": 51.71},
                          "fused_attention_seen": False, "ranks": [0, 1]})  # fmt: skip
    assert text == "median step 0.379 ms, breakdown (cpu exec 48.3%, other 51.7%), fused attention seen no, ranks (0, 1)"
    assert not any(mark in text for mark in "{}[]'=")


def test_op_rows_say_when_they_aggregate_several_shapes(plain_trace: Path) -> None:
    report = analyze(str(plain_trace))
    rows = {row.name: row for row in report.ranks[0].top_ops}
    assert all(row.shape_variants >= 1 for row in rows.values() if row.input_shapes)
    assert any(row.shape_variants > 1 for row in rows.values())  # aten::t takes [16,32] and [32,4] weights, ...
    assert OpRow("aten::t", 3, 1.0, 1.0, 0.0, "[[32,16]]", 3).other_shapes == " (+2 other shapes)"
    assert OpRow("aten::t", 3, 1.0, 1.0, 0.0, "[[32,16]]", 1).other_shapes == ""
