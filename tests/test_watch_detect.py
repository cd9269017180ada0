"""The online anomaly judge on made-up step series (no run): each kind at its step, its look-alike quiet."""

from __future__ import annotations

import random

import pytest

from skalpel.cli import main
from skalpel.watching.detect import KINDS, Detector, Sample

MIB = 2**20


def _run(count: int, wall=lambda step: 0.010, loader=lambda step: 0.0, memory=lambda step: 500 * MIB,
         judged=lambda step: True, seed: int = 0):  # fmt: skip
    noise = random.Random(seed)
    detector = Detector(memory_limit=8 * 2**30)
    found = []
    clock = 0.0
    for step in range(1, count + 1):
        seconds = wall(step) * (1 + noise.uniform(-0.05, 0.05)) + loader(step)
        clock += seconds
        found += detector.feed(Sample(step, clock, seconds, loader(step), memory(step) + noise.randrange(MIB),
                                      judged=judged(step)))  # fmt: skip
    return found


def test_a_steady_loop_with_noise_gives_nothing() -> None:
    assert _run(3000) == []


def test_a_2x_slowdown_is_one_level_shift_near_its_step_and_no_drift_after() -> None:
    found = _run(3000, wall=lambda step: 0.020 if step >= 2500 else 0.010)
    assert [(anomaly.kind, abs(anomaly.step - 2500) <= 30) for anomaly in found] == [("level_shift", True)]
    assert "2.0" in found[0].message or "1.9" in found[0].message


def test_one_slow_step_is_a_spike_and_a_slightly_slow_one_is_not() -> None:
    found = _run(1000, wall=lambda step: 0.200 if step == 700 else (0.014 if step == 800 else 0.010))
    assert [(anomaly.kind, anomaly.step) for anomaly in found] == [("step_spike", 700)]


def test_a_slow_creep_is_drift_not_a_shift() -> None:
    found = _run(4000, wall=lambda step: 0.010 * (1 + step / 8000))
    kinds = {anomaly.kind for anomaly in found}
    assert kinds == {"slow_drift"}


def test_a_loader_stall_is_said_once_at_its_first_step_and_not_as_a_slower_step() -> None:
    found = _run(2000, loader=lambda step: 0.080 if 1500 <= step < 1600 else 0.0)
    assert [(anomaly.kind, anomaly.step) for anomaly in found] == [("dataloader_stall", 1500)]


def test_an_epoch_start_of_one_slow_batch_is_no_stall() -> None:
    assert _run(2000, loader=lambda step: 0.5 if step % 500 == 0 else 0.0) == []


def test_a_leak_is_one_creep_near_its_start_with_the_time_to_the_limit() -> None:
    found = _run(3000, memory=lambda step: 500 * MIB + max(0, step - 2000) * MIB)
    assert [anomaly.kind for anomaly in found] == ["memory_creep"]
    assert 2000 <= found[0].step <= 2010, found[0].step  # its start, not the window's (WATCH_WINDOW_STEPS)
    assert "the limit (8.0 GiB) is reached in" in found[0].message


def _h200_leak(step: int) -> float:
    """CUDA allocated as the H200 watch run's store had it: flat at 417 MiB, a 92 MiB dip over steps 100-129 and a
    slow rise to step 141 (readings interpolated between a low point within a step and one after the leak began),
    then 30 MiB kept every step; the window is first judged at step 288, 200 steps in."""
    if step < 100:
        return 417 * MIB
    if step < 129:
        return (417 - 92 * (step - 100) / 29) * MIB
    if step < 141:
        return (325 + 10 * (step - 129)) * MIB
    return (445 + 30 * (step - 141)) * MIB


def test_a_leak_found_late_is_dated_where_it_left_the_baseline_for_good() -> None:
    """The creep's step is where the window leaves its first quarter's range for good. The first value above that
    quarter's median was the window's first step: the H200 run said step 88 for a leak that began at 130-141."""
    found = _run(600, memory=_h200_leak)
    assert [anomaly.kind for anomaly in found] == ["memory_creep"]
    assert 129 <= found[0].step <= 145, found[0].step


def test_a_one_time_jump_in_memory_is_no_creep() -> None:
    assert _run(3000, memory=lambda step: 500 * MIB + (400 * MIB if step >= 1500 else 0)) == []


def test_the_steps_of_a_capture_are_not_judged() -> None:
    capture = range(1000, 1015)
    found = _run(2000, wall=lambda step: 0.300 if step in capture else 0.010, judged=lambda step: step not in capture)
    assert found == []


@pytest.mark.parametrize("kind", KINDS)
def test_explain_documents_every_kind(kind: str, capsys) -> None:
    assert main(["explain", kind]) == 0
    out = capsys.readouterr().out
    assert kind in out and "skalpel watch" in out and "fires at:" in out


def test_explain_lists_the_kinds(capsys) -> None:
    assert main(["explain"]) == 0
    out = capsys.readouterr().out
    assert all(kind in out for kind in KINDS)


def test_once_the_script_uses_cuda_its_allocated_memory_is_judged_against_the_device() -> None:
    detector = Detector(memory_limit=64 * 2**30)
    clock, found = 0.0, []
    for step in range(1, 3001):
        if step == 1000:
            detector.use_device_memory(80 * 2**30)  # what the store does at the first row with CUDA memory
        clock += 0.01
        memory = 300 * MIB if step < 1000 else 2**30 + max(0, step - 2000) * MIB
        found += detector.feed(Sample(step, clock, 0.01, 0.0, memory))
    assert [anomaly.kind for anomaly in found] == ["memory_creep"]  # not the jump from RSS to the device's bytes
    assert found[0].message.startswith("CUDA allocated grew") and "the limit (80.0 GiB)" in found[0].message
