"""`skalpel run` and `skalpel demo` end to end: the real profiler on small scripts written to tmp_path."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from skalpel.result.report import _FEWEST_BASELINE_STEPS, Report

pytestmark = pytest.mark.slow

# An MLP trained with SGD over a DataLoader; it never imports skalpel.
PLAIN = """
import sys
import torch

torch.set_num_threads(1)
torch.manual_seed(0)
RAISE_AT = int(sys.argv[1]) if len(sys.argv) > 1 else -1
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.utils.data.TensorDataset(torch.randn(24 * 8, 16), torch.randn(24 * 8, 1))
loader = torch.utils.data.DataLoader(data, batch_size=8)


def train_step(x, y):
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


for step, (x, y) in enumerate(loader):
    if step == RAISE_AT:
        raise RuntimeError("boom at step %d" % step)
    train_step(x, y)
print("script finished", __name__)
"""


def _skalpel(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "skalpel", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300)


def _script(tmp_path: Path, source: str = PLAIN, name: str = "train.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def test_plain_script_writes_trace_flamegraph_speedscope_summary(tmp_path: Path) -> None:
    script = _script(tmp_path)
    out = tmp_path / "run"
    result = _skalpel("run", "--out", str(out), "--warmup", "1", "--active", "3", str(script), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "script finished __main__" in result.stdout  # the script ran as __main__, to its end

    trace = json.loads(gzip.decompress((out / "trace-rank0.json.gz").read_bytes()))
    steps = sorted(event["name"] for event in trace["traceEvents"] if event.get("name", "").startswith("ProfilerStep#"))
    assert len(steps) == 3
    assert trace["skalpel_torch_version"]
    assert any(event.get("cat") == "python_function" for event in trace["traceEvents"])

    svg = ET.fromstring((out / "flamegraph.svg").read_text())
    labels = [text.text or "" for text in svg.iter("{http://www.w3.org/2000/svg}text")]
    # The tooltip has the full frame; a label is cut to its frame's width, which a loaded machine can narrow.
    tips = [title.text or "" for title in svg.iter("{http://www.w3.org/2000/svg}title")]
    assert any(re.match(r"\S*train\.py\(\d+\): train_step\n", tip) for tip in tips), tips[:20]
    assert labels.count("<module> (train.py:20)") or any(label.startswith("<module> (train.py") for label in labels)
    assert not any("runner.py" in label or "runpy" in label or "steps.py" in label for label in labels)  # skalpel's frames
    speedscope = json.loads((out / "flamegraph.speedscope.json").read_text())
    assert any(frame.get("file") == str(script) or frame["name"] == "train_step" for frame in speedscope["shared"]["frames"])
    assert speedscope["profiles"][0]["events"]

    summary = (out / "summary.txt").read_text()
    assert "3 steps: median" in summary
    assert "profiler overhead" in summary
    assert str(out / "trace-rank0.json.gz") in summary
    for name in ("trace-rank0.json.gz", "flamegraph.svg", "flamegraph.speedscope.json", "summary.txt", "report.json"):
        assert f"wrote {out / name}" in result.stdout.replace("\n", "")  # rich wraps long paths

    report = Report.from_json((out / "report.json").read_bytes())
    assert report.steps.count == 3
    assert report.capture is not None and report.capture.exit_status == 0
    assert report.capture.unprofiled_step_ms and report.capture.profiled_step_ms
    assert report.capture.overhead_pct is not None


def test_script_that_raises_keeps_trace_summary_and_exit_status(tmp_path: Path) -> None:
    script = _script(tmp_path)
    out = tmp_path / "run"
    # 1 wait + 1 warm-up + 5 active steps need 8 iterations; the script raises at its 9th, after recording.
    result = _skalpel("run", "--out", str(out), "--warmup", "1", str(script), "8", cwd=tmp_path)
    assert result.returncode == 1
    assert "RuntimeError: boom at step 8" in result.stderr
    assert f'File "{script}"' in result.stderr  # the script's own traceback is shown
    assert "runpy" not in result.stderr
    assert (out / "trace-rank0.json.gz").is_file()
    assert "steps: median" in (out / "summary.txt").read_text()
    assert Report.from_json((out / "report.json").read_bytes()).capture.exit_status == 1


def test_demo_shows_data_loading_as_the_largest_share(demo_run) -> None:
    result, folder = demo_run  # `skalpel demo` with its defaults (conftest; the browser test reads its page)
    assert result.returncode == 0, result.stderr
    report = Report.from_json((folder / "report.json").read_bytes())
    assert report.capture is not None and report.capture.repeats == 2
    assert len(report.capture.window_medians_ms) == 2 and report.capture.noise_pct is not None
    breakdown = report.ranks[0].step_breakdown_pct
    assert breakdown, "the report has no step breakdown"
    assert max(breakdown, key=breakdown.get) == "dataloader"
    # the wait points into the demo's job as into a user's script: its __getitem__, not skalpel's console script
    (loader,) = [finding for finding in report.findings if finding.id == "dataloader_bound"]
    assert loader.locations and "demo.py" in loader.locations[0] and "__getitem__" in loader.locations[0], loader
    assert not any("bin/skalpel" in where for where in loader.locations), loader.locations
    # 24 steps (two windows of 8, then more): the profiler overhead has un-profiled steady steps to compare with
    _assert_overhead_measured(report.capture)


def _assert_overhead_measured(capture) -> None:
    """The overhead's structure, not its size: a figure, its noise, and enough steady un-profiled steps."""
    assert capture.overhead_pct is not None and capture.overhead_noise_pct is not None, capture
    assert capture.baseline_steps >= _FEWEST_BASELINE_STEPS, capture
    assert "un-profiled step(s) to compare with" not in capture.overhead_words(), capture.overhead_words()


def test_demo_with_18_steps_measures_the_overhead_before_its_recording(tmp_path: Path) -> None:
    """At 18 steps its two 8-step windows leave too few un-profiled steps after them; the baseline is taken before
    the recording now (the steps after it ran in a process the profiler changed), so the overhead is measured."""
    result = _skalpel("demo", "--steps", "18", "--out", str(tmp_path / "demo"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    capture = Report.from_json((tmp_path / "demo" / "report.json").read_bytes()).capture
    assert capture.repeats == 2 and len(capture.window_medians_ms) == 2  # both windows recorded
    _assert_overhead_measured(capture)