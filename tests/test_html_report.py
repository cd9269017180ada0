"""The self-contained HTML report: content, escaping, size bounds, and a real headless Chromium."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import re
import shutil
from html import escape, unescape
from importlib import resources
from pathlib import Path

import jsonschema
import pytest

from skalpel.analysis import call_tree
from skalpel.api import analyze
from skalpel.cli import main
from skalpel.report import html, html_svg
from skalpel.result.report import Finding, RankReport, Report, Source, StepStats
from skalpel.result.sections import BlameSummary
from tests.conftest import corpus
from tests.report_fixtures import (
    EVIL,
    EVIL_SCRIPT,
    EVIL_TITLE,
    DomSummary,
    chromium,
    console_messages,
    flame_tree,
    full_report,
    needs_browser,
    tiny_kineto,
)  # fmt: skip

RESNET_NW0 = "kineto/tb_plugin/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
SECTIONS = ("Verdict", "Step time per step", "Step time breakdown", "GPU time and idle breakdown", "Top ops and kernels",
            "Memory", "Flame graph", "Per-rank comparison", "More analyses", "Capture facts", "Notes on the trace")  # fmt: skip


def _keep(path: Path, name: str) -> None:
    """Copy a screenshot to $SKALPEL_SCREENSHOTS (when set) so a person can look at it."""
    target = os.environ.get("SKALPEL_SCREENSHOTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(target) / name)


def test_full_report_has_every_section_in_order_verdict_first() -> None:
    page = html.render(full_report(), flame=flame_tree())
    headings = re.findall(r"<h2>([^<]+)</h2>", page)
    assert headings[: len(SECTIONS)] == list(SECTIONS)
    verdict = page.index("<h2>Verdict</h2>")
    # most severe first: the critical finding precedes the warning and the info
    assert verdict < page.index("dataloader_bound") < page.index("[gpu_idle]") < page.index("[no_warmup]")
    assert "not available" not in page


def test_trace_strings_are_escaped_everywhere() -> None:
    page = html.render(full_report(), flame=flame_tree())
    assert "<img" not in page
    assert "onerror=alert(1)&gt;" in page  # shown as text
    # only our two script elements: the code and the JSON data of the flame graph
    assert page.count("<script") == 2
    assert page.count("</script>") == 2
    assert "<!--" not in page


def test_script_json_cannot_close_the_script_element() -> None:
    text = html.script_json({"name": EVIL_SCRIPT + "&\u2028"})
    assert "<" not in text and ">" not in text and "&" not in text and "\u2028" not in text
    import json

    assert json.loads(text)["name"] == EVIL_SCRIPT + "&\u2028"


def test_csp_allows_only_the_pages_own_script() -> None:
    page = html.render(full_report(), flame=flame_tree())
    script = re.search(r"<script>(.*?)</script>", page, re.S).group(1)
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in page
    assert "default-src 'none'" in page
    assert not re.search(r"(src|href)=\"(https?:)?//", page)  # nothing fetched at view time


def test_empty_report_says_what_is_missing() -> None:
    report = Report(Source(("t.json",), None, "cpu", 1), StepStats(1, 5.0, 5.0, 0.0, marked=False),
                    (RankReport(0, (5.0,), {}),))  # fmt: skip
    page = html.render(report)
    for why in ("the step-time breakdown was not computed", "CPU-only trace", "the op table was not computed",
                "the trace has no memory events", "the trace has no Python call stacks", "the trace was loaded from disk"):  # fmt: skip
        assert f"not available: {why}" in page, why
    assert "No bottleneck found" in page and "1 steps, median 5.00 ms" in page
    assert "Per-rank comparison" not in page


@pytest.mark.slow
def test_page_stays_small_for_a_huge_report() -> None:
    report = full_report(ranks=16, ops=2000, curve=100_000)
    big_flame = flame_tree(depth=7, fan=5)  # ~100k frames
    page = html.render(report, flame=big_flame)
    assert len(page.encode()) < 5 * 2**20
    assert page.count('<td class="name mono">aten::op') <= html.parts.TABLE_ROWS * html.parts.DETAIL_RANKS
    many = html.render(full_report(ranks=512, ops=100, curve=50, steps=5000))  # a long job on many ranks
    assert len(many.encode()) < 5 * 2**20
    assert "every 17th step shown" in many and "The first 8 of 512 ranks" in many


def test_prune_flame_keeps_the_biggest_frames() -> None:
    tree = {"name": "all", "value": 100.0, "children": [
        {"name": "big", "value": 90.0, "children": []}, {"name": "tiny", "value": 0.001, "children": []}]}  # fmt: skip
    pruned = html.prune_flame(tree)
    assert [c["name"] for c in pruned["children"]] == ["big"]
    big = flame_tree(depth=6, fan=5)
    assert _count(big) > 10_000
    pruned = html.prune_flame(big, max_nodes=100)
    assert _count(pruned) <= 100 and pruned["value"] == big["value"]


def _count(node: dict) -> int:
    return 1 + sum(_count(child) for child in node["children"])


@pytest.mark.slow
def test_analyze_html_on_a_real_trace(tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    assert main(["analyze", str(corpus(RESNET_NW0)), "--html", str(out), "--json", str(tmp_path / "r.json")]) == 0
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and len(page.encode()) < 5 * 2**20
    assert 'id="flame-data"' in page  # the trace has Python stacks
    assert "aten::cudnn_convolution" in page


@pytest.mark.parametrize("relative", [
    "hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "hta/triton_example/triton_example.json.gz",
    "hta/critical_path/cuda_event_sync_multi_stream/event_sync_trace.json.gz",
])  # fmt: skip
def test_small_corpus_traces_render(relative: str) -> None:
    from skalpel.job.report_of import report_of_trace
    from skalpel.trace.loader import load

    trace = load(corpus(relative))
    report = report_of_trace(trace)
    page = html.render(report, flame=call_tree.flame_tree(trace, rank=trace.rank_ids[0]))
    headings = re.findall(r"<h2>([^<]+)</h2>", page)
    assert headings[0] == "Verdict" and "Capture facts" in headings
    assert page.count("<svg") >= 1 and page.endswith("</html>\n")
    if report.source.device == "cpu":
        assert "not available: CPU-only trace" in page


@needs_browser
@pytest.mark.slow
def test_browser_renders_every_chart_without_console_errors(tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    page.write_text(html.render(full_report(), flame=flame_tree()))
    dumped = chromium(page, "--dump-dom", tmp=tmp_path)
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    assert console_messages(dumped.stderr) == []
    dom = DomSummary(dumped.stdout)
    charts = [svg for svg in dom.svgs if "chart" in svg["class"]]
    assert len(charts) >= 7  # steps, breakdown, 2 GPU, 2 memory, flame, per-rank
    assert all(svg["shapes"] > 0 for svg in charts), charts
    flame = next(svg for svg in charts if svg["id"] == "flame")
    assert flame["shapes"] > 50  # drawn by the page's script from the embedded tree
    assert dom.title == "skalpel report"
    assert "img" not in dom.tags
    text = "".join(dom.text)
    assert EVIL in text and EVIL_TITLE in text

    shot = tmp_path / "report.png"
    taken = chromium(page, f"--screenshot={shot}", "--window-size=1280,2000", tmp=tmp_path)
    assert taken.returncode == 0 and shot.stat().st_size > 20_000
    _keep(shot, "full_report.png")


@needs_browser
@pytest.mark.slow
def test_browser_sorts_tables_and_zooms_the_flame_graph(tmp_path: Path) -> None:
    # A copy of the page with the CSP removed and a driver script appended that clicks like a user.
    markup = html.render(full_report(ranks=1), flame=flame_tree())
    markup = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", markup)
    driver = """<script>
      var th = document.querySelectorAll('table.sortable')[0].tHead.rows[0].cells[1];
      th.click();
      var first = document.querySelectorAll('table.sortable')[0].tBodies[0].rows[0].cells[1].textContent;
      th.click();
      var firstAsc = document.querySelectorAll('table.sortable')[0].tBodies[0].rows[0].cells[1].textContent;
      var before = document.querySelectorAll('#flame rect').length;
      var target = document.querySelectorAll('#flame rect')[1];
      target.dispatchEvent(new MouseEvent('click', {bubbles: true}));
      var zoomed = document.querySelectorAll('#flame rect')[1].getAttribute('width');
      var bar = document.querySelector('#breakdown svg rect[data-tip]');
      bar.dispatchEvent(new MouseEvent('mousemove', {bubbles: true, clientX: 20, clientY: 20}));
      var tip = document.getElementById('tip');
      var hover = tip.style.display + ':' + tip.textContent;
      document.body.setAttribute('data-result', [first, firstAsc, before, zoomed, hover].join('|'));
    </script></body>"""
    page = tmp_path / "driven.html"
    page.write_text(markup.replace("</body>", driver))
    dumped = chromium(page, "--dump-dom", tmp=tmp_path)
    assert console_messages(dumped.stderr) == []
    first, first_asc, before, zoomed, hover = re.search(r'data-result="([^"]*)"', dumped.stdout).group(1).split("|")
    assert (int(first), int(first_asc)) == (491, 1)  # calls column (50 rows shown): descending, then ascending
    assert int(before) > 50
    assert float(zoomed) == pytest.approx(1060, abs=1)  # the clicked frame now fills the width
    assert hover == "block:rank 0 · kernel: 55.5%"  # hovering a bar segment shows its details


@needs_browser
@pytest.mark.slow
def test_browser_shows_a_malicious_op_name_as_text(tmp_path: Path) -> None:
    trace = tiny_kineto(tmp_path / "evil.json")
    page = tmp_path / "evil.html"
    assert main(["analyze", str(trace), "--html", str(page)]) == 0
    report = analyze(trace)
    assert EVIL in {row.name for row in report.ranks[0].top_ops}  # the op really reaches the tables
    dumped = chromium(page, "--dump-dom", tmp=tmp_path)
    assert console_messages(dumped.stderr) == []  # a running handler or a blocked one would log here
    dom = DomSummary(dumped.stdout)
    assert dom.title == "skalpel report"  # EVIL_TITLE's handler did not run
    assert "img" not in dom.tags
    text = "".join(dom.text)
    assert EVIL in text and EVIL_TITLE in text


@needs_browser
@pytest.mark.slow
def test_browser_opens_a_real_trace_report_verdict_first(tmp_path: Path) -> None:
    page = tmp_path / "resnet.html"
    assert main(["analyze", str(corpus(RESNET_NW0)), "--html", str(page), "--json", str(tmp_path / "r.json")]) == 0
    dumped = chromium(page, "--dump-dom", tmp=tmp_path)
    assert console_messages(dumped.stderr) == []
    dom = DomSummary(dumped.stdout)
    assert all(svg["shapes"] > 0 for svg in dom.svgs if "chart" in svg["class"])
    assert re.findall(r"<h2>([^<]+)</h2>", dumped.stdout)[0] == "Verdict"
    report = Report.from_json((tmp_path / "r.json").read_bytes())
    assert "dataloader_bound" in {f.id for f in report.findings}
    verdict = dumped.stdout[dumped.stdout.index("<h2>Verdict</h2>"):dumped.stdout.index("<h2>Step time per step")]
    assert verdict.index("[dataloader_bound]") == min(verdict.index(f"[{f.id}]") for f in report.findings)
    # the blame: one bar per marked step, data loading first and largest, its line in the table of causes
    blamed = dumped.stdout[dumped.stdout.index("<h2>Why the device was idle</h2>"):]
    blamed = blamed[:blamed.index("</section>")]
    assert blamed.count("<text x=\"82\" ") == report.steps.count == 6
    assert "step 5 · data_loading:" in blamed and "resnet50_profiler_api.py:42" in blamed
    shot = tmp_path / "resnet.png"
    chromium(page, f"--screenshot={shot}", "--window-size=1280,2400", tmp=tmp_path)
    assert shot.stat().st_size > 20_000
    _keep(shot, "resnet_nw0.png")


@needs_browser
@pytest.mark.slow
def test_browser_opens_the_demo_run_folder_report(demo_run, tmp_path: Path) -> None:
    """`skalpel demo` writes report.html into its run folder; the data-loading verdict comes first."""
    done, folder = demo_run  # one demo run, shared with test_capture_run (conftest)
    assert done.returncode == 0, done.stderr[-2000:]
    document = json.loads((folder / "report.json").read_text())
    jsonschema.Draft202012Validator(json.loads(resources.files("skalpel.result").joinpath("report.schema.json").read_text())).validate(document)
    assert document["capture"]["warmup_steps"] >= 1  # a captured run: the capture facts are filled
    page = folder / "report.html"
    dumped = chromium(page, "--dump-dom", tmp=tmp_path)
    assert console_messages(dumped.stderr) == []
    dom = DomSummary(dumped.stdout)
    assert all(svg["shapes"] > 0 for svg in dom.svgs if "chart" in svg["class"])
    verdict = dumped.stdout[dumped.stdout.index("<h2>Verdict</h2>"):dumped.stdout.index("<h2>Step time per step")]
    assert re.search(r'class="finding critical">.*?\[dataloader_bound\]', verdict)
    assert re.findall(r"\[(\w+)\]</span>", verdict)[0] == "dataloader_bound"
    shot = tmp_path / "demo.png"
    chromium(page, f"--screenshot={shot}", "--window-size=1280,2400", tmp=tmp_path)
    _keep(shot, "demo.png")


def _blamed_report(*, category: str = "sync", label: str = "cudaStreamSynchronize", location: str = "train.py:9 in step",
                   with_finding: bool = True) -> Report:  # fmt: skip
    """One rank whose two steps idle 10 ms (6 data loading, 4 of ``category``) and 5 ms (all host compute)."""
    blame = {"unit": "step", "idle_ms_per_step": 7.5,
             "ms_per_step": {"data_loading": 3.0, category: 2.0, "host_compute": 2.5},
             "share_pct": {"data_loading": 40.0, category: 26.67, "host_compute": 33.33},
             "steps": [{"number": 3, "idle_ms": 10.0, "ms": {category: 4.0, "data_loading": 6.0}},
                       {"number": 4, "idle_ms": 5.0, "ms": {"host_compute": 5.0}}],
             "top": [{"category": "data_loading", "label": "DataLoader.__next__", "ms_per_step": 3.0},
                     {"category": category, "label": label, "ms_per_step": 2.0}],
             "notes": []}  # fmt: skip
    rank = RankReport(0, (20.0, 20.0), {"kernel": 60.0, "dataloader": 40.0}, blame=BlameSummary.from_dict(blame))
    culprits = [{"category": category, "label": label, "share_pct": 26.67, "ms_per_step": 2.0, "location": location}]
    findings = (Finding("gpu_idle", "warning", "The GPU is idle", {"culprits": culprits}, (), "", rank=0),) if with_finding else ()
    return Report(Source(("t.json",), None, "cuda", 1), StepStats(2, 20.0, 20.0, 0.0), (rank,), findings)


def _segments(page: str) -> dict[str, float]:
    """Each blame bar segment's width by its hover title."""
    chart = page[page.index('<section id="blame">'):]
    return {title: float(width) for width, title in re.findall(r'<rect x="[\d.]+" y="\d+" width="([\d.]+)" height="20"[^>]*>'
                                                                r"<title>([^<]+)</title>", chart)}  # fmt: skip


