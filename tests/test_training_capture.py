"""The policy the framework callbacks share (``integrations/training.py``), driven by a real loop under the real
profiler: an evaluation before the recorded window restarts the session after it; inside the window it ends the
recording with the steps so far whole; an evaluation's ops are never in the trace."""

from __future__ import annotations

import gzip
import json

import pytest
import torch

from skalpel.integrations.training import TrainingCapture

pytestmark = pytest.mark.slow


def _train(capture: TrainingCapture, steps: int, *, evaluate_after: set[int]) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    capture.begin()
    for step in range(1, steps + 1):
        with torch.profiler.record_function("training"):
            model(torch.randn(16, 64)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
        capture.optimizer_step()
        if step in evaluate_after:
            capture.evaluation_begins()
            with torch.no_grad(), torch.profiler.record_function("evaluation"):
                model(torch.randn(16, 64))
            capture.evaluation_ends()
    capture.finish()


def _names(folder) -> list[str]:
    with gzip.open(folder / "trace-rank0.json.gz", "rt") as handle:
        return [event["name"] for event in json.load(handle)["traceEvents"] if event.get("ph") == "X"]


def test_evaluation_in_the_warmup_restarts_the_session(tmp_path, capsys) -> None:
    capture = TrainingCapture("test steps", out=tmp_path / "run")
    _train(capture, 20, evaluate_after={2})  # after step 2: the session is warming up
    assert capture.restarts == 1
    assert capture.report is not None and capture.report.steps.count == 5  # the fresh session's whole window
    names = _names(tmp_path / "run")
    assert names.count("training") == 5 and "evaluation" not in names
    assert "skalpel: 5 optimizer steps profiled" in capsys.readouterr().err


def test_evaluation_in_the_window_ends_the_recording(tmp_path) -> None:
    capture = TrainingCapture("test steps", out=tmp_path / "run")
    _train(capture, 20, evaluate_after={6})  # steps 4 to 8 recorded (1 wait, 2 warm-up): 4, 5 and 6 done
    assert capture.restarts == 0 and capture.report is not None
    assert capture.report.steps.count == 3
    assert any("an evaluation began" in warning for warning in capture.report.warnings)
    names = _names(tmp_path / "run")
    assert names.count("training") == 3 and "evaluation" not in names


def test_training_that_ends_before_the_window_says_so(tmp_path, capsys) -> None:
    capture = TrainingCapture("test steps", out=tmp_path / "run")
    _train(capture, 2, evaluate_after=set())
    assert capture.report is None and "no step was recorded" in (capture.error or "")
    assert capsys.readouterr().err.startswith("skalpel: no report: no step was recorded")
