"""`skalpel run` leaves glibc's malloc as the script alone has it: the overhead's baseline is the script's own speed.

It once held the mmap threshold at 32 MiB for the whole run (so that the steps after the
window, whose threshold the profiler's frees had raised, ran like those before it); that
made every step 10-20% faster than the script ever runs alone. The baseline is now taken
before the recording, and nothing of the allocator is changed: the script asks glibc
(``mallinfo2``) whether a 4 MiB tensor made at its start was mmapped, and under
`skalpel run` it is, as it is when the script runs alone. No timing is asserted.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import skip_unless

pytestmark = pytest.mark.slow

SCRIPT = """
import ctypes
import torch
from torch import nn
class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
mallinfo2.restype = MallInfo2
before = mallinfo2().hblkhd
activation = torch.empty(2**20)  # 4 MiB
print("MAPPED", mallinfo2().hblkhd - before >= 4 * 2**20, flush=True)
del activation
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(14):
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(torch.randn(1024, 256)), torch.randint(0, 10, (1024,))).backward()
    optimizer.step()
"""


def _glibc_with_mallinfo2() -> bool:
    try:
        ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return False
    return True


@skip_unless(_glibc_with_mallinfo2(), "glibc 2.33+ only: the threshold is glibc's")
@pytest.mark.parametrize(("own_threshold", "held"), [(None, False), ("33554432", True)])
def test_malloc_is_left_as_the_script_alone_has_it(tmp_path, own_threshold, held):
    script = tmp_path / "activations.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    env.pop("MALLOC_MMAP_THRESHOLD_", None)
    if own_threshold:
        env["MALLOC_MMAP_THRESHOLD_"] = own_threshold
    command = [sys.executable, "-m", "skalpel", "run", "--warmup", "1", "--active", "4", "--out", str(tmp_path / "run"),
               str(script)]  # fmt: skip
    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"MAPPED {not held}" in done.stdout  # fresh pages as alone, or the heap where the user holds it
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert not [warning for warning in report["warnings"] if "mmap threshold" in warning]
    assert report["capture"]["baseline_steps"] == 2  # the wait and warm-up steps, before the recording
