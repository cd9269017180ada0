"""`skalpel run` on loops of every shape: one step per iteration, the script's own arguments, CPU contention.

Every test runs the real `skalpel run` on a small script written to tmp_path and reads
the trace and report.json it wrote. The loop scripts start together (module fixture)
so their torch imports and analyses overlap; the contention test runs alone, with its
competitors.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from .conftest import assert_not_blamed, pinned

pytestmark = pytest.mark.slow

QUICK = ("--wait", "1", "--warmup", "1", "--active", "4")

# A GAN's iteration: D steps, then G steps (modules zeroed with Module.zero_grad, as DCGAN does).
TWO_OPTIMIZERS = """
import torch
from torch import nn
torch.set_num_threads(1)
torch.manual_seed(0)
G = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 32))
D = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
opt_d = torch.optim.Adam(D.parameters(), 1e-3)
opt_g = torch.optim.Adam(G.parameters(), 1e-3)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(20 * 32, 32)), batch_size=32)
bce = nn.BCEWithLogitsLoss()
for (real,) in data:
    D.zero_grad()
    fake = G(torch.randn(32, 16))
    loss_d = bce(D(real), torch.ones(32, 1)) + bce(D(fake.detach()), torch.zeros(32, 1))
    loss_d.backward()
    opt_d.step()
    G.zero_grad()
    bce(D(fake), torch.ones(32, 1)).backward()
    opt_g.step()
"""

# Hand-written SGD, as the word-language-model example: no optimizer, no DataLoader.
MANUAL_SGD = """
import torch
torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Tanh(), torch.nn.Linear(128, 1))
for i in range(20):
    x = torch.randn(256, 64)
    model.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    loss.backward()
    for p in model.parameters():
        p.data.add_(p.grad, alpha=-0.01)
"""

INFERENCE = """
import torch
torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).eval()
with torch.no_grad():
    for i in range(20):
        model(torch.randn(128, 64)).argmax(1)
"""

# Options that argparse would take for abbreviations of skalpel's own (--n: --name or --nproc).
OWN_OPTIONS = """
import argparse
import json
import torch
parser = argparse.ArgumentParser()
for option in ("--n", "--wa", "--name", "--out", "--workers"):
    parser.add_argument(option)
args = parser.parse_args()
print("SCRIPT ARGS " + json.dumps(vars(args), sort_keys=True))
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(int(args.n)):
    optimizer.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
"""

NO_STEP = """
import time
import torch
time.sleep(4)  # loads, waits, computes nothing skalpel can call a step
print("done")
"""

LOOPS = {
    "two_optimizers": (TWO_OPTIMIZERS, ()),
    "manual_sgd": (MANUAL_SGD, ()),
    "inference": (INFERENCE, ()),
    "own_options": (OWN_OPTIONS, ("--workers", "0", "--n", "20", "--wa", "3", "--name", "mine", "--out", "theirs")),
    "backward_chosen": (TWO_OPTIMIZERS, ()),
    "no_step": (NO_STEP, ()),
}
OPTIONS = {"backward_chosen": ("--step-on", "backward"), "no_step": ("--step-timeout", "1")}


def _command() -> list[str]:
    return [sys.executable, "-m", "skalpel", "run"]


class Runs:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.processes: dict[str, subprocess.Popen] = {}

    def start(self, name: str, source: str, script_args: tuple[str, ...], options: tuple[str, ...] = ()) -> None:
        script = self.root / f"{name}.py"
        script.write_text(textwrap.dedent(source))
        command = [*_command(), *QUICK, *options, "--out", str(self.root / name), str(script), *script_args]
        self.processes[name] = subprocess.Popen(
            command, cwd=self.root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def result(self, name: str) -> tuple[int, str, str]:
        out, err = self.processes[name].communicate(timeout=600)
        return self.processes[name].returncode, out, err

    def report(self, name: str) -> dict:
        status, out, err = self.result(name)
        assert status == 0, err[-3000:]
        return json.loads((self.root / name / "report.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    runs = Runs(tmp_path_factory.mktemp("loops"))
    for name, (source, script_args) in LOOPS.items():
        runs.start(name, source, script_args, OPTIONS.get(name, ()))
    yield runs
    for process in runs.processes.values():
        if process.poll() is None:
            process.kill()


def _ops_per_step(folder: Path, name: str) -> list[int]:
    """How many host events called ``name`` each recorded ProfilerStep holds."""
    events = json.loads(gzip.decompress((folder / "trace-rank0.json.gz").read_bytes()))["traceEvents"]
    steps = [e for e in events if e.get("name", "").startswith("ProfilerStep#") and e.get("ph") == "X"]
    calls = [e for e in events if e.get("name") == name and e.get("ph") == "X"]
    return [sum(1 for c in calls if s["ts"] <= c["ts"] < s["ts"] + s["dur"]) for s in sorted(steps, key=lambda e: e["ts"])]


def test_two_optimizers_per_iteration_make_one_step(runs):
    report = runs.report("two_optimizers")
    assert report["capture"]["step_signal"] == "optimizer.step()"
    assert report["steps"]["count"] == 4
    # every recorded step is one whole iteration: D's step and G's step, three D calls' first layer
    assert _ops_per_step(runs.root / "two_optimizers", "Optimizer.step#Adam.step") == [2, 2, 2, 2]
    assert _ops_per_step(runs.root / "two_optimizers", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__") == [1, 1, 1, 1]


def test_manual_sgd_steps_on_backward(runs):
    report = runs.report("manual_sgd")
    assert report["capture"]["step_signal"] == "backward()"
    assert report["steps"]["count"] == 4
    assert _ops_per_step(runs.root / "manual_sgd", "aten::mse_loss") == [1, 1, 1, 1]
    assert _ops_per_step(runs.root / "manual_sgd", "aten::add_") == [4, 4, 4, 4]  # the update of 4 parameters


def test_inference_loop_steps_on_top_level_calls(runs):
    report = runs.report("inference")
    assert report["capture"]["step_signal"] == "top-level module calls"
    assert report["steps"]["count"] == 4
    assert _ops_per_step(runs.root / "inference", "aten::argmax") == [1, 1, 1, 1]


def test_step_on_backward_is_the_users_choice(runs):
    report = runs.report("backward_chosen")
    assert report["capture"]["step_signal"] == "backward()"
    # two backward() calls per GAN iteration: each marks a step when backward is chosen
    assert _ops_per_step(runs.root / "backward_chosen", "Optimizer.step#Adam.step") == [1, 1, 1, 1]


def test_script_options_reach_the_script_untouched(runs):
    status, out, err = runs.result("own_options")
    assert status == 0, err[-3000:]
    assert 'SCRIPT ARGS {"n": "20", "name": "mine", "out": "theirs", "wa": "3", "workers": "0"}' in out
    assert (runs.root / "own_options" / "report.json").is_file()  # skalpel's --out (before the script) still holds
    assert not (runs.root / "theirs").exists()


def test_a_script_that_never_reaches_a_step_is_told_while_it_runs(runs):
    status, out, err = runs.result("no_step")
    assert "done" in out
    assert "no step boundary in the first" in err and "skalpel.step()" in err and "--step-on" in err
    assert err.index("no step boundary in the first") < err.index("error:")  # said while running, then the verdict
    assert status == 2 and "no step boundary found" in err


# ---- CPU contention ---------------------------------------------------------------------------------

CONTENDED = """
import sys
import torch
import skalpel
torch.set_num_threads(int(sys.argv[1]))
torch.manual_seed(0)
a = torch.randn(384, 384)
for i in range(40):
    for _ in range(4):
        b = a @ a
    skalpel.step()
