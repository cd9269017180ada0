"""skalpel's own work when the recording closes stays out of the last recorded step.

Closing, ``ProfileRun.step`` reads the CPU facts (/proc), writes the line samples into the
trace's header and checks for compiled code before ``prof.step()`` stops the profiler: all
inside the last ``ProfilerStep`` range. Under load that took 10 ms of a 0.5 ms step on the
PyTorch examples' regression script (hand-written SGD, steps marked by backward()), and the
report called the step 79% host work in "module level of main.py". The work runs in a range
of its own (``CLOSING_RANGE``) and the step ends where it begins. A real ``skalpel run``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest

from skalpel.analysis.steps import CLOSING_RANGE, segment_steps
from skalpel.trace.kinds import Kind
from skalpel.trace.loader import load_one

pytestmark = pytest.mark.slow

# The regression example's shape: no optimizer, no DataLoader, a loop at module level
SCRIPT = """
import torch
import torch.nn.functional as F
torch.manual_seed(0)
torch.set_num_threads(1)
fc = torch.nn.Linear(4, 1)
w = torch.randn(4, 1)
for _ in range(40):
    x = torch.randn(32, 4)
    y = x.mm(w)
    fc.zero_grad()
    output = F.smooth_l1_loss(fc(x), y)
    loss = output.item()
    output.backward()
    for param in fc.parameters():
        param.data.add_(-0.1 * param.grad)
"""


def test_the_last_recorded_step_ends_where_skalpels_closing_work_begins(tmp_path: Path) -> None:
    (tmp_path / "main.py").write_text(SCRIPT)
    done = subprocess.run([sys.executable, "-m", "skalpel", "run", "--out", str(tmp_path / "run"), "main.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    (path,) = (tmp_path / "run").glob("trace-rank0.json*")
    trace = load_one(path)
    closing = np.flatnonzero(trace.name == trace.name_id(CLOSING_RANGE))
    assert len(closing) == 1 and trace.kind[closing[0]] == Kind.USER_ANNOTATION
    began = float(trace.ts[closing[0]])
    markers = np.flatnonzero(trace.kind == Kind.STEP)
    last = markers[np.argmax(trace.ts[markers])]
    # recorded inside the last ProfilerStep range, as before: the range still holds it
    assert trace.ts[last] < began < trace.ts[last] + trace.dur[last]
    # skalpel's own work is no op of the user's: the op table leaves it out (it led regression's table, 2.7 ms)
    report = orjson.loads((tmp_path / "run" / "report.json").read_bytes())
    assert report["ranks"][0]["top_ops"] and CLOSING_RANGE not in [row["name"] for row in report["ranks"][0]["top_ops"]]
    steps = segment_steps(trace).steps
    assert len(steps) == 5  # the default capture's active steps: none lost to the cut
    assert steps[-1].host_end_us == pytest.approx(began) and steps[-1].end_us == pytest.approx(began)
    # the steps before it end where their ranges end
    for step in steps[:-1]:
        (marker,) = [index for index in markers if trace.ts[index] == step.host_start_us]
        assert step.host_end_us == pytest.approx(float(trace.ts[marker] + trace.dur[marker]))
