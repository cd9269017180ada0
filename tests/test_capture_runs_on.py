"""A script that never ends is told, once its steps are recorded, how to end it; one that ends is not.

Real `skalpel run` processes: a loop that runs until stopped (an RL loop until solved, ImageNet
with a dummy dataset) gets one line on stderr some seconds after the capture, and Ctrl-C then
gives the report; the same loop that ends by itself soon after the capture gets no such line.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from skalpel.capture.runner import RUNS_ON_S

pytestmark = pytest.mark.slow

LOOP = """
import sys
import torch
from torch import nn
torch.set_num_threads(1)
model = nn.Linear(64, 64)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
step = 0
while sys.argv[1] == "forever" or step < int(sys.argv[1]):
    optimizer.zero_grad()
    model(torch.randn(32, 64)).square().mean().backward()
    optimizer.step()
    step += 1
"""
LINE = "the report comes when it ends. Press Ctrl-C"


def _start(tmp_path: Path, steps: str) -> subprocess.Popen:
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    command = [sys.executable, "-m", "skalpel", "run", "--wait", "0", "--warmup", "1", "--active", "3",
               "--out", str(tmp_path / "run"), str(script), steps]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    return subprocess.Popen(command, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_script_that_runs_on_is_told_how_to_end_it(tmp_path: Path) -> None:
    process = _start(tmp_path, "forever")
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True)  # type: ignore[arg-type]
    reader.start()
    deadline = time.monotonic() + 180
    try:
        while not any(LINE in line for line in lines) and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.5)
        said = [line for line in lines if LINE in line]
        assert len(said) == 1, "".join(lines)[-2000:]
        assert "--stop-after-capture" in said[0] and "3 step(s) are recorded" in said[0]
        process.send_signal(signal.SIGINT)
        out, _ = process.communicate(timeout=300)  # the analysis after Ctrl-C took over 120 s once at load ~12
    finally:
        if process.poll() is None:
            process.kill()
    reader.join(timeout=10)
    assert process.returncode == 130
    assert (tmp_path / "run" / "report.json").is_file() and "verdict" in out
    assert sum(LINE in line for line in lines) == 1  # said once


def test_a_script_that_ends_soon_after_the_capture_is_not_told(tmp_path: Path) -> None:
    process = _start(tmp_path, "40")
    out, err = process.communicate(timeout=180)
    assert process.returncode == 0, err[-2000:]
    assert LINE not in err and RUNS_ON_S >= 5
