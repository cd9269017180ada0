"""`skalpel watch --show RUN --html FILE`: a watched run's timelines as one page, from stores written the real way.

The stores are written through the watch file's own step path (``watching/store.py``, its writer's poll
driven from the test with planted memory counters) with the real detector judging the rows, or by a real
``skalpel watch`` run; the page is opened in headless Chromium.
"""

from __future__ import annotations

import random
import re
import sqlite3
import subprocess
import sys
from html import escape
from pathlib import Path
from urllib.parse import unquote

import pytest

from skalpel.cli import main
from skalpel.watching.detect import Anomaly, Detector, Sample
from skalpel.watching.probe import Reading
from skalpel.watching.store import BATCH, STORE, Store, open_run
from skalpel.watching.timeline_html import COLUMNS, LEFT, PLOT_H, render_run, write_run_html
from tests.report_fixtures import DomSummary, chromium, console_messages, needs_browser

MIB = 2**20
HOSTILE = "</script><script>document.title='pwned'</script><img src=x onerror=alert(1)>"
SIZE_BOUND = 1_000_000


class Planted(Detector):
    """The real detector, plus an anomaly of ``kind`` with ``message`` at each step of ``at``."""

    def __init__(self, at: dict[int, tuple[str, str]]) -> None:
        super().__init__()
        self.at = at

    def feed(self, sample: Sample) -> list[Anomaly]:
        found = super().feed(sample)
        if sample.step in self.at:
            kind, message = self.at[sample.step]
            found.append(Anomaly(sample.step, kind, message, sample.wall_s, 0.0))
        return found


class PlantedCounters:
    """The process's counters as the test plants them: a read returns the reading set last (at a step's end)."""

    cuda_device = None

    def __init__(self, reading: Reading) -> None:
        self.reading = reading

    def read(self) -> Reading:
        return self.reading

    def close(self) -> None:
        pass


def _record(folder: Path, steps: int, *, spike: int | None = None, leak_from: int | None = None, script: str = "train.py",
            plant: dict[int, tuple[str, str]] | None = None, capture: tuple[str, str] | None = None,
            profiled: range = range(0), cuda_from: int | None = None) -> list[tuple[int, str]]:  # fmt: skip
    """Write a run of ``steps`` 10 ms steps through the store's own step path, its writer's poll driven from the
    test thread after each step (so that the planted counters are read at each step's end): a 300 ms step at
    ``spike``, RSS growing 1 MiB a step from ``leak_from``, CUDA memory from ``cuda_from``; each anomaly gets
    ``capture`` (folder, summary) when given. Returns the anomalies the detector found (step, kind)."""
    folder.mkdir(parents=True, exist_ok=True)
    found: list[tuple[int, str, int]] = []
    store = Store(folder, Planted(plant or {}), lambda anomaly, anomaly_id: found.append((anomaly.step, anomaly.kind, anomaly_id)))
    counters = PlantedCounters(Reading(0.0, 0.0, 300 * MIB, None, None))
    store.counters, store.origin = counters, 0.0
    store.timeline.add(counters.read())
    store._handle(("meta", {"script": script, "status": "running", "started": "2026-12-04T01:00:00"}))
    rng = random.Random(7)
    end = 0.0
    for step in range(1, steps + 1):
        wall = 0.010 + rng.random() * 0.0004 + (0.3 if step == spike else 0.0)
        begin, end = end, end + wall
        rss = 300 * MIB + (step - leak_from) * MIB if leak_from is not None and step >= leak_from else 300 * MIB
        cuda = 2**30 + step * 4096 if cuda_from is not None and step >= cuda_from else None
        counters.reading = Reading(end, end, rss, cuda, cuda)
        store.step(step, begin, end, 0.0, int(step in profiled))
        store._take_steps()  # the writer's poll
        if step % BATCH == 0:
            store._flush()
    store._flush()
    if capture:  # as the recorder does: once the capture is analysed
        for _, _, anomaly_id in found:
            store._handle(("capture", anomaly_id, *capture))
    store._handle(("meta", {"status": "ended", "exit_status": 0}))
    store.close()
    return [(step, kind) for step, kind, _ in found]


