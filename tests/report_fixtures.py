"""Test data for the report renderers: a hand-filled Report with every section present, a
tiny Kineto trace written on the spot, and a headless-Chromium runner.

The hand-filled Report exercises every field the renderers draw (the analyses fill them on
real traces too; see the corpus tests). Strings from "the trace" carry markup, so any
escaping slip shows up.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

from skalpel.result.report import (
    CaptureInfo,
    Finding,
    GpuSummary,
    KernelRow,
    MemorySummary,
    OpRow,
    RankReport,
    Report,
    Source,
    StepStats,
)  # fmt: skip
from skalpel.result.sections import CompiledRegion, CompiledSummary, LaunchSummary, SyncSummary

from .conftest import missing, skip_unless

EVIL = "<img src=x onerror=alert(1)>"
EVIL_TITLE = "<img src=x onerror=\"document.title='pwned'\">"
EVIL_SCRIPT = "</script><script>document.title='pwned'</script><!--"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Skipped locally without Chromium; under CI (SKALPEL_CI=1) the test runs and chromium() fails it.
needs_browser = skip_unless(CHROMIUM is not None, "chromium not installed (apt-get install chromium)")


def _rank(rank: int, *, slow: float = 1.0, ops: int = 60, curve: int = 3000, steps: int = 12) -> RankReport:
    points = tuple((i * 0.5, int(2**30 + 2**28 * math.sin(i / 50) + i * 2**18)) for i in range(curve))
    peak = max(points, key=lambda p: p[1]) if points else (0.0, 0)
    names = [EVIL, EVIL_TITLE, EVIL_SCRIPT]
    return RankReport(
        rank=rank,
        step_ms=tuple(100 * slow + 5 * math.sin(i) for i in range(steps)),
        step_breakdown_pct={"kernel": 55.5, "memcpy": 1.1, "memset": 0.1, "communication": 0.0, "runtime": 1.6,
                            "dataloader": 33.4, "cpu_exec": 7.7, "other": 0.6},  # fmt: skip
        gpu=GpuSummary(44.5, 50.0, 5.5, 12.0 if rank else None, {"host_wait": 80.0, "kernel_wait": 15.0, "other": 5.0}),
        memory=MemorySummary(peak[1], 1.5 * 2**20, f"cuda:{rank}", peak[0], points),
        top_ops=tuple(OpRow(names[i] if i < 3 else f"aten::op{i}", 10 * i + 1, 1.5 * i, 3.0 * i, 2.0 * (ops - i), "[[32, 3]]")
                      for i in range(ops)),  # fmt: skip
        top_kernels=tuple(KernelRow(names[i % 3] if i < 3 else f"volta_sgemm_{i}", "COMP", 5 + i, 10.0 - i * 0.1, 12.5, 3.3)
                          for i in range(30)),  # fmt: skip
        data_wait_ms_per_step=59.3,
        launch=LaunchSummary(launched=5000, delay_median_us=12.3, delay_p90_us=30.0, delay_p99_us=80.0,
                             delay_max_us=900.0, negative_delays=0, kernels=5000, kernel_median_us=4.5, launch_call_median_us=6.0,
                             tiny_kernels=1200, steps=steps, kernels_per_step=5000 / steps, ops_per_step=900.0,
                             tiny_kernel_pct=24.0),
        syncs=SyncSummary(blocked_ms_per_step=1.2, device_sync_count=0, device_sync_ms_per_step=0.0, sync_call_count=3,
                          sync_call_ms_per_step=1.2, item_count=3, item_ms_per_step=0.4, blocking_dtoh_count=0,
                          blocking_dtoh_ms_per_step=0.0, pageable_htod_count=2, pageable_htod_bytes=4096,
                          pageable_htod_ms=0.01),  # fmt: skip
    )


def full_report(*, ranks: int = 2, ops: int = 60, curve: int = 3000, steps: int = 12, findings: bool = True) -> Report:
    found = (
        Finding("gpu_idle", "warning", "GPU idle 44% of the step", {"idle_pct": 44.5}, ("train.py:50 in step",), "overlap"),
        Finding("dataloader_bound", "critical", f"Waiting for data: 33.4% of each step {EVIL}",
                {"dataloader_pct": 33.4, "ms_per_step": 59.3, "name": EVIL_SCRIPT}, ("train.py:42 in train_step", EVIL_TITLE),
                f"DataLoader(num_workers=4, pin_memory=True) {EVIL}"),
        Finding("no_warmup", "info", "No warm-up before recording", {}, (), "add warm-up steps"),
    )  # fmt: skip
    return Report(
        source=Source((f"/tmp/{EVIL}.json",), "2.13.0", "Tesla V100", ranks),
        steps=StepStats(steps * ranks, 100.0, 104.0, 0.03),
        ranks=tuple(_rank(r, slow=1 + r / 10, ops=ops, curve=curve, steps=steps) for r in range(ranks)),
        findings=found if findings else (),
        capture=CaptureInfo(5, 10, 3.2, 1.8, 2, "train.py", 0, 95.0, 98.0, (99.0, 101.0)),
        warnings=(f"a warning {EVIL}",),
    )


def flame_tree(depth: int = 5, fan: int = 3, name: str = "root") -> dict:
    if depth == 0:
        return {"name": name, "value": 1.0, "children": []}
    kids = [flame_tree(depth - 1, fan, f"train.py({10 + i}): fn{i}") for i in range(fan)]
    kids.append({"name": EVIL_TITLE, "value": 0.5, "children": []})
    return {"name": name, "value": sum(k["value"] for k in kids) + 0.2, "children": kids, "unit": "ms"}


def tiny_kineto(path: Path, op_name: str = EVIL) -> Path:
    """A two-step CPU trace in the Kineto JSON format whose main op is named ``op_name``."""
    events = []
    for step, start in ((1, 1000), (2, 2000)):
        events += [
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1, "ts": start, "dur": 1000, "args": {}},
            {"ph": "X", "cat": "python_function", "name": f"train.py(42): {op_name}", "pid": 1, "tid": 1, "ts": start + 50, "dur": 900, "args": {}},
            {"ph": "X", "cat": "cpu_op", "name": op_name, "pid": 1, "tid": 1, "ts": start + 100, "dur": 300, "args": {"Input Dims": [[2, 2]]}},
            {"ph": "X", "cat": "cpu_op", "name": EVIL_TITLE, "pid": 1, "tid": 1, "ts": start + 500, "dur": 200, "args": {}},
        ]  # fmt: skip
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return path


def chromium(page: Path, *args: str, tmp: Path) -> subprocess.CompletedProcess:
    """Run headless Chromium on ``page`` (a file on disk) with console messages logged to stderr."""
    if CHROMIUM is None:
        missing("chromium not installed (apt-get install chromium)")
    command = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={tmp / 'chromium-profile'}", "--enable-logging=stderr", "--v=0", *args, page.resolve().as_uri(),
    ]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def console_messages(stderr: str) -> list[str]:
    """Console output of the page (errors, CSP violations, logs): our page writes none."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


