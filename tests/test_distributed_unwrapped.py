"""A 2-rank job whose model is never wrapped in DDP is told that its ranks never communicate.

Real gloo ranks under `skalpel run --nproc 2`: the same script with and without
DistributedDataParallel (its look-alike must not get the note), both jobs at once.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from skalpel.result.report import Report

pytestmark = [pytest.mark.slow, pytest.mark.alone]  # real multi-rank jobs judged on the load they see: conftest

SCRIPT = """
import sys
import torch
import torch.distributed as dist
from torch import nn
torch.set_num_threads(1)
dist.init_process_group("gloo")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
if "--ddp" in sys.argv:
    model = nn.parallel.DistributedDataParallel(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data, target = torch.randn(1024, 256), torch.randint(0, 10, (1024,))
for _ in range(10):
    optimizer.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(model(data), target).backward()
    optimizer.step()
dist.destroy_process_group()
"""
TIMEOUT_S = 300


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    base = tmp_path_factory.mktemp("unwrapped")
    script = base / "train.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", SKALPEL_RANK_WAIT_S="120")
    command = [sys.executable, "-m", "skalpel", "run", "--nproc", "2", "--wait", "0", "--warmup", "1", "--active", "3"]
    jobs = {"plain": [], "ddp": ["--ddp"]}
    processes = {
        name: subprocess.Popen([*command, "--out", str(base / name), str(script), *extra], env=env, cwd=base,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for name, extra in jobs.items()
    }  # fmt: skip
    done = {}
    for name, process in processes.items():
        out, _ = process.communicate(timeout=TIMEOUT_S)
        assert process.returncode == 0, f"{name} exited {process.returncode}:\n{out[-3000:]}"
        done[name] = (base / name, out)
    return done


def _report(folder: Path) -> Report:
    return Report.from_json((folder / "report.json").read_bytes())


def test_ranks_without_ddp_are_told_they_never_communicate(runs) -> None:
    folder, out = runs["plain"]
    report = _report(folder)
    (note,) = [f for f in report.findings if f.id != "not_judged" and "never communicate" in f.title]
    assert note.id == "communication_bound" and note.severity == "info"
    assert note.evidence["ranks"] == 2 and note.evidence["collectives"] == 0 and note.evidence["profiled_steps"] >= 6
    assert "DistributedDataParallel" in note.title and "DistributedDataParallel" in note.fix
    unjudged = [f.title for f in report.findings if f.id == "not_judged"]
    assert any("never communicate" in title and "straggler_rank" in title for title in unjudged)
    assert not any("no collective matches" in title or "no collectives in the profiled" in title for title in unjudged)
    assert "The 2 ranks never communicate" in " ".join(out.split())  # said in the user's terminal


def test_ranks_reduced_in_workers_say_it_too(runs) -> None:
    from skalpel.api import analyze, stored_capture
    from skalpel.job.report_of import report_of

    folder, _ = runs["plain"]
    here = report_of(folder, capture=stored_capture(folder), workers=1).report  # rank after rank in this process
    assert analyze(folder, workers=2).to_json() == here.to_json()
    assert any("never communicate" in f.title for f in here.findings)


def test_ddp_look_alike_is_not_told(runs) -> None:
    folder, out = runs["ddp"]
    report = _report(folder)
    assert not any("never communicate" in f.title for f in report.findings)
    assert "never communicate" not in out
    comm = report.ranks[0].extra["comm"]
    assert any(row["type"] == "all_reduce" for row in comm["by_type"])


def test_the_job_is_announced_once_not_once_per_rank(runs) -> None:
    for name, (_, out) in runs.items():
        assert out.count("skalpel: profiling ") == 1, f"{name}:\n{out[-3000:]}"  # stdout and stderr interleave
