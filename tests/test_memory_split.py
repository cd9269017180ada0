"""The memory peak split by category and module (capture/memory_split.py) and activations_dominate_peak on it.

Real `skalpel run`s of a small transformer on the CPU (examples/scenarios/activations_peak.py), the same with
its blocks checkpointed by hand (``--checkpoint``: the finding's fix), and an inference look-alike whose peak is
its weights; the rule's thresholds on splits built by hand.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from skalpel.capture import memory_split
from skalpel.diagnose.peak import ACTIVATIONS_DOMINATE_PEAK, OPTIMIZER_STATE_DOMINATES_PEAK, checkpoint_saving
from skalpel.diagnose.rule import JobContext, NotJudged
from skalpel.result.memory_split import CategoryBytes, MemorySplit, ModuleActivations
from skalpel.result.report import CaptureInfo, capture_from_dict

from .conftest import REPO, corpus

SCENARIOS = REPO / "examples" / "scenarios"
MIB = 2**20


def _run(out: Path, script: str, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    log = open(out.parent / f"{out.name}.log", "wb")
    active = "1" if "--evaluate" in args else "2"  # its steps hold twice the events: two stay under the categoriser's
    command = [sys.executable, "-m", "skalpel", "run", "--active", active, "--out", str(out), str(SCENARIOS / script)]
    return subprocess.Popen([*command, *args], cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("split")
    plan = {"planted": ("activations_peak.py",), "checkpointed": ("activations_peak.py", "--checkpoint"),
            "inference": ("inference_weights.py",), "adam": ("optimizer_state_peak.py",),
            "momentum": ("optimizer_state_peak.py", "--momentum"),
            "sgd": ("optimizer_state_peak.py", "--sgd"),
            "late_zero": ("activations_peak.py", "--late-zero"),
            "evaluate": ("activations_peak.py", "--evaluate")}  # fmt: skip
    started = {name: _run(root / name, *args) for name, args in plan.items()}
    reports = {}
    for name, process in started.items():
        assert process.wait(timeout=900) == 0, (root / f"{name}.log").read_text()[-3000:]
        reports[name] = json.loads((root / name / "report.json").read_text())
    return reports


def _finding(report: dict, finding_id: str) -> dict:
    (found,) = [f for f in report["findings"] if f["id"] == finding_id]
    return found


@pytest.mark.slow
def test_the_split_adds_up_to_the_profilers_peak(runs):
    report = runs["planted"]
    split = report["capture"]["memory_split"]
    assert sum(part["bytes"] for part in split["categories"]) == split["peak_bytes"]
    # the CPU trace counts from the recording's start: what was held before it (weights, Adam's state) is not in it
    measured = report["ranks"][0]["memory"]["peak_bytes"]
    assert abs(split["peak_bytes"] - split["held_before_bytes"] - measured) <= 0.01 * measured
    by_category = {part["category"]: part["bytes"] for part in split["categories"]}
    assert max(by_category, key=by_category.get) == "activation"
    assert by_category["parameter"] > 0 and by_category["optimizer_state"] > by_category["parameter"]  # AdamW: 2x
    assert split["phase"] == "backward"  # the peak: the whole forward's activations, when backward starts
    top = split["activation_modules"][0]
    assert top["module"] == "Block" and top["calls"] == 4
    assert top["location"].endswith("activations_peak.py:34 in forward")
    assert sum(m["bytes"] for m in split["activation_modules"]) == by_category["activation"]
    # the curve over the window: its highest row is the peak, with the same split
    highest = max(split["curve"], key=lambda row: sum(row[1:]))
    assert abs(sum(highest[1:]) - split["peak_bytes"] / MIB) < 0.01
    at_peak = dict(zip(split["curve_categories"], highest[1:]))
    assert abs(at_peak["activation"] - by_category["activation"] / MIB) < 0.01
    assert len(split["curve"]) >= 20 and split["curve"] == sorted(split["curve"])


@pytest.mark.slow
def test_a_window_opened_between_forward_and_backward_holds_no_phantom_activations(runs):
    # zero_grad() after the forward opens the window while that forward's activations are held; the CPU allocator
    # reports no free of them, so before they were counted to the window's end (the peak grew by a forward's worth)
    planted, late = runs["planted"]["capture"]["memory_split"], runs["late_zero"]["capture"]["memory_split"]
    assert abs(late["peak_bytes"] - planted["peak_bytes"]) <= 0.05 * planted["peak_bytes"]
    by_category = {part["category"]: part["bytes"] for part in late["categories"]}
    assert by_category.get("input", 0) < 1 * MIB  # the previous forward's activations, categorised as inputs
    assert max(by_category, key=by_category.get) == "activation"
    claimed = _finding(runs["late_zero"], "activations_dominate_peak")["evidence"]["saving_mib"]
    planted_claim = _finding(runs["planted"], "activations_dominate_peak")["evidence"]["saving_mib"]
    assert abs(claimed - planted_claim) < 0.1 * planted_claim


@pytest.mark.slow
def test_a_no_grad_evaluation_at_the_peak_is_no_activation(runs):
    # torch's categoriser calls every forward tensor derived from the inputs an activation, a no_grad forward's too;
    # none is read by a backward, and checkpointing cannot free them: temporaries
    split = runs["evaluate"]["capture"]["memory_split"]
    by_category = {part["category"]: part["bytes"] for part in split["categories"]}
    assert split["peak_bytes"] > runs["planted"]["capture"]["memory_split"]["peak_bytes"]  # the peak is the eval's
    assert by_category.get("activation", 0) < 0.1 * split["peak_bytes"]
    assert max(by_category, key=by_category.get) == "temporary"
    assert not [f for f in runs["evaluate"]["findings"] if f["id"] == "activations_dominate_peak"]
    # the training window's own activations are still activations (read by its backward)
    planted = {part["category"]: part["bytes"] for part in runs["planted"]["capture"]["memory_split"]["categories"]}
    assert planted["activation"] > 0.5 * runs["planted"]["capture"]["memory_split"]["peak_bytes"]


@pytest.mark.slow
def test_checkpointing_the_named_module_saves_what_the_finding_claims(runs):
    found = _finding(runs["planted"], "activations_dominate_peak")
    evidence = found["evidence"]
    assert evidence["module"] == "Block" and evidence["share_pct"] >= 50
    assert found["locations"][0].endswith("activations_peak.py:34 in forward")
    assert "torch.utils.checkpoint.checkpoint(block" in found["fix"]
    before = runs["planted"]["capture"]["memory_split"]["peak_bytes"]
    after = runs["checkpointed"]["capture"]["memory_split"]["peak_bytes"]
    drop_mib = (before - after) / MIB
    assert drop_mib >= 0.9 * evidence["saving_mib"], (drop_mib, evidence["saving_mib"])
    # the trace's own peaks (the profiler's memory events) drop as much
    measured = [runs[name]["ranks"][0]["memory"]["peak_bytes"] for name in ("planted", "checkpointed")]
    assert (measured[0] - measured[1]) / MIB >= 0.9 * evidence["saving_mib"]
    assert not [f for f in runs["checkpointed"]["findings"] if f["id"] == "activations_dominate_peak"]


@pytest.mark.slow
def test_the_html_page_draws_the_split(runs):
    from skalpel.report.html import render
    from skalpel.result.report import Report

    page = render(Report.from_dict(runs["planted"]))
    assert "memory peak on cpu by category" in page and "activations by module: Block (4 calls" in page
    assert 'aria-label="memory on cpu by category"' in page  # the categories over the window, stacked


@pytest.mark.slow
def test_inference_whose_peak_is_its_weights_stays_quiet(runs):
    report = runs["inference"]
    split = report["capture"]["memory_split"]
    assert split["categories"][0]["category"] == "parameter"
    assert split["categories"][0]["bytes"] >= 64 * MIB
    assert not [f for f in report["findings"] if f["id"] == "activations_dominate_peak"]


@pytest.mark.slow
def test_adams_state_is_named_and_a_one_value_state_saves_the_claim(runs):
    found = _finding(runs["adam"], "optimizer_state_dominates_peak")
    evidence = found["evidence"]
    assert evidence["phase"] == "optimizer" and evidence["share_pct"] >= 40
    assert 1.5 <= evidence["state_per_parameter"] <= 2.1  # two moments per parameter (and Adam's step counts)
    assert "SGD with momentum" in found["fix"]
    # the fix applied by hand: SGD with momentum keeps one value per parameter
    before, after = (runs[name]["capture"]["memory_split"] for name in ("adam", "momentum"))
    assert (before["peak_bytes"] - after["peak_bytes"]) / MIB >= 0.9 * evidence["one_value_saving_mib"]
    for quiet in ("momentum", "sgd"):  # a third of the peak; no state at all
        assert not [f for f in runs[quiet]["findings"] if f["id"] == "optimizer_state_dominates_peak"]
    assert not [f for f in runs["planted"]["findings"] if f["id"] == "optimizer_state_dominates_peak"]


def _split(*, activation: int, other: int, modules: tuple[ModuleActivations, ...]) -> MemorySplit:
    categories = (CategoryBytes("activation", activation), CategoryBytes("parameter", other))
    return MemorySplit(device="cuda:0", peak_bytes=activation + other, held_before_bytes=other, phase="backward",
                       categories=categories, activation_modules=modules, step_span=2)  # fmt: skip


def _judge(split: MemorySplit | None):
    capture = CaptureInfo(warmup_steps=3, active_steps=2, memory_split=split)
    return ACTIVATIONS_DOMINATE_PEAK.check(JobContext(analyses=None, capture=capture), ACTIVATIONS_DOMINATE_PEAK)


BLOCKS = ModuleActivations(module="Layer", location="model.py:10 in forward", bytes=800 * MIB, calls=8,
                           largest_call_bytes=100 * MIB, output_bytes=80 * MIB)  # fmt: skip


def test_the_saving_leaves_the_outputs_and_one_recomputed_call():
    assert checkpoint_saving(BLOCKS) == (800 - 80 - 100) * MIB
    (found,) = _judge(_split(activation=800 * MIB, other=200 * MIB, modules=(BLOCKS,)))
    assert found.id == "activations_dominate_peak" and found.evidence["saving_mib"] == 620
    assert found.locations == ("model.py:10 in forward",) and found.evidence["share_pct"] == 80


@pytest.mark.parametrize(
    ("activation", "other", "modules"),
    [
        (400 * MIB, 600 * MIB, (BLOCKS,)),  # activations below half the peak
        (12 * MIB, 2 * MIB, (BLOCKS,)),  # most of a small peak: under the floor
        (800 * MIB, 200 * MIB, (ModuleActivations("Net", "m.py:3 in forward", 800 * MIB, 1, 800 * MIB, 8 * MIB),)),
        (800 * MIB, 200 * MIB, (ModuleActivations("Layer", "m.py:3 in forward", 800 * MIB, 8, 700 * MIB, 90 * MIB),)),
    ],
    ids=["small-share", "under-floor", "one-call-only", "saving-too-small"],
)
def test_quiet_where_checkpointing_would_not_pay(activation, other, modules):
    assert _judge(_split(activation=activation, other=other, modules=modules)) == []


def test_a_state_of_one_value_per_parameter_claims_no_saving():
    categories = (CategoryBytes("optimizer_state", 500 * MIB), CategoryBytes("parameter", 400 * MIB))
    split = MemorySplit(device="cuda:0", peak_bytes=900 * MIB, held_before_bytes=900 * MIB, phase="optimizer",
                        categories=categories, activation_modules=(), step_span=2)  # fmt: skip
    capture = CaptureInfo(warmup_steps=3, active_steps=2, memory_split=split)
    rule = OPTIMIZER_STATE_DOMINATES_PEAK
    (found,) = rule.check(JobContext(analyses=None, capture=capture), rule)
    assert found.id == "optimizer_state_dominates_peak" and found.evidence["one_value_saving_mib"] == 0
    assert "shard" in found.fix and "SGD" not in found.fix
    smaller = dataclasses.replace(split, categories=(CategoryBytes("optimizer_state", 300 * MIB),
                                                     CategoryBytes("parameter", 600 * MIB)))  # fmt: skip
    assert rule.check(JobContext(analyses=None, capture=CaptureInfo(3, 2, memory_split=smaller)), rule) == []


def test_not_judged_without_a_split():
    outcome = _judge(None)
    assert isinstance(outcome, NotJudged) and "skalpel run" in outcome.reason


def test_the_split_reads_back_from_the_report_json():
    split = _split(activation=800 * MIB, other=200 * MIB, modules=(BLOCKS,))
    capture = CaptureInfo(warmup_steps=3, active_steps=2, memory_split=split)
    again = capture_from_dict(json.loads(json.dumps(dataclasses.asdict(capture))))
    assert again.memory_split == split
    assert "activation 800.0 MiB (80%)" in split.lines()[0]


def test_a_large_window_is_left_unsplit_and_said(monkeypatch):
    import torch
    model = torch.nn.Linear(64, 64)
    with torch.profiler.profile(profile_memory=True, record_shapes=True, with_stack=True) as prof:
        model(torch.randn(8, 64)).sum().backward()
    monkeypatch.setattr(memory_split, "MOST_EVENTS", 5)
    with pytest.raises(memory_split.NotSplit, match="more than the 5 the categoriser is run on"):
        memory_split.split_at_peak(prof, steps=1)
    with torch.profiler.profile(profile_memory=True, record_shapes=True) as bare:
        model(torch.randn(8, 64))
    with pytest.raises(memory_split.NotSplit, match="without with_stack"):
        memory_split.split_at_peak(bare, steps=1)


def test_a_split_of_some_seconds_is_announced_and_a_short_one_is_not(monkeypatch):
    import torch
    model = torch.nn.Linear(64, 64)
    with torch.profiler.profile(profile_memory=True, record_shapes=True, with_stack=True) as prof:
        model(torch.randn(8, 64)).sum().backward()
    heard: list[str] = []
    memory_split.split_at_peak(prof, steps=1, say=heard.append)
    assert heard == []  # a few hundred events: no line
    monkeypatch.setattr(memory_split, "SAY_FROM_EVENTS", 5)
    memory_split.split_at_peak(prof, steps=1, say=heard.append)
    (line,) = heard
    events = len(prof.profiler.kineto_results.events())
    assert line.startswith(f"splitting the memory peak by category ({events:,} profiler events, about ")


# ---- reserved_far_above_allocated, on real GPU traces --------------------------------------------------------------


def _analyze(relative: str) -> list:
    from skalpel.api import analyze

    return list(analyze(corpus(relative), workers=1).findings)


def test_a_reserve_twice_the_allocated_peak_is_named():
    """HTA's df_index_resolver trace (a V100, 32 GiB): 12.2 GiB reserved around a 6.3 GiB allocated peak."""
    found = _found(_analyze("hta/df_index_resolver/df_index_resolver.json.gz"), "reserved_far_above_allocated")
    assert found.severity == "info"  # 37% of the device: room to spare
    assert found.evidence["device"] == "cuda:1" and round(found.evidence["gap_mib"]) == 5868
    assert 47 < found.evidence["gap_pct"] < 49 and "expandable_segments:True" in found.fix


def _found(findings: list, finding_id: str):
    (found,) = [f for f in findings if f.id == finding_id]
    return found


@pytest.mark.parametrize(
    "relative",
    ["extra/AMD-AGI__TraceLens/tests/traces/h100/facebook_timesformer-base-finetuned-k400__1016002.json.gz",
     "extra/AMD-AGI__TraceLens/tests/traces/h100/google_owlv2-large-patch14-ensemble__1016001.json.gz"],
    ids=["cache-holds-2-percent", "cache-holds-a-quarter"],
)  # fmt: skip
def test_a_cache_holding_freed_blocks_for_reuse_stays_quiet(relative):
    """Reserved 2% and 25% above the allocated peak (blocks cached for reuse): below the share, not named."""
    assert not [f for f in _analyze(relative) if f.id == "reserved_far_above_allocated"]