"""


def _run_alone(tmp_path: Path, threads: int, **pin) -> dict:
    script = tmp_path / "contended.py"
    script.write_text(textwrap.dedent(CONTENDED))
    out = tmp_path / f"run{threads}"
    result = subprocess.run([*_command(), *QUICK, "--out", str(out), str(script), str(threads)], cwd=tmp_path,
                            capture_output=True, text=True, timeout=600, **pin)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((out / "report.json").read_text())


def _contention(report: dict) -> list[dict]:
    return [finding for finding in report["findings"] if finding["id"] == "cpu_contention"]


def test_one_thread_on_its_own_core_is_never_blamed_for_cpu_contention(tmp_path):
    """The negative control always runs, pinned to one core with one thread. On a quiet machine nothing is
    reported; on a busy one (CI on 2 shared cores) the contention is real, and its finding must name the other
    processes, never the script's one thread, as the cause."""
    report = _run_alone(tmp_path, threads=1, **pinned())
    assert report["capture"]["step_signal"] == "skalpel.step()"
    cpu = report["capture"]["cpu"]
    assert cpu["intra_op_threads"] == 1 and cpu["cores_available"] == 1 and cpu["wall_s"] > 0
    for contention in _contention(report):
        assert_not_blamed(contention)


def test_more_threads_than_cores_among_busy_processes_is_cpu_contention(tmp_path):
    cores = len(os.sched_getaffinity(0))
    spinning = [tmp_path / f"spinning-{n}" for n in range(cores)]  # readiness markers: each competitor runs
    busy = [subprocess.Popen([sys.executable, "-c", f"open({str(path)!r}, 'w').close()\nwhile True: pass"])
            for path in spinning]  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not all(path.exists() for path in spinning) and time.monotonic() < deadline:
            time.sleep(0.01)
        report = _run_alone(tmp_path, threads=2 * cores)
    finally:
        for process in busy:
            process.kill()
            process.wait()
    found = _contention(report)
    assert found, (str(report["capture"]["cpu"]), report["capture"]["step_signal"], report["steps"])
    evidence = found[0]["evidence"]
    assert evidence["intra_op_threads"] == 2 * cores and evidence["threads_asked"] == 2 * cores
    assert evidence["cores_available"] == cores
    assert evidence["waiting_pct"] >= 40 and evidence["wait_ms_per_step"] >= 1
    assert f"torch.set_num_threads({cores})" in found[0]["fix"]
