"""Unequal steps: a step far longer than the others that holds far more ops (an epoch boundary, an evaluation
pass) is named and left out of the step statistics; a step as long with the same ops (a preempted one) stays. A partial
batch (the same ops on input shapes no other step ran) is named and left out too; varying sizes throughout stay.

The traces are written with the test builder and read by the real loader, segmentation and report.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from skalpel.analysis.steps import segment_steps
from skalpel.job.report_of import report_of_trace
from skalpel.result.report import Report
from skalpel.trace import load

from .tracebuilder import TraceBuilder

FETCH = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def _trace(tmp_path, steps: list[tuple[float, int, int]], compiling: int | None = None):
    """One CPU rank whose steps are (ms, ops, DataLoader fetches), back to back; step ``compiling`` compiles."""
    builder = TraceBuilder()
    builder.device_properties = []
    ts = 1000.0
    for number, (ms, ops, fetches) in enumerate(steps):
        builder.step(number, ts, ms * 1000)
        if number == compiling:
            builder.host("entire_frame_compile", ts + 1, ms * 1000 / 2, cat="user_annotation")
        slot = ms * 1000 / (ops + fetches + 1)
        for i in range(fetches):
            builder.host(FETCH, ts + (i + 0.5) * slot, slot / 2, cat="user_annotation")
        for i in range(ops):
            builder.host("aten::addmm", ts + (fetches + i + 0.5) * slot, slot / 2)
        ts += ms * 1000 + 1
    return load(builder.write(tmp_path / "trace.json"))


def test_an_epoch_boundary_is_named_and_kept_out_of_the_step_statistics(tmp_path):
    # step 4 holds a test pass over another loader: 40 more fetches, 7x the time
    trace = _trace(tmp_path, [(10, 10, 1)] * 4 + [(70, 60, 41)] + [(10, 10, 1)] * 3)
    segmentation = segment_steps(trace)
    assert [unequal.step.number for unequal in segmentation.unequal] == [4]
    assert [step.number for step in segmentation.steps] == [0, 1, 2, 3, 5, 6, 7]
    report = report_of_trace(trace)
    assert report.steps.count == 7 and report.steps.median_ms == pytest.approx(10.0, rel=0.01)
    assert report.steps.cv < 0.01  # without the boundary the steps are equal
    (note,) = [warning for warning in report.warnings if "step #4" in warning]
    assert "41 DataLoader batches against 1" in note and "epoch boundary" in note
    assert "7.0x the median step" in note and "costs 60.0 ms more than a step" in note
    assert "43% of the recorded time" in note  # 60 ms more, of 140 ms


def test_a_preempted_step_with_the_same_ops_stays(tmp_path):
    trace = _trace(tmp_path, [(10, 10, 1)] * 4 + [(70, 10, 1)] + [(10, 10, 1)] * 3)
    segmentation = segment_steps(trace)
    assert segmentation.unequal == () and len(segmentation.steps) == 8


def test_a_step_that_compiles_is_the_compile_rules_to_judge(tmp_path):
    trace = _trace(tmp_path, [(10, 10, 1)] * 4 + [(70, 60, 1)] + [(10, 10, 1)] * 3, compiling=4)
    assert segment_steps(trace).unequal == ()


def test_the_first_step_is_warm_ups_to_judge(tmp_path):
    # slower, with the step's own ops and some lazy initialisation (an optimizer's state made)
    trace = _trace(tmp_path, [(70, 14, 1)] + [(10, 10, 1)] * 7)
    assert segment_steps(trace).unequal == ()
    assert [finding.id for finding in report_of_trace(trace).findings if finding.id == "no_warmup"] == ["no_warmup"]


def _rollouts(tmp_path, steps: list[tuple[float, int, int]]):
    """One CPU rank whose steps are (ms, forward ops, backward ops), back to back."""
    builder = TraceBuilder()
    builder.device_properties = []
    ts = 1000.0
    for number, (ms, forward, backward) in enumerate(steps):
        builder.step(number, ts, ms * 1000)
        slot = ms * 1000 / (forward + backward + 1)
        for i in range(forward):
            builder.host("aten::addmm", ts + (i + 0.5) * slot, slot / 2)
        for i in range(backward):
            builder.host("autograd::engine::evaluate_function: AddmmBackward0", ts + (forward + i + 0.5) * slot, slot / 2)
        ts += ms * 1000 + 1
    return load(builder.write(tmp_path / "trace.json"))


def test_a_first_step_holding_a_rollout_is_named_not_taken_for_warm_up(tmp_path):
    # PPO: the rollout's 200 policy calls (forward only), then the update's minibatch steps (forward and backward)
    trace = _rollouts(tmp_path, [(130, 210, 5)] + [(5, 10, 5)] * 7)
    (unequal,) = segment_steps(trace).unequal
    assert unequal.step.number == 0
    report = report_of_trace(trace)
    (note,) = [warning for warning in report.warnings if "step #0" in warning]
    assert "no more backward work (5 backward ops against 5)" in note and "an RL rollout" in note
    assert "an evaluation, a checkpoint" not in note
    assert not [finding for finding in report.findings if finding.id == "no_warmup"]
    assert report.steps.count == 7


def test_rollouts_in_a_third_of_the_steps_are_no_warm_up_either(tmp_path):
    # a short update: the rollout comes back within the window, so the steps are how the loop is, none apart
    trace = _rollouts(tmp_path, [(130, 210, 5), (5, 10, 5), (5, 10, 5), (130, 210, 5), (5, 10, 5), (5, 10, 5)])
    assert segment_steps(trace).unequal == ()
    assert not [finding for finding in report_of_trace(trace).findings if finding.id == "no_warmup"]


def test_steps_that_are_all_unequal_are_how_the_loop_is(tmp_path):
    # every other step is long: a loop of two kinds of iteration, not boundaries
    trace = _trace(tmp_path, [(10, 10, 1), (70, 60, 1)] * 4)
    assert segment_steps(trace).unequal == ()


def test_work_without_more_batches_is_named_as_such(tmp_path):
    trace = _trace(tmp_path, [(10, 10, 1)] * 4 + [(50, 40, 1)] + [(10, 10, 1)] * 3)
    (unequal,) = segment_steps(trace).unequal
    assert "DataLoader batches" not in unequal.describe()
    assert "an evaluation, a checkpoint" in unequal.describe()


def _batches(tmp_path, rows: list[int], ms: list[float]):
    """One CPU rank whose steps run the same ops on batches of ``rows`` rows (recorded shapes), in ``ms`` each."""
    builder = TraceBuilder()
    builder.device_properties = []
    ts = 1000.0
    for number, (batch, took) in enumerate(zip(rows, ms)):
        builder.step(number, ts, took * 1000)
        builder.host(FETCH, ts + 1, 10, cat="user_annotation")
        slot = took * 1000 / 12
        for i in range(10):  # forward and backward on the batch: its rows in every op's input shapes
            builder.host("aten::addmm", ts + (i + 1) * slot, slot / 2, **{"Input Dims": [[16], [batch, 16], [16, 16]]})
        builder.host("aten::add_", ts + 11 * slot, slot / 2, **{"Input Dims": [[16, 16], [16, 16]]})  # the optimizer
        ts += took * 1000 + 1
    return load(builder.write(tmp_path / "trace.json"))


def test_a_partial_last_batch_is_named_and_kept_out_of_the_step_statistics(tmp_path):
    # the DataLoader's last batch holds 20 rows against 128: the same ops, on other shapes, in less time
    trace = _batches(tmp_path, [128] * 5 + [20], [10.0] * 5 + [2.0])
    segmentation = segment_steps(trace)
    assert [unequal.step.number for unequal in segmentation.unequal] == [5]
    assert [step.number for step in segmentation.steps] == [0, 1, 2, 3, 4]
    report = report_of_trace(trace)
    assert report.steps.count == 5 and report.steps.median_ms == pytest.approx(10.0, rel=0.01)
    (note,) = [warning for warning in report.warnings if "step #5" in warning]
    assert "partial batch" in note and "91% of its ops on input shapes no other step ran" in note  # 10 of 11
    assert "takes 8.0 ms less than a step" in note


def test_batches_of_varying_size_are_how_the_loop_is(tmp_path):
    # sequences of their own length in every batch: no step is the odd one
    trace = _batches(tmp_path, [128, 96, 112, 80, 128, 64], [10.0, 8.0, 9.0, 7.0, 10.0, 6.0])
    assert segment_steps(trace).unequal == ()


def test_full_batches_throughout_stay(tmp_path):
    trace = _batches(tmp_path, [128] * 6, [10.0, 10.0, 12.0, 10.0, 10.0, 9.0])
    assert segment_steps(trace).unequal == () and len(segment_steps(trace).steps) == 6


LAST_BATCH = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.set_num_threads(1)
torch.manual_seed(0)
data = TensorDataset(torch.randn(64 * 7 + 8, 32), torch.randn(64 * 7 + 8, 1))  # 7 batches of 64, then one of 8
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(3):
    for x, y in DataLoader(data, batch_size=64):
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
"""


@pytest.mark.slow
def test_a_real_runs_partial_last_batch_is_named(tmp_path):
    """`skalpel run` over a DataLoader whose last batch is smaller, inside the window: named, not counted."""
    script = tmp_path / "last_batch.py"
    script.write_text(LAST_BATCH)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    command = [sys.executable, "-m", "skalpel", "run", "--warmup", "1", "--active", "8", "--out", str(tmp_path / "run"),
               str(script)]  # fmt: skip
    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = Report.from_json((tmp_path / "run" / "report.json").read_bytes())
    (note,) = [warning for warning in report.warnings if "partial batch" in warning]
    assert note.startswith("step #") and "input shapes no other step ran" in note
    # a smaller batch usually takes less than a step, but its time follows the machine's load (4.0 ms against a
    # 3.9 ms median under two busy loops): the note says which, and the shapes, not the time, name it
    assert ("ms less than a step" in note) != ("ms more than a step" in note), note
    assert report.steps.count == 7  # the 8 recorded, less the partial one
