"""The Lightning callback: a real ``Trainer.fit`` on CPU writes the run folder ``skalpel run`` would, with optimizer
steps for steps and validation left out of the recording."""

from __future__ import annotations

import csv

import pytest

from .conftest import importorskip
from .integration_runs import code_findings, per_step, report, run_script, trace_events

pytestmark = pytest.mark.slow
SCRIPT = "lightning_train.py"


@pytest.fixture(scope="module", autouse=True)
def _lightning() -> None:
    importorskip("lightning")


def test_fit_findings_match_skalpel_run(tmp_path) -> None:
    said = run_script(SCRIPT, "--skalpel", str(tmp_path / "callback"))
    run_script(SCRIPT, skalpel_run=tmp_path / "run")
    line = [text for text in said.splitlines() if text.startswith("skalpel: ")]
    assert line and "dataloader_bound (critical)" in line[-1] and str(tmp_path / "callback" / "report.html") in line[-1]
    for name in ("trace-rank0.json.gz", "report.json", "report.html", "summary.txt", "flamegraph.svg"):
        assert (tmp_path / "callback" / name).is_file(), name
    mine = report(tmp_path / "callback")
    assert mine["steps"]["count"] == 5 and mine["capture"]["step_signal"] == "optimizer steps (Lightning callback)"
    assert "dataloader_bound" in code_findings(tmp_path / "callback")
    assert code_findings(tmp_path / "callback") == code_findings(tmp_path / "run")


def test_a_step_is_an_optimizer_step(tmp_path) -> None:
    run_script(SCRIPT, "--skalpel", str(tmp_path / "run"), "--accumulate", "3", "--steps", "12", "--val-every", "0",
               "--csv", str(tmp_path / "logs"))  # fmt: skip
    events = trace_events(tmp_path / "run")
    optimizer = per_step(events, lambda name: name.startswith("Optimizer.step#SGD.step"))
    batches = per_step(events, lambda name: name.startswith("enumerate(DataLoader)"))
    got = report(tmp_path / "run")
    assert len(optimizer) == 5 and got["steps"]["count"] == 5
    assert optimizer == [1] * 5 and batches == [3] * 5, (optimizer, batches)
    # the configured logger got the step time and the findings
    logged = next((tmp_path / "logs" / "fit").glob("version_*"))
    rows = list(csv.DictReader((logged / "metrics.csv").open()))
    medians = [row["skalpel_step_median_ms"] for row in rows if row.get("skalpel_step_median_ms")]
    assert medians and float(medians[-1]) == pytest.approx(got["steps"]["median_ms"], rel=1e-3)
    hparams = (logged / "hparams.yaml").read_text()
    assert "skalpel_findings: " + ",".join(finding["id"] for finding in got["findings"]) in hparams, hparams
    assert str(tmp_path / "run" / "report.html") in hparams


def test_validation_ends_the_recording_and_stays_out_of_it(tmp_path) -> None:
    # validation after batch 5: the window (steps 3 to 7) is under way; the steps 3 and 4 are kept whole
    said = run_script(SCRIPT, "--skalpel", str(tmp_path / "run"), "--val-every", "5")
    events = trace_events(tmp_path / "run")
    assert not [event for event in events if event["name"] == "validation_step"]
    assert len(per_step(events, lambda name: True)) == 2
    got = report(tmp_path / "run")
    assert got["steps"]["count"] == 2
    assert any("an evaluation began" in warning for warning in got["warnings"]), got["warnings"]
    assert "2 optimizer steps profiled" in said


def test_ddp_ranks_share_one_run_folder(tmp_path) -> None:
    # Lightning's own DDP launcher sets no RANK: the ranks agree on rank 0's default folder over their process group
    said = run_script(SCRIPT, "--skalpel", "-", "--devices", "2", "--val-every", "0", "--steps", "14", cwd=tmp_path)
    folders = list((tmp_path / "skalpel-runs").iterdir())
    assert len(folders) == 1, folders
    folder = folders[0]
    assert (folder / "trace-rank0.json.gz").is_file() and (folder / "trace-rank1.json.gz").is_file()
    got = report(folder)
    assert [rank["rank"] for rank in got["ranks"]] == [0, 1] and got["source"]["world_size"] == 2
    lines = [text for text in said.splitlines() if text.startswith("skalpel: ")]
    progress = [text for text in lines if text.startswith("skalpel: splitting the memory peak")]
    assert len(progress) <= 1, progress  # rank 0 says it for the job
    lines = [text for text in lines if text not in progress]
    assert len(lines) == 2 and "skalpel: no report: this rank leaves the report to rank 0" in lines, lines
    assert any("5 optimizer steps on each of 2 ranks" in line and str(folder / "report.html") in line for line in lines)
