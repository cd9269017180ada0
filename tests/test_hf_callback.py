"""The Hugging Face TrainerCallback: a real ``Trainer.train`` of a tiny GPT-2 built from a config (no download), with
gradient accumulation 4 and evaluations, writes the run folder ``skalpel run`` would: a step is an optimizer step,
evaluation is never in the recording."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import importorskip
from .integration_runs import code_findings, per_step, report, run_script, trace_events

pytestmark = pytest.mark.slow
SCRIPT = "hf_train.py"


@pytest.fixture(scope="module")
def callback_run(tmp_path_factory) -> tuple[Path, str]:
    importorskip("transformers")
    folder = tmp_path_factory.mktemp("hf") / "run"
    return folder, run_script(SCRIPT, "--skalpel", str(folder))  # evaluation every 10 steps: after the window


def test_train_findings_match_skalpel_run(callback_run, tmp_path) -> None:
    folder, said = callback_run
    run_script(SCRIPT, skalpel_run=tmp_path / "run")
    line = [text for text in said.splitlines() if text.startswith("skalpel: ")]
    assert line and "dataloader_bound" in line[-1] and str(folder / "report.html") in line[-1]
    for name in ("trace-rank0.json.gz", "report.json", "report.html", "summary.txt", "flamegraph.svg"):
        assert (folder / name).is_file(), name
    got = report(folder)
    assert got["steps"]["count"] == 5 and got["capture"]["step_signal"] == "optimizer steps (Trainer callback)"
    assert "dataloader_bound" in code_findings(folder)
    assert code_findings(folder) == code_findings(tmp_path / "run")


def test_a_step_is_an_optimizer_step(callback_run) -> None:
    events = trace_events(callback_run[0])
    forwards = per_step(events, lambda name: name == "train_forward")
    optimizer = per_step(events, lambda name: name.startswith("Optimizer.step#"))
    assert optimizer == [1] * 5 and forwards == [4] * 5, (optimizer, forwards)  # gradient_accumulation_steps=4
    assert not [event for event in events if event["name"] == "eval_forward"]


def test_evaluation_ends_the_recording_and_stays_out_of_it(tmp_path) -> None:
    importorskip("transformers")
    # evaluation after optimizer step 5: the window (steps 3 to 7) is under way; the steps 3 and 4 are kept whole
    said = run_script(SCRIPT, "--skalpel", str(tmp_path / "run"), "--eval-every", "5", "--steps", "12")
    events = trace_events(tmp_path / "run")
    assert not [event for event in events if event["name"] == "eval_forward"]
    assert per_step(events, lambda name: name == "train_forward") == [4, 4]
    got = report(tmp_path / "run")
    assert got["steps"]["count"] == 2
    assert any("an evaluation began" in warning for warning in got["warnings"]), got["warnings"]
    assert "2 optimizer steps profiled" in said
