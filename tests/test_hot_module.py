"""hot_module: a module of the user's whose own chain of small ops holds the step, from real torch.profiler runs.

The planted case is the shape of makemore's ``NewGELU``: GELU's tanh approximation written out by hand
(``0.5 * x * (1 + tanh(c * (x + 0.044715 * x**3))))``) between two Linear layers, so that the chain's mul, add,
tanh and pow together hold the step while no single op does. Its look-alikes stay quiet: the same module calling
torch's fused ``F.gelu`` (one op: nothing to fuse), and torch's own ``nn.GELU`` (a library module).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from skalpel.api import analyze

BATCH, WIDTH, HIDDEN = 256, 64, 1024


def _model(kind: str):
    import torch
    from torch import nn
    from torch.nn import functional as F

    class HandGELU(nn.Module):
        def forward(self, x):
            if kind == "fused":
                return F.gelu(x, approximate="tanh")
            return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))

    act = nn.GELU(approximate="tanh") if kind == "library" else HandGELU()
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(WIDTH, HIDDEN), act, nn.Linear(HIDDEN, WIDTH))


def _report(tmp_path_factory, kind: str):
    import torch

    torch.set_num_threads(1)
    model = _model(kind)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs = torch.randn(BATCH, WIDTH)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                with_stack=True) as prof:  # fmt: skip
        for _ in range(6):
            optimizer.zero_grad()
            model(inputs).pow(2).mean().backward()
            optimizer.step()
            prof.step()
    path = tmp_path_factory.mktemp("hot_module") / f"trace-{kind}.json"
    prof.export_chrome_trace(str(path))
    return analyze(path)


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    return {kind: _report(tmp_path_factory, kind) for kind in ("chain", "fused", "library")}


def _found(report, finding_id: str):
    return [finding for finding in report.findings if finding.id == finding_id]


def test_a_hand_written_gelu_chain_is_named_with_the_fused_op_and_its_line(reports) -> None:
    (finding,) = _found(reports["chain"], "hot_module")
    evidence = finding.evidence
    assert evidence["module"].endswith("HandGELU") and evidence["instances"] == 1
    assert {"aten::tanh", "aten::pow"} <= set(evidence["ops"]) and len(evidence["ops"]) >= 2
    assert evidence["share_pct"] >= 15.0 and evidence["ms_per_step"] > 0
    assert "approximate='tanh'" in evidence["fused_op"] and "approximate='tanh'" in finding.fix
    assert finding.locations and Path(__file__).name in finding.locations[0]  # the module's forward
    assert not _found(reports["chain"], "hot_op")  # no single op holds it


def test_the_fused_op_and_the_library_module_stay_quiet(reports) -> None:
    assert not _found(reports["fused"], "hot_module")  # one op in the module: nothing to fuse
    assert not _found(reports["library"], "hot_module")  # torch's own module: not the user's chain


def test_a_trace_without_module_frames_is_left_alone(tmp_path) -> None:
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            _model("chain")(torch.randn(8, WIDTH)).sum().backward()
            prof.step()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    report = analyze(path)
    assert not _found(report, "hot_module")
    assert not [finding for finding in report.findings if "hot_module" in finding.title]  # not a rule error either


def _stalled_run(tmp_path: Path, stalled_steps: set[int]):
    """A real profile of ten steps (one warm-up, nine recorded): two Linear layers, then a module of the user's with
    two small ops of its own (``x * 2 + 1`` on the narrow output); in ``stalled_steps`` its forward is held 60 ms (as
    the scheduler holds a process off its core beside busy loops; a sleep plants it)."""
    import time

    import torch
    from torch import nn

    step = {"number": 0}

    class Rescale(nn.Module):
        def forward(self, x):
            if step["number"] in stalled_steps:
                time.sleep(0.06)
            return x * 2.0 + 1.0

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(WIDTH, HIDDEN), nn.Linear(HIDDEN, WIDTH), Rescale())  # Rescale ~1% of a step
    inputs = torch.randn(BATCH, WIDTH)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path / f"trace-{len(stalled_steps)}.json"
    schedule = torch.profiler.schedule(wait=0, warmup=1, active=9, repeat=1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], with_stack=True, schedule=schedule,
                                on_trace_ready=lambda done: done.export_chrome_trace(str(path))) as prof:  # fmt: skip
        for number in range(10):
            step["number"] = number
            optimizer.zero_grad()
            model(inputs).pow(2).mean().backward()
            optimizer.step()
            prof.step()
    return analyze(path)


def test_a_module_held_up_in_one_step_of_six_does_not_hold_the_step(tmp_path) -> None:
    """One 60 ms stall in Rescale in one of the nine recorded steps is much of the window's time, but the typical
    step spends little in Rescale: no hot_module (nine steps: beside busy loops the scheduler stalls Rescale in a
    step or two more by itself, and the median holds). Twin: the same stall in every recorded step holds the step,
    and is named."""
    report = _stalled_run(tmp_path, {5})
    assert not _found(report, "hot_module"), [f.title for f in report.findings]
    (held,) = _found(_stalled_run(tmp_path, set(range(1, 10))), "hot_module")
    assert held.evidence["module"].endswith("Rescale") and held.evidence["share_pct"] >= 50.0