def _charts(page: str) -> list[str]:
    return re.findall(r'<svg class="chart".*?</svg>', page, flags=re.S)


def _mark_x(chart: str) -> dict[int, float]:
    """The x of each anomaly mark in a chart, by its step."""
    marks = re.findall(r'<g class="mark" data-step="(\d+)".*?<line x1="([\d.]+)"', chart)
    return {int(step): float(x) for step, x in marks}


def _column_x(step: int, first: int, last: int) -> float:
    return LEFT + min(int((step - first) / (last - first + 1) * COLUMNS), COLUMNS - 1) + 0.5


def test_each_timeline_is_one_path_and_each_anomaly_is_marked_at_its_step(tmp_path: Path) -> None:
    run = tmp_path / "run"
    found = _record(run, 2000, spike=1000, leak_from=1400)
    assert {kind for _, kind in found} == {"step_spike", "memory_creep"}, found  # the real detector found both
    page = render_run(run, page_dir=tmp_path)
    charts = _charts(page)
    assert len(charts) == 2 and "step time (ms, log scale)" in charts[0] and "RSS (MiB)" in charts[1]
    for chart in charts:
        assert chart.count("<path") == 1  # one path a timeline: each pixel column's median
        assert _mark_x(chart) == pytest.approx({step: _column_x(step, 1, 2000) for step, _ in found})
    # the spike is a single step of 2000: the top of the step-time band lies in its column
    band = re.search(r'<polygon class="band" points="([^"]+)"', charts[0]).group(1)
    points = [tuple(map(float, pair.split(","))) for pair in band.split()]
    assert min(points, key=lambda point: point[1])[0] == pytest.approx(_column_x(1000, 1, 2000))
    # every kind and message is in the page: on the marks (hover) and in the table
    db = open_run(run)
    stored = db.execute("SELECT step, kind, message FROM anomalies").fetchall()
    for step, kind, message in stored:
        assert page.count(escape(f"step {step} · {kind}: {message}")) == 4  # a tooltip and a <title> on each chart
        assert f"<td>{escape(message)}</td>" in page
    assert "No anomaly" not in page
    summary = page[page.index('id="summary"'):page.index('id="timelines"')]
    assert re.search(r">2000</td>", summary) and "p99" in summary and "DataLoader wait" in summary


def test_a_quiet_run_has_its_timelines_and_no_mark(tmp_path: Path) -> None:
    run = tmp_path / "quiet"
    assert _record(run, 600) == []
    page = render_run(run, page_dir=tmp_path)
    assert len(_charts(page)) == 2 and 'class="mark"' not in page and "No anomaly" in page
    step_time = _charts(page)[0]  # steady steps look steady: a linear axis from 0, not their 0.4 ms of noise magnified
    assert "step time (ms)" in step_time and ">0 ms</text>" in step_time
    path = re.search(r'<path class="series" d="M([^"]+)"', step_time).group(1)
    heights = [float(point.split(",")[1]) for point in path.split()]
    assert max(heights) - min(heights) < 0.1 * PLOT_H


def test_a_hostile_script_name_message_and_capture_are_escaped(tmp_path: Path) -> None:
    run = tmp_path / "run"
    found = _record(run, 300, script=f"{HOSTILE}.py", plant={200: ("step_spike", f"message {HOSTILE}")},
                    capture=(f"capture-{HOSTILE}", f"summary {HOSTILE}"))  # fmt: skip
    assert found == [(200, "step_spike")]
    page = render_run(run, page_dir=tmp_path)
    assert "<script>document" not in page and "<img" not in page and "onerror=alert(1)>" not in page
    assert page.count("<script>") == 1  # the page's own, hashed in its CSP
    assert escape(f"skalpel watch: {HOSTILE}.py") in page  # the title and the heading
    assert escape(f"message {HOSTILE}") in page and escape(f"summary {HOSTILE}") in page
    href = re.search(r'<td><a href="([^"]+)">', page).group(1)
    assert "<" not in href and ">" not in href and unquote(href) == f"run/capture-{HOSTILE}/"


