"""The memory budget stops the recording inside a step: that partial step is never counted.

A real `skalpel run` of a script whose few ops allocate a lot on CPU, with a small
``SKALPEL_RECORD_BUDGET_MB``: the step under way when the budget trips is left out of the
trace (so of the median, the cv and the op table), and the note says what grew instead of
blaming a very large number of ops.
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

SCRIPT = """
import torch
from torch import nn
torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 512))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(14):
    x = torch.randn(4096, 512)
    loss = sum(model(x + i).square().mean() for i in range(3))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
"""

RANKS = """
import torch
import torch.distributed as dist
from torch import nn
torch.set_num_threads(1)
dist.init_process_group("gloo")
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 512)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(12):
    x = torch.randn(2048, 512)
    loss = sum(model(x + i).square().mean() for i in range(3))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
dist.destroy_process_group()
"""


def test_the_step_cut_by_the_memory_budget_is_left_out(tmp_path: Path) -> None:
    script = tmp_path / "big_step.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, SKALPEL_RECORD_BUDGET_MB="60", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    command = [sys.executable, "-m", "skalpel", "run", "--warmup", "1", "--active", "4", "--out", str(tmp_path / "run"),
               str(script)]  # fmt: skip
    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = Report.from_json((tmp_path / "run" / "report.json").read_bytes())
    (note,) = [warning for warning in report.warnings if warning.startswith("recording stopped early")]
    assert "step cut where the recording stopped is left out" in note
    assert "very large number of ops" not in note and "what grew is the memory the step itself allocates" in note
    whole = int(note.split("the trace holds ")[1].split(" whole")[0])
    assert whole < 4  # the budget did stop the window
    trace = json.loads(gzip.decompress((tmp_path / "run" / "trace-rank0.json.gz").read_bytes()))
    markers = [event for event in trace["traceEvents"] if event.get("name", "").startswith("ProfilerStep#")]
    assert len(markers) == whole  # the partial step is not in the trace
    if not whole:  # nothing whole recorded: no step is claimed
        assert not report.steps.marked
    else:
        assert report.steps.marked and report.steps.count == whole  # nor in the median and cv
        rows = {row.name: row for row in report.ranks[0].top_ops}
        assert rows["aten::addmm"].calls == 6 * whole  # two Linear layers, three passes, whole steps only
    assert "step cut" in done.stderr and done.stderr.count("recording stopped early") == 1


def test_under_nproc_each_rank_says_it_once(tmp_path: Path) -> None:
    """Each rank printed the paragraph as it happened and again as it ended: now once per rank."""
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    env = dict(os.environ, SKALPEL_RECORD_BUDGET_MB="30", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore",
               SKALPEL_RANK_WAIT_S="120")  # fmt: skip
    command = [sys.executable, "-m", "skalpel", "run", "--nproc", "2", "--warmup", "1", "--active", "4",
               "--out", str(tmp_path / "run"), str(script)]  # fmt: skip
    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    said = [line for line in done.stderr.splitlines() if "recording stopped early" in line]
    assert len(said) == 2, done.stderr[-3000:]  # one per rank
    assert all("very large number of ops" not in line for line in said)
    assert done.stderr.count("(rank 0 writes the merged report)") == 2  # each rank's file, said once
