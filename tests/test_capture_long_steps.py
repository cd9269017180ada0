"""Steps too large for the recording's memory budget still give a report, and the error names the budget.

The shape of a real case: an LSTM fitted by LBFGS, whose ``optimizer.step(closure)`` runs the
closure (forward and backward over every time step) many times: one step of very many small
ops. Before, the budget tripped inside the window's first recorded step, the window was left
out and started again (without memory, then without stacks) until the script's ten steps ran
out, and the error blamed ``--warmup``. Each test runs ten such steps under a small
``SKALPEL_RECORD_BUDGET_MB`` with `skalpel run`, for real:

- a step past the budget but under 1.5 budgets is recorded whole, kept and analysed (with its
  stacks and memory events), and the recording ends there: the budget cannot hold the window;
- a step past 1.5 budgets before its end makes skalpel record again at once without memory
  profiling, stacks and shapes, and the lighter steps are analysed;
- a step too large even so: the error says the step is too large for the budget;
- the look-alike, the same script with short steps, records its window whole and says nothing.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from skalpel.result.report import Report

pytestmark = pytest.mark.slow

LBFGS = """
import sys
import time
import torch
from torch import nn
torch.set_num_threads(1)
torch.manual_seed(0)
time_steps, evaluations, pause = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
cell, head = nn.LSTMCell(4, 8), nn.Linear(8, 1)
optimizer = torch.optim.LBFGS([*cell.parameters(), *head.parameters()], lr=0.1, max_iter=evaluations,
                              tolerance_grad=0, tolerance_change=0)
x = torch.randn(2, time_steps, 4)

def closure():
    optimizer.zero_grad()
    h = c = torch.zeros(2, 8)
    for t in range(x.shape[1]):
        h, c = cell(x[:, t], (h, c))
    loss = head(h).pow(2).mean()
    loss.backward()
    time.sleep(pause)  # a slow evaluation: the step lasts long enough for the budget's polls, its ops do not grow
    return loss

for _ in range(10):
    optimizer.step(closure)
print("script done")
"""


def _run(tmp_path: Path, budget_mb: str, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    script = tmp_path / "lbfgs_lstm.py"
    script.write_text(LBFGS)
    out = tmp_path / "run"
    env = dict(os.environ, SKALPEL_RECORD_BUDGET_MB=budget_mb, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    command = [sys.executable, "-m", "skalpel", "run", "--out", str(out), str(script), *args]
    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert "script done" in done.stdout, done.stdout[-2000:] + done.stderr[-3000:]  # ran on to its end
    return done, out


def _trace(out: Path) -> list[dict]:
    return json.loads(gzip.decompress((out / "trace-rank0.json.gz").read_bytes()))["traceEvents"]


def test_a_step_too_large_for_the_window_is_kept_whole_and_analysed(tmp_path: Path) -> None:
    """About 57 MiB of records per step (100 time steps, 8 evaluations) against 48 MiB: one step fits under 1.5
    budgets (72 MiB), two do not."""
    done, out = _run(tmp_path, "48", "100", "8", "0")
    assert done.returncode == 0, done.stderr[-3000:]
    report = Report.from_json((out / "report.json").read_bytes())
    (kept,) = [warning for warning in report.warnings if "stopped early" in warning]
    assert kept.startswith("recording stopped early, after one step") and "kept whole and analysed" in kept
    assert "cannot hold the 5 steps" in kept and "(budget 48 MiB, $SKALPEL_RECORD_BUDGET_MB" in kept
    assert not [warning for warning in report.warnings if " dropped from step " in warning]
    assert report.steps.marked and report.steps.count == 1
    events = _trace(out)
    assert len([event for event in events if event.get("name", "").startswith("ProfilerStep#")]) == 1
    cells = [event for event in events if event.get("name") == "aten::lstm_cell"]
    assert len(cells) >= 100 * 8  # the whole step: every evaluation's time steps (LBFGS may evaluate a few more)
    categories = {event.get("cat") for event in events}
    assert "python_function" in categories and any(event.get("name") == "[memory]" for event in events)  # full detail
    assert report.findings is not None and "--warmup" not in done.stderr


def test_a_step_past_one_and_a_half_budgets_records_lighter_at_once(tmp_path: Path) -> None:
    """The same steps against 22 MiB: the first recorded step passes 33 MiB long before its end (the closure's
    pauses), so the window starts again without memory profiling, stacks and shapes (about 23 MiB a step): once, not
    once per setting, and its steps are analysed."""
    done, out = _run(tmp_path, "22", "100", "8", "0.2")
    assert done.returncode == 0, done.stderr[-3000:]
    report = Report.from_json((out / "report.json").read_bytes())
    (dropped,) = [warning for warning in report.warnings if " dropped from step " in warning]
    assert dropped.startswith("memory profiling, Python stacks and input shapes dropped from step 6 on")
    assert "one step with them does not fit" in dropped and "(budget 22 MiB" in dropped
    assert done.stderr.count(" dropped from step ") == 1
    assert report.steps.marked and report.steps.count >= 1
    events = _trace(out)
    cells = [event for event in events if event.get("name") == "aten::lstm_cell"]
    assert len(cells) >= 100 * 8 * report.steps.count  # whole steps only
    assert "python_function" not in {event.get("cat") for event in events}
    assert not [event for event in events if event.get("name") == "[memory]" or "Input Dims" in event.get("args", {})]
    assert "--warmup" not in done.stderr


def test_a_step_too_large_even_without_stacks_says_so(tmp_path: Path) -> None:
    """Against 4 MiB even the lightest step (about 23 MiB) passes 1.5 budgets: nothing is recorded, and the error says
    the step is too large for the budget, not to lower --warmup."""
    done, out = _run(tmp_path, "4", "100", "8", "0.2")
    assert "no step was recorded: one step of" in done.stderr and "is too large for the memory budget" in done.stderr
    assert "even without memory profiling, Python stacks and input shapes" in done.stderr
    assert "--warmup" not in done.stderr and not (out / "report.json").exists()


def test_short_lbfgs_steps_record_their_whole_window(tmp_path: Path) -> None:
    """The look-alike: the same LBFGS loop over 5 time steps, 2 evaluations, under the same 22 MiB: nothing said."""
    done, out = _run(tmp_path, "22", "5", "2", "0")
    assert done.returncode == 0, done.stderr[-3000:]
    report = Report.from_json((out / "report.json").read_bytes())
    assert not [warning for warning in report.warnings if "stopped early" in warning or "dropped" in warning]
    assert report.steps.marked and report.steps.count == 5
    assert "python_function" in {event.get("cat") for event in _trace(out)}
