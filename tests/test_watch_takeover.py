"""A takeover under ``skalpel watch``: a stronger signal replaces the fallback that marked the steps.

``skalpel run`` drops what it recorded and records again on the new signal (test_capture_iterations);
the watcher does the same through the one driver (``capture/driver.py``): the rows and anomalies of the
steps the fallback marked are dropped, steps are numbered and judged afresh, and a capture under way
is dropped with what it recorded.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
from contextlib import closing
from pathlib import Path

import pytest

from skalpel.capture.boundaries import Takeover
from skalpel.watching.detect import Anomaly
from skalpel.watching.store import STORE

# An evaluation pass before the optimizer exists (top-level model calls mark the steps), then 30 training iterations.
LATE_OPTIMIZER = """
import torch
from torch import nn
torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
with torch.no_grad():
    for _ in range(20):
        model(torch.randn(16, 32)).argmax(1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(30):
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(torch.randn(16, 32)), torch.randint(0, 10, (16,))).backward()
    optimizer.step()
"""


def _read(db_path: Path, sql: str) -> list[tuple]:
    with closing(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)) as db:
        return db.execute(sql).fetchall()


@pytest.mark.slow
def test_skalpel_watch_drops_the_steps_a_fallback_marked_once_the_optimizer_takes_over(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(textwrap.dedent(LATE_OPTIMIZER))
    done = subprocess.run([sys.executable, "-m", "skalpel", "watch", "--out", "run", "train.py"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "recorded again on optimizer.step()" in done.stderr
    store = tmp_path / "run" / STORE
    # the optimizer's boundaries come at iterations 2-30 (zero_grad): the first is the takeover, 28 steps follow;
    # the 19 model-call "steps" of the evaluation pass are not among them
    assert _read(store, "SELECT count(*), min(step), max(step) FROM steps") == [(28, 1, 28)]
    (note,) = _read(store, "SELECT value FROM meta WHERE key = 'takeover'")[0]
    assert note.startswith("the first 19 step(s) were marked by top-level module calls")
    assert "watched 28 steps" in done.stderr


def test_a_takeover_drops_the_capture_under_way_and_the_rows_before_it(tmp_path: Path, capsys) -> None:
    from skalpel.watching.recorder import Watcher

    (tmp_path / "run").mkdir()
    watcher = Watcher(tmp_path / "run", script="train.py")
    watcher.install()
    try:
        watcher.start_clock()
        for _ in range(5):
            watcher._boundary()
        watcher._requested.append((Anomaly(5, "step_time_spike", "slow", 1.0, 0.5), -1, None))
        watcher._boundary()  # the capture starts
        run = watcher.driver.run
        assert run is not None and run.profiling and watcher._profiled == 1
        watcher.policy.takeovers.append(Takeover("forward", "optimizer", 6))
        watcher.policy.restart = True
        watcher._boundary()
        assert not run.profiling and watcher.driver.run is None and watcher._capture is None
        assert watcher._profiled == 0 and not watcher.policy.restart and watcher.steps == 0
        assert not (tmp_path / "run" / "capture-5-step_time_spike").exists()  # nothing recorded: no folder
        for _ in range(3):
            watcher._boundary()
    finally:
        watcher.close(exit_status=0)
    assert _read(tmp_path / "run" / STORE, "SELECT step, profiled FROM steps") == [(1, 0), (2, 0), (3, 0)]
    assert "recorded again on optimizer.step()" in capsys.readouterr().err