def test_blame_draws_one_stacked_bar_per_step_scaled_to_its_idle_time() -> None:
    page = html.render(_blamed_report())
    assert "<h2>Why the device was idle</h2>" in page
    assert page.index("<h2>GPU time and idle breakdown</h2>") < page.index("<h2>Why the device was idle</h2>")
    plot = html_svg.WIDTH - html_svg.BLAME_LEFT - html_svg.BLAME_RIGHT  # the longest step (10 ms) fills it
    widths = _segments(page)
    assert widths == pytest.approx({
        "step 3 · data_loading: 6.00 ms (60.0% of its idle time)": 0.6 * plot,
        "step 3 · sync: 4.00 ms (40.0% of its idle time)": 0.4 * plot,
        "step 4 · host_compute: 5.00 ms (100.0% of its idle time)": 0.5 * plot,
    }, abs=0.06)  # fmt: skip
    section = page[page.index('<section id="blame">'):page.index("</section>", page.index('<section id="blame">'))]
    # fixed order whatever the dict's: data loading before host compute before sync, in the legend and in the bar
    assert section.index(">data_loading</text>") < section.index(">host_compute</text>") < section.index(">sync</text>")
    assert section.index("step 3 · data_loading") < section.index("step 3 · sync")
    assert f'fill="{html_svg.BLAME_COLORS["sync"]}"' in section and ">10.00 ms</text>" in section
    # the largest causes, with the line gpu_idle found for them
    assert "cudaStreamSynchronize" in section and "train.py:9 in step" in section and "Idle 7.50 ms per step" in section


