"""The memory budget stops the recording inside a step: that partial step is never counted; a window whose first
recorded step cannot be recorded whole is recorded again without memory profiling, stacks and shapes, at once.

A real `skalpel run` of a script whose steps run thousands of small ops (an LSTM cell over
its time steps), with a small ``SKALPEL_RECORD_BUDGET_MB``: a step that grows past 1.5 budgets
before its end (one five times the others) is left out of the trace (so of the median, the cv and
the op table), and the note says what grew. The look-alike: a step of few ops that allocates 1 GiB on CPU (a big
activation) under a budget far below it records its whole window, since the budget charges
what the profiler holds, not the step's own tensors.
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

# About 41 MiB the profiler holds a step of 600 time steps with everything on (torch 2.13), past 1.5 budgets of 24 MiB:
# each rank records lighter, then stops early. The window is 8 steps.
ACTIVE = "8"
TIME_STEPS = 600
BUDGET_MB = "24"
LSTM_STEPS = """
import time
import torch
{imports}from torch import nn
torch.set_num_threads(1)
{init}torch.manual_seed(0)
cell, head = nn.LSTMCell(4, 8), {head}
optimizer = torch.optim.SGD([*cell.parameters(), *head.parameters()], lr=0.01)
x = torch.randn(2, {factor} * {time_steps}, 4)
for i in range(14):
    optimizer.zero_grad(set_to_none=True)
    h = c = torch.zeros(2, 8)
    for t in range({time_steps} * ({factor} if i == {huge} else 1)):
        h, c = cell(x[:, t], (h, c))
    head(h).pow(2).mean().backward()
    if i == {huge}:
        time.sleep(1.5)  # the budget's polls see the step past 1.5 budgets before its next hook (optimizer.step())
    optimizer.step()
{end}"""
# Iteration 7 is neither the first recorded step (--wait 1 --warmup 1) nor past the window: a hundred times the others
# (2,000 time steps against 20: about 140 MiB of records against 1.4 MiB), it passes 1.5 budgets of 34 MiB, and the
# pause after its backward lets the budget's polls see so before the step's next hook: that step is cut.
CUT_TIME_STEPS = 20
HUGE_STEP_BUDGET_MB = "34"
SCRIPT = LSTM_STEPS.format(imports="", init="", head="nn.Linear(8, 1)", end="", time_steps=CUT_TIME_STEPS, huge=7,
                           factor=100)
RANKS = LSTM_STEPS.format(imports="import torch.distributed as dist\n", init='dist.init_process_group("gloo")\n',
                          head="nn.parallel.DistributedDataParallel(nn.Linear(8, 1))", end="dist.destroy_process_group()\n",
                          time_steps=TIME_STEPS, huge=-1, factor=1)

BIG_STEP = """
import torch
from torch import nn
torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Linear(64, 64)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(9):
    big = torch.ones(2**28)  # 1 GiB of float32, freed before the step ends
    scale = big[:64].sum()
    del big
    optimizer.zero_grad()
    (model(torch.randn(32, 64)).sum() * scale).backward()
    optimizer.step()