def test_100k_steps_stay_small_and_every_column_holds_its_steps(tmp_path: Path) -> None:
    run = tmp_path / "long"
    found = _record(run, 100_000, spike=50_000, leak_from=70_000)
    assert {kind for _, kind in found} == {"step_spike", "memory_creep"}
    page = write_run_html(run, tmp_path / "long.html").read_text()
    assert len(page.encode()) < SIZE_BOUND, len(page)
    for chart in _charts(page):
        path = re.search(r'<path class="series" d="M([^"]+)"', chart).group(1)
        assert len(path.split()) == COLUMNS  # one point a pixel column, whatever the run's length
    tips = re.findall(r'data-tip="steps (\d+)-(\d+) \((\d+)\)', _charts(page)[0])
    assert sum(int(count) for _, _, count in tips) == 100_000  # every step is in one hover column
    assert int(tips[0][0]) == 1 and int(tips[-1][1]) == 100_000


def test_a_capture_is_linked_relative_to_the_page_to_its_report(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "run"
    _record(run, 300, plant={200: ("dataloader_stall", "waited")}, capture=("capture-200-dataloader_stall", "1 finding"))
    report = run / "capture-200-dataloader_stall" / "report.html"
    report.parent.mkdir()
    report.write_text("<html></html>")
    page_path = write_run_html(run, tmp_path / "pages" / "run.html")
    page = page_path.read_text()
    links = re.findall(r'<a href="([^"]+)">', page)
    assert len(links) == 3  # the table's cell and the mark on each chart
    assert {(page_path.parent / unquote(link)).resolve() for link in links} == {report.resolve()}
    assert "1 finding" in page


def test_a_job_has_one_row_and_one_pair_of_timelines_per_rank(tmp_path: Path) -> None:
    job = tmp_path / "job"
    for rank in (0, 1, 10):
        _record(job / f"rank{rank}", 300 + rank, plant={250: ("step_spike", f"rank {rank} spiked")} if rank == 1 else None)
    page = render_run(job, page_dir=tmp_path)
    summary = page[page.index('id="summary"'):page.index('id="timelines"')]
    assert re.findall(r"<tr><td>(rank\d+)</td>", summary) == ["rank0", "rank1", "rank10"]  # in rank order
    assert re.findall(r"<h3>(rank\d+)</h3>", page) == ["rank0", "rank1", "rank10"]
    charts = _charts(page)
    assert len(charts) == 6 and all(chart.count("<path") == 1 for chart in charts)
    assert [bool(_mark_x(chart)) for chart in charts] == [False, False, True, True, False, False]
    assert _mark_x(charts[2]) == pytest.approx({250: _column_x(250, 1, 310)})  # one step axis for all ranks
    assert "<td>rank1</td>" in page[page.index('id="anomalies"'):] and "rank 1 spiked" in page


def test_a_store_with_other_columns_reads_those_it_has(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _record(run, 300, plant={200: ("step_spike", "spiked")}, profiled=range(100, 110))
    with sqlite3.connect(run / STORE) as db:  # a newer store gained a column, an older one lacked two
        db.execute("ALTER TABLE steps ADD COLUMN energy_j REAL")
        db.execute("ALTER TABLE anomalies DROP COLUMN capture")
        db.execute("ALTER TABLE anomalies DROP COLUMN summary")
    page = render_run(run, page_dir=tmp_path)
    assert len(_charts(page)) == 2 and "spiked" in page and "<a href" not in page
    assert "steps 100-109: a capture&#x27;s steps" in page  # the capture's profiled steps, shaded


def test_a_cuda_run_draws_cuda_allocated_from_its_first_cuda_step(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _record(run, 400, cuda_from=100)
    page = render_run(run, page_dir=tmp_path)
    memory = _charts(page)[1]
    assert "CUDA allocated (MiB)" in memory and "RSS" not in memory
    tips = re.findall(r'data-tip="step (\d+): ([\d.]+) MiB"', memory)
    assert int(tips[0][0]) == 100 and float(tips[-1][1]) == pytest.approx((2**30 + 400 * 4096) / MIB, abs=0.01)
    assert "1.00 GiB (CUDA allocated)" in page


def test_the_cli_writes_the_page_and_asks_for_show_without_it(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    _record(run, 300)
    page = tmp_path / "out" / "run.html"
    assert main(["watch", "--show", str(run), "--html", str(page)]) == 0
    out = capsys.readouterr().out
    assert "step time" in out and out.rstrip().endswith(f"wrote {page}") and page.read_text().startswith("<!DOCTYPE")
    assert main(["watch", "--html", str(page), "train.py"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("skalpel: error: --html") and err.count("\n") == 1


# A short real run over a DataLoader that stalls (60 ms a batch for 40 batches from batch 300).
STALLING = """
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Batches(Dataset):
    def __len__(self):
        return 700

    def __getitem__(self, index):
        if 300 <= index < 340:
            time.sleep(0.06)
        return torch.ones(8)


model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for batch in DataLoader(Batches(), batch_size=None):
    loss = model(batch).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    time.sleep(0.004)
"""

# Run in the page (its CSP removed): each mark's triangle is on screen, is what a click there hits, and shows its tip.
DRIVER = """<script>
  var seen = [];
  document.querySelectorAll('g.mark').forEach(function (mark) {
    var box = mark.querySelector('polygon').getBoundingClientRect();
    var x = box.left + box.width / 2, y = box.top + box.height / 3;
    var hit = document.elementFromPoint(x, y);
    var onTop = hit !== null && hit.closest('g.mark') === mark;
    mark.dispatchEvent(new MouseEvent('mousemove', {bubbles: true, clientX: x, clientY: y}));
    var link = mark.closest('a');
    seen.push([mark.getAttribute('data-step'), Math.round(box.width), Math.round(box.height), onTop,
               document.getElementById('tip').textContent,
               link ? new URL(link.getAttribute('href'), document.baseURI).href : ''].join('~'));
  });
  document.body.setAttribute('data-marks', seen.join('|'));
</script></body>"""


@needs_browser
@pytest.mark.slow
def test_a_real_watched_run_page_opens_in_chromium_with_its_marks_visible_and_linked(tmp_path: Path) -> None:
    script = tmp_path / "stalling.py"
    script.write_text(STALLING)
    run = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "skalpel", "watch", "--out", str(run), str(script)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr
    stored = open_run(run).execute("SELECT step, kind, capture FROM anomalies").fetchall()
    stall = next((row for row in stored if row["kind"] == "dataloader_stall"), None)
    assert stall is not None and stall["capture"], (stored, done.stderr)
    page = tmp_path / "page" / "run.html"
    shown = subprocess.run([sys.executable, "-m", "skalpel", "watch", "--show", str(run), "--html", str(page)],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert shown.returncode == 0 and f"wrote {page}" in shown.stdout, shown.stderr

    dumped = chromium(page, "--dump-dom", tmp=tmp_path)
    assert dumped.returncode == 0 and console_messages(dumped.stderr) == [], dumped.stderr[-2000:]
    dom = DomSummary(dumped.stdout)
    charts = [chart for chart in dom.svgs if "chart" in chart["class"]]
    assert len(charts) == 2 and all(chart["shapes"] > 100 for chart in charts)  # columns, band, path, marks

    markup = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", page.read_text())
    driven = tmp_path / "page" / "driven.html"
    driven.write_text(markup.replace("</body>", DRIVER))
    dumped = chromium(driven, "--dump-dom", "--window-size=1280,2000", tmp=tmp_path)
    assert console_messages(dumped.stderr) == [], dumped.stderr[-2000:]
    marks = [entry.split("~") for entry in re.search(r'data-marks="([^"]*)"', dumped.stdout).group(1).split("|")]
    assert len(marks) == 2 * len(stored)  # each anomaly on both timelines
    for step, width, height, on_top, tip, link in marks:
        assert int(width) >= 8 and int(height) >= 6 and on_top == "true", (step, width, height, on_top)
        assert tip.startswith(f"step {step} · ")
        if int(step) == stall["step"]:
            assert "dataloader_stall" in tip and unquote(link).endswith(f"/run/{stall['capture']}/report.html")
            assert Path(unquote(link.removeprefix("file://"))).is_file()  # one click from the page: the capture's report
    shot = tmp_path / "run.png"
    chromium(page, f"--screenshot={shot}", "--window-size=1280,1400", tmp=tmp_path)
    assert shot.stat().st_size > 20_000