class DomSummary(HTMLParser):
    """Counts what the tests look at in a dumped DOM: SVG charts and their shapes, tags, title."""

    SHAPES = {"rect", "polyline", "polygon", "circle", "line", "path"}

    def __init__(self, markup: str) -> None:
        super().__init__()
        self.svgs: list[dict] = []  # {"id", "class", "shapes"}
        self.tags: dict[str, int] = {}
        self.title = ""
        self._in_title = False
        self._open_svg: list[dict] = []
        self.text: list[str] = []
        self.feed(markup)

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.tags[tag] = self.tags.get(tag, 0) + 1
        attributes = dict(attrs)
        if tag == "svg":
            self._open_svg.append({"id": attributes.get("id"), "class": attributes.get("class", ""), "shapes": 0})
        elif tag in self.SHAPES and self._open_svg:
            self._open_svg[-1]["shapes"] += 1
        self._in_title = tag == "title" and not self._open_svg

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg" and self._open_svg:
            self.svgs.append(self._open_svg.pop())
        self._in_title = False

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data
        self.text.append(data)


# The stored results every renderer is tried on (tests/test_renderers.py): each carries HOSTILE
# where a trace's or script's names go, so an output that forgets to escape shows it.
HOSTILE = "<img onerror=x>"
STEADY = (100.0, 100.5, 99.5, 100.2, 99.8, 100.1, 99.9, 100.3)


def _source(ranks: int = 1) -> Source:
    return Source((f"/tmp/{HOSTILE}.json",), "2.13.0", "cpu", ranks)


def empty_report() -> Report:
    """A trace with no steps at all: one rank and nothing measured on it."""
    return Report(_source(), StepStats(0, 0.0, 0.0, 0.0, marked=False), (RankReport(0, (), {}),))


def one_finding_report() -> Report:
    """One rank, one finding whose title and op carry HOSTILE."""
    rank = RankReport(0, STEADY, {"cpu_exec": 60.0, "dataloader": 40.0},
                      top_ops=(OpRow(HOSTILE, 8, 30.0, 40.0, 0.0), OpRow("aten::mm", 8, 10.0, 12.0, 0.0)),
                      data_wait_ms_per_step=40.0)  # fmt: skip
    finding = Finding("dataloader_bound", "critical", f"Waiting for data: 40% of each step in {HOSTILE}",
                      {"dataloader_pct": 40.0}, (f"train.py:42 in {HOSTILE}",), "DataLoader(num_workers=4)")  # fmt: skip
    return Report(_source(), StepStats(len(STEADY), 100.05, 100.5, 0.003), (rank,), (finding,))


def several_ranks_report() -> Report:
    """Four ranks with every section filled (``full_report``), findings of all three severities."""
    return full_report(ranks=4, ops=12, curve=40, steps=8)


def compiled_report() -> Report:
    """One rank with torch.compile regions (``RankReport.compiled``), no finding."""
    regions = tuple(CompiledRegion(region=f"Torch-Compiled Region: 0/{i}", function=None,
                                   location=f"train.py:{20 + i} in {HOSTILE}", calls=8, host_ms=4.0 - i, device_ms=0.0, kernels=0, triton_kernels=0)
                    for i in range(3))  # fmt: skip
    rank = RankReport(0, tuple(value * 1.2 for value in STEADY), {"cpu_exec": 100.0},
                      top_ops=(OpRow(HOSTILE, 8, 36.0, 48.0, 0.0),), compiled=CompiledSummary(regions=regions))  # fmt: skip
    return Report(_source(), StepStats(len(STEADY), 120.06, 120.6, 0.003), (rank,))


STORED_REPORTS = {"empty": empty_report, "one_finding": one_finding_report, "several_ranks": several_ranks_report,
                  "compiled": compiled_report}  # fmt: skip
