"""skalpel's instrumentation stays out of the user's compiled code.

skalpel marks steps with torch's global module hooks while module calls may still mark them. torch.compile sees
global hooks: Dynamo traces ``Module.__call__`` with them instead of the forward, and every call of a
``torch.compile(module)`` warned "Using `torch.compile(module)` when there are global hooks on modules", ten times
on a script that registers none. Now skalpel removes them when the script first calls ``torch.compile``, before
Dynamo traces anything. Each test runs a real script with and without `skalpel run` (backend: the eager one,
recording each graph's ops, so nothing is generated or cached): the script's stderr has no such warning, and its
compile facts (the graphs and their ops, the graph count, graph breaks) are the same with skalpel as without.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from skalpel.result.report import Report

pytestmark = pytest.mark.slow

COMPILED = """
import json
import sys
import torch
from torch import nn
from torch._dynamo.utils import counters
torch.set_num_threads(1)
torch.manual_seed(0)
how = sys.argv[1]
graphs = []

def backend(graph_module, example_inputs):  # the eager backend, recording each graph's ops
    graphs.append([str(node.target) for node in graph_module.graph.nodes
                   if node.op in ("call_function", "call_method", "call_module")])
    return graph_module.forward

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden, self.out = nn.Linear(32, 64), nn.Linear(64, 1)

    def forward(self, x):
        return self.out(torch.relu(self.hidden(x)))

model = Net()
if how == "module.compile":
    model.compile(backend=backend)
    compiled = model
elif how == "function":  # a compiled function that calls the model: Dynamo inlines the module call
    compiled = torch.compile(lambda x: model(x) * 2, backend=backend)
else:
    compiled = torch.compile(model, backend=backend)
if how != "inference":
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(12):
        optimizer.zero_grad()
        compiled(torch.randn(16, 32)).pow(2).mean().backward()
        optimizer.step()
with torch.no_grad():
    for _ in range(3 if how != "inference" else 14):
        compiled(torch.randn(16, 32))
facts = {"graphs": graphs, "stats": dict(counters["stats"]), "graph_breaks": sum(counters["graph_break"].values())}
print("compile facts:", json.dumps(facts, sort_keys=True), flush=True)
"""


def _facts(stdout: str) -> dict:
    (line,) = [line for line in stdout.splitlines() if line.startswith("compile facts: ")]
    return json.loads(re.sub(r" at 0x[0-9a-f]+", "", line.removeprefix("compile facts: ")))  # function addresses


@pytest.mark.parametrize("how", ["torch.compile", "module.compile", "function", "inference"])
def test_compiled_code_and_its_warnings_are_the_same_with_and_without_skalpel(tmp_path: Path, how: str) -> None:
    script = tmp_path / "compiled_train.py"
    script.write_text(COMPILED)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    plain = subprocess.run([sys.executable, str(script), how], env=env, cwd=tmp_path, capture_output=True, text=True,
                           timeout=600)  # fmt: skip
    assert plain.returncode == 0, plain.stderr[-3000:]
    out = tmp_path / "run"
    profiled = subprocess.run([sys.executable, "-m", "skalpel", "run", "--out", str(out), str(script), how], env=env,
                              cwd=tmp_path, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert profiled.returncode == 0, profiled.stderr[-3000:]
    assert "global hooks" not in plain.stderr  # the script registers none
    assert "global hooks" not in profiled.stderr, profiled.stderr[-3000:]
    facts = _facts(profiled.stdout)
    assert facts == _facts(plain.stdout)
    assert facts["graphs"] and facts["graph_breaks"] == 0
    report = Report.from_json((out / "report.json").read_bytes())
    assert report.steps.marked and report.steps.count == 5  # skalpel still marks the steps
    signal = report.capture.step_signal or ""
    assert ("module" in signal) if how == "inference" else ("optimizer" in signal), signal
