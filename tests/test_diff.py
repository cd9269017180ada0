"""skalpel diff: step time against the noise, category and op deltas, findings, the CI gate, bad input."""

from __future__ import annotations

import dataclasses
import json
import re
from importlib import resources
from pathlib import Path

import jsonschema
import pytest

from skalpel.api import load_report
from skalpel.cli import main
from skalpel.report import diff_render
from skalpel.result.diff import DiffOptions, diff_reports
from skalpel.result.report import CaptureInfo, Finding, OpRow, RankReport, Report, Source, StepStats
from tests.conftest import corpus
from tests.report_fixtures import DomSummary, chromium, console_messages, needs_browser

NW0 = "kineto/tb_plugin/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
NW4 = "kineto/tb_plugin/samples/resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz"
OTHER_MODEL = "hta/with_gpu_user_annotation/step_based_trace_2543932.json.gz"
DIFF_SCHEMA = json.loads(resources.files("skalpel.result").joinpath("diff.schema.json").read_text())


def run(steps: list[float], *, device: str = "cpu", noise: float | None = None, ops: dict[str, float] | None = None,
        breakdown: dict[str, float] | None = None, findings: tuple[Finding, ...] = ()) -> Report:  # fmt: skip
    """A report of one rank with the given step times (ms) and per-op self time (ms over all steps)."""
    rows = tuple(OpRow(name, 1, ms, ms, 0.0) for name, ms in (ops or {}).items())
    rank = RankReport(0, tuple(steps), breakdown or {}, top_ops=rows)
    capture = CaptureInfo(3, len(steps), noise_pct=noise, repeats=2) if noise is not None else None
    ordered = sorted(steps)
    return Report(Source(("x",), "2.13.0", device, 1), StepStats(len(steps), ordered[len(steps) // 2], max(steps), 0.0),
                  (rank,), findings, capture)  # fmt: skip


TIGHT = [100.0, 100.5, 99.5, 100.2, 99.8, 100.1, 99.9, 100.3]


@pytest.fixture(scope="module")
def resnet(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    """report.json of both ResNet runs (analysed once) and their diff JSON."""
    folder = tmp_path_factory.mktemp("resnet")
    before, after = folder / "nw0.json", folder / "nw4.json"
    assert main(["analyze", str(corpus(NW0)), "--json", str(before)]) == 0
    assert main(["analyze", str(corpus(NW4)), "--json", str(after)]) == 0
    out = folder / "diff.json"
    assert main(["diff", str(before), str(after), "--json", str(out)]) == 0
    return before, after, json.loads(out.read_text())


@pytest.mark.slow
def test_resnet_data_loading_share_falls_and_the_finding_disappears(resnet: tuple[Path, Path, dict]) -> None:
    document = resnet[2]
    top = document["categories"][0]
    assert top["category"] == "dataloader"  # the biggest mover
    assert top["before_pct"] == pytest.approx(33.4, abs=2) and top["after_pct"] == pytest.approx(0.8, abs=1)
    assert top["delta_ms_per_step"] < -50
    assert "dataloader_bound" in {c["id"] for c in document["disappeared"]}
    assert "dataloader_bound" not in {c["id"] for c in document["appeared"] + document["persisting"]}
    assert document["step"]["verdict"] == "faster" and document["step"]["change_pct"] < -15
    assert document["mismatches"] == []
    jsonschema.validate(document, DIFF_SCHEMA, cls=jsonschema.Draft202012Validator)


@pytest.mark.slow
def test_resnet_diff_terminal_and_html(resnet: tuple[Path, Path, dict], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    before, after, _ = resnet
    page = tmp_path / "diff.html"
    assert main(["diff", str(before), str(after), "--html", str(page)]) == 0
    out = capsys.readouterr().out
    assert "faster" in out and "dataloader 33.4% -> 0.8%" in out
    assert "disappeared critical dataloader_bound" in " ".join(out.split())
    markup = page.read_text()
    assert "dataloader_bound" in markup and "<svg" in markup
    assert not re.search(r'(src|href)="(https?:)?//', markup)  # nothing fetched at view time


@pytest.mark.slow
def test_same_run_is_no_change(resnet: tuple[Path, Path, dict]) -> None:
    report = load_report(resnet[0], which="BEFORE")
    result = diff_reports(report, report)
    assert result.step.change_pct == 0 and result.step.verdict == "within_noise"
    assert result.appeared == () and result.disappeared == ()
    assert all(row.delta_ms_per_step == 0 for row in result.ops + result.kernels)


def test_a_clear_slowdown_is_slower_and_trips_the_gate() -> None:
    result = diff_reports(run(TIGHT), run([t * 1.2 for t in TIGHT]))
    assert result.step.verdict == "slower"
    assert result.step.change_pct == pytest.approx(20, abs=0.5)
    assert result.step.ci_low_pct > 15 and result.step.noise_known
    assert result.slower_than(10) and not result.slower_than(25)


def test_step_to_step_variance_makes_a_change_noise() -> None:
    noisy = [80.0, 130.0, 95.0, 120.0, 70.0, 140.0, 100.0, 110.0]
    result = diff_reports(run(noisy), run([t * 1.05 for t in noisy]))
    assert result.step.ci_low_pct < 0 < result.step.ci_high_pct
    assert result.step.verdict == "within_noise" and not result.slower_than(1)


def test_capture_noise_widens_the_band() -> None:
    slower = [t * 1.10 for t in TIGHT]
    assert diff_reports(run(TIGHT), run(slower)).step.verdict == "slower"
    result = diff_reports(run(TIGHT, noise=9.0), run(slower, noise=9.0))
    assert result.step.capture_noise_pct == pytest.approx(12.73, abs=0.01)  # sqrt(9² + 9²)
    assert result.step.verdict == "within_noise"


def test_too_few_steps_says_the_noise_is_unknown() -> None:
    result = diff_reports(run([100.0]), run([130.0]))
    assert not result.step.noise_known and result.step.ci_low_pct is None
    assert result.step.verdict == "slower"  # a 30% change is past the minimum band
    assert "noise unknown" in diff_render.headline(result.step)
    tiny = diff_reports(run([100.0]), run([100.5]), DiffOptions(min_band_pct=1.0))
    assert tiny.step.verdict == "within_noise"


def test_category_and_op_movers_are_sorted_and_per_step() -> None:
    before = run(TIGHT, ops={"aten::mm": 80.0, "aten::add": 8.0, "gone": 4.0},
                 breakdown={"kernel": 60.0, "dataloader": 30.0, "other": 10.0})  # fmt: skip
    after = run(TIGHT, ops={"aten::mm": 80.0, "aten::add": 40.0, "new": 16.0},
                breakdown={"kernel": 85.0, "dataloader": 5.0, "other": 10.0})  # fmt: skip
    result = diff_reports(before, after)
    assert [c.category for c in result.categories][:2] in (["kernel", "dataloader"], ["dataloader", "kernel"])
    assert result.categories[-1].category == "other" and result.categories[-1].delta_pct == 0
    names = [row.name for row in result.ops]
    assert names[:2] == ["aten::add", "new"]  # +4 ms/step, +2 ms/step (8 steps)
    assert result.ops[0].delta_ms_per_step == pytest.approx(4.0)
    gone = next(row for row in result.ops if row.name == "gone")
    assert gone.after_ms_per_step is None and gone.delta_ms_per_step == pytest.approx(-0.5)


def test_findings_appear_and_disappear_by_id_and_rank() -> None:
    a = Finding("gpu_idle", "warning", "idle", {}, (), "fix", rank=0)
    b = Finding("host_device_sync", "warning", "sync", {}, (), "fix", rank=0)
    result = diff_reports(run(TIGHT, findings=(a,)), run(TIGHT, findings=(b, dataclasses.replace(a, rank=1))))
    assert {(c.id, c.rank) for c in result.appeared} == {("host_device_sync", 0), ("gpu_idle", 1)}
    assert {(c.id, c.rank) for c in result.disappeared} == {("gpu_idle", 0)}


@pytest.mark.slow
def test_different_models_and_devices_are_called_out_first(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    ops_a = {f"aten::a{i}": 1.0 for i in range(10)}
    ops_b = {f"aten::b{i}": 1.0 for i in range(10)}
    result = diff_reports(run(TIGHT, device="NVIDIA A100", ops=ops_a), run(TIGHT, device="NVIDIA H100", ops=ops_b))
    assert any("different devices" in m for m in result.mismatches)
    assert any("barely overlap" in m for m in result.mismatches)
    assert main(["diff", str(corpus(NW0)), str(corpus(OTHER_MODEL))]) == 0
    out = capsys.readouterr().out
    assert out.index("may not be comparable") < out.index("median step")
    assert "different devices: Tesla V100-DGXS-32GB vs Quadro GP100" in " ".join(out.split())


def _write(path: Path, report: Report) -> Path:
    path.write_bytes(report.to_json())
    return path


def test_fail_if_slower_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    base = _write(tmp_path / "base.json", run(TIGHT))
    slow = _write(tmp_path / "slow.json", run([t * 1.2 for t in TIGHT]))
    assert main(["diff", str(base), str(slow), "--fail-if-slower", "5"]) == 1
    assert "slower by 20.0%" in capsys.readouterr().err
    assert main(["diff", str(base), str(slow), "--fail-if-slower", "30"]) == 0
    assert main(["diff", str(slow), str(base), "--fail-if-slower", "5"]) == 0  # faster passes
    capsys.readouterr()
    assert main(["diff", str(base), str(slow), "--json"]) == 0  # no gate asked: 0
    jsonschema.validate(json.loads(capsys.readouterr().out), DIFF_SCHEMA, cls=jsonschema.Draft202012Validator)


def test_run_folder_side_reads_its_report_json(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    _write(folder / "report.json", run(TIGHT, noise=2.5))
    report = load_report(folder, which="BEFORE")
    assert report.capture is not None and report.capture.noise_pct == 2.5


def test_missing_and_unreadable_sides_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    good = _write(tmp_path / "good.json", run(TIGHT))
    assert main(["diff", str(tmp_path / "nope"), str(good)]) == 2
    assert capsys.readouterr().err.strip() == f"skalpel: error: BEFORE: {tmp_path / 'nope'}: no such file or folder"
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text('{"traceEvents": [{"ph": "X", "na')
    assert main(["diff", str(good), str(corrupt)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("skalpel: error:") and "Traceback" not in err and len(err.strip().splitlines()) == 1
    wrong = tmp_path / "wrong.json"
    wrong.write_text('{"schema": "skalpel.report/1", "source": {}}')
    assert main(["diff", str(good), str(wrong)]) == 2
    assert "AFTER" in capsys.readouterr().err


@needs_browser
@pytest.mark.slow
def test_diff_page_opens_in_chromium(resnet: tuple[Path, Path, dict], tmp_path: Path) -> None:
    page = tmp_path / "diff.html"
    assert main(["diff", str(resnet[0]), str(resnet[1]), "--html", str(page)]) == 0
    dumped = chromium(page, "--dump-dom", tmp=tmp_path)
    assert dumped.returncode == 0 and console_messages(dumped.stderr) == []
    charts = [svg for svg in DomSummary(dumped.stdout).svgs if "chart" in svg["class"]]
    assert charts and all(svg["shapes"] > 0 for svg in charts)


def test_diff_html_escapes_names() -> None:
    evil = "<img src=x onerror=alert(1)>"
    page = diff_render.render_html(diff_reports(run(TIGHT, ops={evil: 5.0}), run(TIGHT, ops={evil: 9.0})))
    assert "<img" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
