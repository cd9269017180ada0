"""Training started with ``torch.multiprocessing.spawn`` (not torchrun): the main process only waits, so no step is
found there. ``skalpel run`` and ``skalpel watch`` both say the script's own function ran in spawned processes and how
to profile it, not "call skalpel.step()" to a script whose loop already calls optimizer.step()."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent

SCRIPT = """
import torch
import torch.multiprocessing as mp


def train_worker(rank, steps):
    torch.set_num_threads(1)
    model = torch.nn.Linear(32, 32)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        model(torch.randn(8, 32)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()


if __name__ == "__main__":
    mp.spawn(train_worker, args=(20,), nprocs=2)
"""


@pytest.mark.parametrize("command", ["run", "watch"])
def test_training_in_spawned_processes_is_said(tmp_path, command) -> None:
    script = tmp_path / "spawned.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "skalpel", command, "--out", str(tmp_path / "out"), str(script)],
                          capture_output=True, text=True, env=env, timeout=240, cwd=tmp_path)  # fmt: skip
    said = done.stderr
    assert "Traceback" not in said, said[-3000:]
    assert "no step in the main process" in said and "2 process(es) with the 'spawn' method" in said, said[-3000:]
    assert "running train_worker()" in said, said[-3000:]
    assert "no step boundary found" not in said