"""


def test_a_step_allocating_a_gigabyte_does_not_cut_the_recording(tmp_path: Path) -> None:
    script = tmp_path / "gigabyte_step.py"
    script.write_text(BIG_STEP)
    env = dict(os.environ, SKALPEL_RECORD_BUDGET_MB="200", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    command = [sys.executable, "-m", "skalpel", "run", "--warmup", "1", "--active", "4", "--out", str(tmp_path / "run"),
               str(script)]  # fmt: skip
    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = Report.from_json((tmp_path / "run" / "report.json").read_bytes())
    assert not [warning for warning in report.warnings if "stopped early" in warning], report.warnings
    assert report.steps.marked and report.steps.count == 4

def test_the_step_cut_by_the_memory_budget_is_left_out(tmp_path: Path) -> None:
    script = tmp_path / "big_step.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, SKALPEL_RECORD_BUDGET_MB=HUGE_STEP_BUDGET_MB, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    command = [sys.executable, "-m", "skalpel", "run", "--warmup", "1", "--active", ACTIVE, "--out", str(tmp_path / "run"),
               str(script)]  # fmt: skip
    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = Report.from_json((tmp_path / "run" / "report.json").read_bytes())
    (note,) = [warning for warning in report.warnings if warning.startswith("recording stopped early")]
    assert "step cut where the recording stopped is left out" in note
    assert note.startswith("recording stopped early: the profiler's")
    whole = int(note.split("the trace holds ")[1].split(" whole")[0])
    assert 1 <= whole < int(ACTIVE)  # the steps before the huge one: the budget stopped the window inside it
    trace = json.loads(gzip.decompress((tmp_path / "run" / "trace-rank0.json.gz").read_bytes()))
    markers = [event for event in trace["traceEvents"] if event.get("name", "").startswith("ProfilerStep#")]
    assert len(markers) == whole  # the partial step is not in the trace
    if not whole:  # nothing whole recorded: no step is claimed
        assert not report.steps.marked
    else:
        assert report.steps.marked and report.steps.count == whole  # nor in the median and cv
        # one call per time step, whole steps only: in the trace, and in the op table where the op made its top rows
        # (by self time, which load reorders among the cell's dozen ops of the same count)
        cells = [event for event in trace["traceEvents"] if event.get("name") == "aten::lstm_cell"]
        assert len(cells) == CUT_TIME_STEPS * whole
        rows = {row.name: row for row in report.ranks[0].top_ops}
        assert "aten::lstm_cell" not in rows or rows["aten::lstm_cell"].calls == CUT_TIME_STEPS * whole
    assert "step cut" in done.stderr and done.stderr.count("recording stopped early") == 1


def test_under_nproc_each_rank_says_it_once(tmp_path: Path) -> None:
    """Each rank printed the paragraph as it happened and again as it ended: now once per rank."""
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    env = dict(os.environ, SKALPEL_RECORD_BUDGET_MB=BUDGET_MB, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore",
               SKALPEL_RANK_WAIT_S="120")  # fmt: skip
    command = [sys.executable, "-m", "skalpel", "run", "--nproc", "2", "--warmup", "1", "--active", ACTIVE,
               "--out", str(tmp_path / "run"), str(script)]  # fmt: skip
    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    said = [line for line in done.stderr.splitlines() if "recording stopped early" in line]
    assert len(said) == 2, done.stderr[-3000:]  # one per rank
    assert done.stderr.count("(rank 0 writes the merged report)") == 2  # each rank's file, said once


CALLS_STEP = """
import time
import torch
from torch import nn
torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Linear(16, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
def scale(value):
    return value * 1.0001
for _ in range(14):
    factor = 1.0
    for _ in range(200_000):  # Python calls: with stacks each is a python_function event the profiler keeps
        factor = scale(factor)
    time.sleep(0.8)  # the budget's thread sees what the step grew before the step ends
    optimizer.zero_grad(set_to_none=True)
    (model(torch.randn(8, 16)).pow(2).mean() * factor).backward()
    optimizer.step()
"""


def test_the_budget_drops_memory_profiling_stacks_and_shapes_at_once(tmp_path: Path) -> None:
    """The window's first recorded step passes 1.5 budgets while stacks are on (200,000 Python calls, about 4.6 MiB of
    records per step against 1.5 MiB) before it ends: memory profiling, stacks and shapes are dropped together, one
    window left out, not one per setting, and the window without them (a few dozen ops per step) is recorded in full."""
    script = tmp_path / "calls_step.py"
    script.write_text(CALLS_STEP)
    env = dict(os.environ, SKALPEL_RECORD_BUDGET_MB="1.5", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    command = [sys.executable, "-m", "skalpel", "run", "--warmup", "1", "--active", "4", "--out", str(tmp_path / "run"),
               str(script)]  # fmt: skip
    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = Report.from_json((tmp_path / "run" / "report.json").read_bytes())
    (dropped,) = [warning for warning in report.warnings if " dropped from step " in warning]
    assert dropped.startswith("memory profiling, Python stacks and input shapes dropped from step ")
    assert _from_step(dropped) == 5  # after the window's first recorded step, step 4 (--wait 1 --warmup 1)
    assert not [warning for warning in report.warnings if "stopped early" in warning], report.warnings
    assert report.steps.marked and report.steps.count == 4  # the lighter window, whole
    trace = json.loads(gzip.decompress((tmp_path / "run" / "trace-rank0.json.gz").read_bytes()))
    names = {event.get("name") for event in trace["traceEvents"]}
    categories = {event.get("cat") for event in trace["traceEvents"]}
    assert "[memory]" not in names and "python_function" not in categories  # recorded without either
    assert not [event for event in trace["traceEvents"] if "Input Dims" in event.get("args", {})]  # nor shapes
    assert done.stderr.count(" dropped from step ") == 1


def _from_step(note: str) -> int:
    """The step a drop took effect from: ``... dropped from step N on: ...``."""
    return int(note.split(" from step ")[1].split(" ")[0])
