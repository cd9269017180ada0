"""A trace file cut off mid-way: its device verdicts are honest, and the user is told first.

Kineto writes a trace's host ops first, then its launch calls and device events. A file cut part-way (a killed
process, a copy cut short) therefore keeps every step's host ops but only the first of its device work: the device
then looks idle where its record was cut away. The device here is busy (4 steps of 10 ms, 9 ms of kernels each);
cut after the first step's fourth kernel, the step read 60% idle (CRITICAL gpu_idle): it must not be judged idle.
Its look-alike is cut past the device's record (in a trailing event): a device that really idles is still judged
and found idle.
"""

from __future__ import annotations

from pathlib import Path

from skalpel.api import analyze
from skalpel.report.html import render as render_html
from skalpel.report.terminal import render_text
from tests.tracebuilder import TraceBuilder

GEMM = "volta_sgemm_128x64_nn"
HOST_FIRST = ("cpu_op", "user_annotation", "python_function")  # the order Kineto writes: host ops before the rest


def _steps(*, kernel_us: float) -> TraceBuilder:
    """Four marked 10 ms steps of nine ops, each launching one kernel of ``kernel_us`` (990: busy; 100: idle)."""
    builder = TraceBuilder()
    builder.device_properties = [{"id": 0, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 80 * 2**30}]
    for number in range(4):
        start = number * 10_000.0
        builder.step(number, start, 9_999)
        for index in range(9):
            external = builder.host("aten::addmm", start + 20 + index * 60, 50)
            builder.launch(start + 30 + index * 60, 8, work_ts=start + 100 + index * 1_000, work_dur=kernel_us,
                           external=external, kernel=GEMM)  # fmt: skip
    return builder


def _write_as_kineto(builder: TraceBuilder, path: Path) -> bytes:
    """The trace with its host ops first, then launches and device events, and a trailing instant: Kineto's order."""
    builder.events.sort(key=lambda event: event.get("cat") not in HOST_FIRST)  # stable: each part keeps its order
    builder.events.append({"ph": "i", "cat": "cpu_instant_event", "name": "Record Window End", "pid": 100, "tid": 100,
                           "ts": 40_000, "s": "t", "args": {}})  # fmt: skip
    builder.write(path)
    return path.read_bytes()


def _cut(data: bytes, path: Path, at: int) -> Path:
    path.write_bytes(data[:at])
    return path


def test_a_file_cut_in_its_device_events_is_not_judged_idle_and_says_so_first(tmp_path: Path) -> None:
    data = _write_as_kineto(_steps(kernel_us=990), tmp_path / "whole.json")
    whole = analyze(tmp_path / "whole.json", workers=1)
    assert not [f for f in whole.findings if f.id == "gpu_idle"]  # the whole file: a busy device
    at = -1
    for _ in range(5):  # the first step keeps its first four kernels (and launches); the rest is cut away
        at = data.index(b'"cat": "kernel"', at + 1)
    cut = _cut(data, tmp_path / "cut.json", at)
    report = analyze(cut, workers=1)
    said = [(f.id, f.severity, f.title) for f in report.findings]
    assert not [f for f in report.findings if f.id in ("gpu_idle", "launch_bound")], said
    notes = [f.title for f in report.findings if f.id == "not_judged"]
    assert any("file ends mid-way" in note and "gpu_idle" in note and "host ops run to" in note
               for note in notes), notes  # fmt: skip
    (note,) = [w for w in report.warnings if "cut off" in w]
    assert f"it ends at {len(cut.read_bytes()) / 1e6:,.1f} MB" in note and "device idle is not judged" in note
    text = " ".join(render_text(report).split())
    assert text.index("the file is cut off mid-way") < text.index("verdict")  # told before the verdict
    page = render_html(report)
    assert page.index('<section id="cut"') < page.index('<section id="verdict"')


def test_a_file_cut_past_its_device_record_is_judged(tmp_path: Path) -> None:
    """Look-alike: cut in the trailing instant, every device event kept; the device idles 90%: gpu_idle fires."""
    data = _write_as_kineto(_steps(kernel_us=100), tmp_path / "whole.json")
    cut = _cut(data, tmp_path / "cut.json", data.index(b"Record Window End") + 5)
    report = analyze(cut, workers=1)
    assert any("cut off" in w for w in report.warnings)
    idle = [f for f in report.findings if f.id == "gpu_idle"]
    assert idle and idle[0].severity == "critical", [(f.id, f.title) for f in report.findings]
