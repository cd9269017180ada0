"""skalpel's own threads stay out of the user's trace.

torch.profiler's Python tracer is installed on every thread alive when a window starts, so a thread
of skalpel's started before the window (the line sampler, the record budget, the step watchdog, the
watch writer) was traced from then on although it left the tracer at its start: the line sampler's
reads of the frames every 5 ms made 3,200 of a window's 38,800 events on a quiet machine and
13,000 beside busy loops, in the user's trace and flame graph, and pushed the window past the memory
split's event limit (a CI failed on the missing split). Each thread now leaves the tracer at every
wake-up (``capture/quiet.off_the_python_tracer``). A real torch.profiler window with stacks.
"""

from __future__ import annotations

import gzip
import json
import sys
import threading
import time
from pathlib import Path

import torch

from skalpel.capture.sampler import LineSampler

STEPS = 4
STEP_S = 0.05  # 10 of the sampler's 5 ms wake-ups a step


def _traced_window(tmp_path: Path) -> list[dict]:
    model = torch.nn.Linear(8, 8)
    path = tmp_path / "trace.json.gz"
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], with_stack=True) as prof:
        for _ in range(STEPS):
            model(torch.randn(4, 8)).sum().backward()
            time.sleep(STEP_S)
    prof.export_chrome_trace(str(path))
    return json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]


def _events_of_thread(events: list[dict], ident_native: int) -> list[str]:
    return [event["name"] for event in events if event.get("tid") == ident_native and event.get("ph") == "X"]


def test_the_line_sampler_started_before_the_window_is_not_traced(tmp_path: Path) -> None:
    sampler = LineSampler()
    sampler.start()
    time.sleep(0.02)  # it runs before the window opens, as in skalpel run
    try:
        events = _traced_window(tmp_path)
    finally:
        sampler.stop()
    names = _events_of_thread(events, sampler._thread.native_id)
    assert len(sampler.samples) >= STEPS * STEP_S / 0.005 / 2  # it sampled through the window
    # at most its first wake-up's calls and the frames open when the window began (about 10), never one per sample
    assert len(names) < 25, names[:40]
    assert names.count("<built-in function _current_frames>") <= 1


def test_a_thread_that_leaves_the_tracer_only_at_its_start_is_traced(tmp_path: Path) -> None:
    """The control: what the threads did before; shows the assertion above can fail."""
    stopped = False

    def poll() -> None:
        sys.setprofile(None)
        while not stopped:
            time.sleep(0.005)
            sys._current_frames()

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    time.sleep(0.02)
    try:
        events = _traced_window(tmp_path)
    finally:
        stopped = True
        thread.join()
    names = _events_of_thread(events, thread.native_id)
    assert names.count("<built-in function _current_frames>") >= 10
