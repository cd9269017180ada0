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


def test_evaluations_too_close_for_the_window_are_said_with_a_window_that_fits(tmp_path, capsys) -> None:
    # an evaluation after every 3rd optimizer step (Lightning's val_check_interval, the Trainer's eval_steps): each
    # restarts the session before its window (1 wait, 2 warm-up, 5 recorded) can open
    capture = TrainingCapture("test steps", out=tmp_path / "run")
    _train(capture, 20, evaluate_after={3, 6, 9, 12, 15, 18})
    assert capture.report is None and capture.restarts == 6
    said = capsys.readouterr().err
    assert said.startswith("skalpel: no report: no step was recorded: an evaluation or a checkpoint save came at most "
                           "3 optimizer step(s) apart"), said  # fmt: skip
    assert "run.step()" not in said and "wait=0, warmup=1, active=1" in said, said
    # the window it names fits: one step recorded, the evaluations still out of the trace
    fits = TrainingCapture("test steps", out=tmp_path / "fits", wait=0, warmup=1, active=1)
    _train(fits, 20, evaluate_after={3, 6, 9, 12, 15, 18})
    assert fits.report is not None and fits.report.steps.count == 1
    names = _names(tmp_path / "fits")
    assert names.count("training") == 1 and "evaluation" not in names


def test_training_shorter_than_the_window_says_the_optimizer_steps_it_took(tmp_path, capsys) -> None:
    capture = TrainingCapture("test steps", out=tmp_path / "run")
    _train(capture, 1, evaluate_after=set())  # one optimizer step: the session's step 0 never ended
    assert capture.report is None
    said = capsys.readouterr().err
    assert "training took 1 optimizer step(s), fewer than skalpel's window of 8 optimizer steps" in said, said
    assert "run.step()" not in said


def test_an_evaluation_after_the_last_step_still_says_why_nothing_was_recorded(tmp_path, capsys) -> None:
    # the Trainer's eval_steps=2 with max_steps=12: an evaluation follows the last step too, and throws away the
    # session it would have run on; the line is the evaluations', not "training ended before the session started"
    capture = TrainingCapture("test steps", out=tmp_path / "run")
    _train(capture, 12, evaluate_after=set(range(2, 13, 2)))
    assert capture.report is None and capture.run is None
    said = capsys.readouterr().err
    assert "came at most 2 optimizer step(s) apart" in said and "no window fits between them" in said, said
    assert "before the session started" not in said
