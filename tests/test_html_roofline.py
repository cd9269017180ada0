"""The roofline drawn in the HTML page (issue 37): a log-log SVG of FLOPs per byte against achieved FLOP/s, the
roofs, one labelled dot per judged op group; self-contained, every name escaped; "not judged" with why.

The stored H100 trace gives real op groups and datasheet roofs; a real headless Chromium opens the page.
"""

from __future__ import annotations

import dataclasses
import html as std_html
import math
import re
from pathlib import Path

import pytest

from skalpel.api import analyze
from skalpel.report import html
from tests.conftest import corpus
from tests.report_fixtures import EVIL, DomSummary, chromium, console_messages, needs_browser

H100_QWEN = "extra/AMD-AGI__TraceLens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"


@pytest.fixture(scope="module")
def report():
    return analyze(corpus(H100_QWEN))


def _section(page: str) -> str:
    body = page[page.index('<section id="roofline">'):]
    return body[:body.index("</section>")]


def _with_roofline(report, **changes):
    rank = report.ranks[0]
    roof = dataclasses.replace(rank.roofline, **changes)
    return dataclasses.replace(report, ranks=(dataclasses.replace(rank, roofline=roof), *report.ranks[1:]))


def test_one_dot_per_judged_op_group_placed_on_log_axes_under_the_roofs(report) -> None:
    roof = report.ranks[0].roofline
    body = _section(html.render(report))
    judged = sorted((op for op in roof.ops if op.label != "not judged"), key=lambda op: -op.ms)  # drawn in this order
    dots = [(float(x), float(y)) for x, y in re.findall(r'<g class="op"><circle cx="([\d.]+)" cy="([\d.]+)"', body)]
    assert len(dots) == len(judged) >= 6
    # log-log: pixel distances are proportional to the ratio of the figures, the same scale for every pair
    first, last = max(range(len(judged)), key=lambda i: judged[i].intensity), min(
        range(len(judged)), key=lambda i: judged[i].intensity)
    x_scale = (dots[first][0] - dots[last][0]) / math.log10(judged[first].intensity / judged[last].intensity)
    y_top = max(range(len(judged)), key=lambda i: judged[i].achieved_gflops)
    y_low = min(range(len(judged)), key=lambda i: judged[i].achieved_gflops)
    top, low = judged[y_top].achieved_gflops, judged[y_low].achieved_gflops
    y_scale = (dots[y_low][1] - dots[y_top][1]) / math.log10(top / low)
    assert x_scale > 0 and y_scale > 0
    for op, (x, y) in zip(judged, dots):
        assert x - dots[last][0] == pytest.approx(x_scale * math.log10(op.intensity / judged[last].intensity), abs=0.2)
        assert dots[y_low][1] - y == pytest.approx(y_scale * math.log10(op.achieved_gflops / low), abs=0.2)
    # the roofs: one line per distinct (peak, bandwidth), the H100's bf16 tensor peak and its FP32 vector peak
    assert body.count('<g class="roof">') == len({(op.peak_gflops, op.peak_gbps) for op in judged}) == 2
    assert "989.4 TFLOP/s, 3.35 TB/s" in body and "67 TFLOP/s, 3.35 TB/s" in body
    assert "aten::mm</text>" in body and "compute-bound" in body and "memory-bound" in body
    # self-contained: nothing fetched (the xmlns is a name, not a request)
    assert not re.search(r"\b(?:src|href)=", body) and "<script" not in body
    # the modules' roofline is a table beside it
    assert "Qwen2Model_0 &gt; Qwen2DecoderLayer_" in body


def test_every_name_is_escaped(report) -> None:
    roof = report.ranks[0].roofline
    ops = list(roof.ops)
    heavy = next(i for i, op in enumerate(ops) if op.label != "not judged")
    ops[heavy] = dataclasses.replace(ops[heavy], op=EVIL, shapes=EVIL, dtype=EVIL)
    modules = (dataclasses.replace(roof.modules[0], path=(EVIL, "Linear_0")), *roof.modules[1:])
    page = html.render(_with_roofline(report, ops=tuple(ops), modules=modules, roofs=EVIL))
    body = _section(page)
    assert EVIL not in page and "<img" not in body
    assert std_html.escape(EVIL) in body  # in the dot's title, the table and the roofs' source


def test_nothing_judged_is_not_drawn_and_says_why(report) -> None:
    roof = report.ranks[0].roofline
    ops = tuple(dataclasses.replace(op, label="not judged", why="no memory bandwidth for <GPU> in the peak table")
                for op in roof.ops)  # fmt: skip
    body = _section(html.render(_with_roofline(report, ops=ops, modules=(), modules_why="not judged: none of them")))
    assert '<svg class="chart roofline"' not in body
    assert "roofline not drawn: not judged (no memory bandwidth for &lt;GPU&gt; in the peak table)" in body
    assert "modules: not judged: none of them" in body


def test_a_report_without_the_section_has_no_roofline(report) -> None:
    bare = dataclasses.replace(report, ranks=(dataclasses.replace(report.ranks[0], roofline=None),))
    assert '<section id="roofline">' in html.render(report) and '<section id="roofline">' not in html.render(bare)


@needs_browser
@pytest.mark.slow
def test_chromium_draws_the_roofline(report, tmp_path: Path) -> None:
    page = tmp_path / "roofline.html"
    page.write_text(html.render(report), encoding="utf-8")
    dumped = chromium(page, "--dump-dom", tmp=tmp_path)
    assert console_messages(dumped.stderr) == []  # no CSP violation, no script error
    dom = DomSummary(dumped.stdout)
    charts = [svg for svg in dom.svgs if "roofline" in svg["class"]]
    assert len(charts) == 1 and charts[0]["shapes"] >= 8  # the frame, grid lines, two roofs, the dots
    shot = tmp_path / "roofline.png"
    chromium(page, f"--screenshot={shot}", "--window-size=1280,4000", tmp=tmp_path)
    assert shot.stat().st_size > 20_000
