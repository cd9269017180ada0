"""Re-analysing a run folder keeps the capture facts skalpel recorded there."""

from __future__ import annotations

import dataclasses
import shutil

import skalpel
from skalpel.result.report import CaptureInfo

from .conftest import corpus


def test_analyze_run_folder_keeps_capture_facts(tmp_path) -> None:
    shutil.copy(corpus("hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz"), tmp_path / "trace-rank0.json.gz")
    first = skalpel.analyze(tmp_path)
    assert first.capture is None
    capture = CaptureInfo(warmup_steps=3, active_steps=5, overhead_pct=12.5, noise_pct=4.0, repeats=2)
    (tmp_path / "report.json").write_bytes(dataclasses.replace(first, capture=capture).to_json())

    again = skalpel.analyze(tmp_path)

    assert again.capture == capture
    assert again.steps == first.steps  # report.json itself is not read as a trace


def test_damaged_report_json_is_ignored(tmp_path) -> None:
    shutil.copy(corpus("hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz"), tmp_path / "trace-rank0.json.gz")
    (tmp_path / "report.json").write_text("{not json", encoding="utf-8")
    assert skalpel.analyze(tmp_path).capture is None
