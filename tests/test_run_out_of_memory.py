"""A script that runs out of memory under `skalpel run`: the trace kept and analysed, the report saying what held the
memory, the exit status the script's.

The script limits its own address space (RLIMIT_AS, as ``ulimit -v`` does) to what it uses plus a margin, then keeps
every step's output and graph alive until torch's CPU allocator fails (or, ``--python``, asks Python for a TiB at
step 9); skalpel runs it in its process, so the limit holds for skalpel's own writing and analysis of the trace too.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from skalpel.capture.oom import is_out_of_memory

SCRIPT = textwrap.dedent(
    """
    import resource, sys
    import torch
    from torch import nn

    torch.set_num_threads(1)


    def address_space():
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))


    resource.setrlimit(resource.RLIMIT_AS, (address_space() + 900 * 2**20, resource.RLIM_INFINITY))
    model = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    kept = []
    for step in range(1000):
        optimizer.zero_grad()
        out = model(torch.randn(2048, 512))
        python = sys.argv[1:] == ["--python"]
        if not python:
            kept.append(out)  # PLANTED: every step's output, and its graph's activations, kept alive
        out.sum().backward(retain_graph=True)
        if python and step == 9:
            kept.append(bytearray(2**40))  # Python's own MemoryError (a TiB, past the limit), not torch's
        optimizer.step()
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("variant", [(), ("--python",)], ids=["torch-allocator", "python-memoryerror"])
def test_an_out_of_memory_script_is_reported_with_what_held_memory(tmp_path, variant):
    script = tmp_path / "leaky_train.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, "-m", "skalpel", "run", "--out", str(tmp_path / "run"), str(script),
                           *variant], capture_output=True, text=True, timeout=600, cwd=tmp_path)  # fmt: skip
    expected = "MemoryError" if variant else "can't allocate memory"
    assert expected in done.stderr, done.stderr[-3000:]
    assert done.returncode == 1, done.stderr[-3000:]  # the script's own status: an uncaught exception
    assert "the script stopped with" in done.stderr and "leaky_train.py" in done.stderr  # its traceback, shown
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    (note,) = [w for w in report["warnings"] if "ran out of memory" in w]
    assert "RLIMIT_AS" in note and "the trace of the" in note
    assert "what held memory at the recorded window's peak" in note and "activation" in note
    assert "to make room" in note
    split = report["capture"]["memory_split"]
    assert sum(part["bytes"] for part in split["categories"]) == split["peak_bytes"] > 0
    assert report["capture"]["exit_status"] == 1 and report["steps"]["count"] >= 1


class OutOfMemoryError(RuntimeError):
    """Named as torch's is (torch.OutOfMemoryError, torch.cuda.OutOfMemoryError)."""


@pytest.mark.parametrize(
    ("error", "is_oom"),
    [
        (MemoryError(), True),
        (OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
        (RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory"), True),
        (RuntimeError("HIP out of memory. Tried to allocate 20.00 MiB"), True),
        (RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x3 and 4x5)"), False),
        (ValueError("out of memory"), False),
        (None, False),
    ],
)
def test_what_counts_as_out_of_memory(error, is_oom):
    assert is_out_of_memory(error) is is_oom