def test_blame_escapes_hostile_categories_labels_and_locations() -> None:
    page = html.render(_blamed_report(category=EVIL, label=EVIL, location=EVIL))
    section = page[page.index('<section id="blame">'):page.index("</section>", page.index('<section id="blame">'))]
    assert "<img" not in page
    assert section.count(escape(EVIL)) >= 5  # legend, hover title and data-tip, cause and what, where
    assert any(EVIL in title for title in (unescape(t) for t in _segments(page)))


def test_no_blame_section_without_blame() -> None:
    plain = _blamed_report()
    for report in (Report(plain.source, plain.steps, (RankReport(0, (20.0, 20.0), {}),)),
                   Report(plain.source, plain.steps, (RankReport(0, (20.0,), {}, blame=dataclasses.replace(
                       plain.ranks[0].blame, steps=())),))):  # fmt: skip
        page = html.render(report)
        assert "Why the device was idle" not in page and 'id="blame"' not in page


def test_the_ledger_draws_a_bar_per_unit_and_lane_and_escapes_what_it_quotes() -> None:
    """Where every millisecond went: one bar per step on the device and one on the main thread, each as long as the
    step, split by cause; a note from the trace is escaped."""
    report = analyze(corpus(RESNET_NW0))
    page = html.render(report)
    section = page[page.index('<section id="ledger">'):page.index("</section>", page.index('<section id="ledger">'))]
    assert section.count("step 5 · data_wait:") == 4  # the device's and the main thread's: hover tip and title each
    assert "device time by cause per step" in section and "main thread time by cause per step" in section
    assert f'fill="{html_svg.LEDGER_COLORS["compute"]}"' in section and "Judged over 6 steps." in section
    rank = dataclasses.replace(report.ranks[0], ledger=dataclasses.replace(report.ranks[0].ledger, notes=(EVIL,)))
    page = html.render(dataclasses.replace(report, ranks=(rank,)))
    assert escape(EVIL) in page and EVIL not in page


def test_the_step_chart_scales_on_finite_numbers_only() -> None:
    """Axes and bars from numbers that cannot be drawn (not finite, or so large that 10% more overflows) are left
    out or clamped, never an internal error or "nan" in the page."""
    assert html_svg.nice_ticks(float("nan")) == [0.0] and html_svg.nice_ticks(float("inf")) == [0.0]
    assert html_svg.nice_ticks(10.0) == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    chart = html_svg.step_bars([("rank 0", [10.0, float("nan"), float("inf"), 12.0])])
    assert "nan" not in chart.lower() and "inf" not in chart.lower() and chart.count("<rect") == 2
    huge = html_svg.step_bars([("rank 0", [1.7e308, 1.0])])
    assert "nan" not in huge.lower() and "inf" not in huge.lower()
