"""gradients_held_at_peak: gradients no step reads any more, held at the memory peak (capture/stale_gradients.py).

Real `skalpel run`s on the CPU of examples/scenarios/gradients_held_peak.py: zero_grad(set_to_none=False) (planted),
zero_grad after the forward (planted), the fix (set_to_none=True at the top of the step), and gradient
accumulation over four micro-batches (the look-alike: the gradients are read again by the next backward).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from skalpel.diagnose.peak import GRADIENTS_HELD_AT_PEAK
from skalpel.diagnose.rule import JobContext, NotJudged
from skalpel.result.memory_split import CategoryBytes, MemorySplit
from skalpel.result.report import CaptureInfo

from .conftest import REPO

SCRIPT = REPO / "examples" / "scenarios" / "gradients_held_peak.py"
MIB = 2**20


def _run(out: Path, *args: str) -> subprocess.Popen:
    log = open(out.parent / f"{out.name}.log", "wb")
    command = [sys.executable, "-m", "skalpel", "run", "--active", "2", "--out", str(out), str(SCRIPT), *args]
    return subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONHASHSEED": "0"})  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("gradients")
    plan = {"held": (), "late": ("--late-zero",), "fixed": ("--set-to-none",), "accumulate": ("--accumulate",)}
    reports = {}
    for name, args in plan.items():  # one at a time: the CI's cores are shared
        process = _run(root / name, *args)
        assert process.wait(timeout=900) == 0, (root / f"{name}.log").read_text()[-3000:]
        reports[name] = json.loads((root / name / "report.json").read_text())
    return reports


def _findings(report: dict, finding_id: str) -> list[dict]:
    return [f for f in report["findings"] if f["id"] == finding_id]


def _line(text: str) -> int:
    return next(number for number, line in enumerate(SCRIPT.read_text().splitlines(), 1) if text in line)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "planted"), [("held", "set_to_none=False)  # PLANTED"),
                                               ("late", "zero_grad(set_to_none=True)  # PLANTED")])  # fmt: skip
def test_the_planted_zero_grad_is_found_at_its_line(runs, name, planted):
    (found,) = _findings(runs[name], "gradients_held_at_peak")
    split = runs[name]["capture"]["memory_split"]
    (location,) = found["locations"]
    assert location.endswith(f"gradients_held_peak.py:{_line(planted)} in main")
    evidence = found["evidence"]
    assert evidence["spent_gradient_mib"] >= 20  # the 24 MiB of gradients of six 1024x1024 layers, spent at the peak
    assert evidence["saving_mib"] >= 4 and evidence["saving_mib"] * MIB == pytest.approx(  # evidence: 4 decimals
        split["peak_bytes"] - split["peak_without_spent_gradients_bytes"], abs=1e-4 * MIB)
    assert "set_to_none=True" in found["fix"]


@pytest.mark.slow
def test_the_claim_is_no_more_than_the_fix_measures(runs):
    """The replay keeps the temporary a backward adds into an existing gradient: the claim is a lower bound."""
    (found,) = _findings(runs["held"], "gradients_held_at_peak")
    measured = runs["held"]["capture"]["memory_split"]["peak_bytes"] - runs["fixed"]["capture"]["memory_split"][
        "peak_bytes"]
    assert found["evidence"]["saving_mib"] * MIB <= measured * 1.05
    assert found["evidence"]["saving_mib"] * MIB >= measured * 0.5


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fixed", "accumulate"])
def test_gradients_read_again_or_freed_stay_quiet(runs, name):
    split = runs[name]["capture"]["memory_split"]
    assert not _findings(runs[name], "gradients_held_at_peak")
    assert split["spent_gradient_bytes"] == 0
    assert split["peak_without_spent_gradients_bytes"] == split["peak_bytes"]
    if name == "accumulate":  # the forward of micro-batches 2..4 runs beside gradients it needs
        assert {c["category"]: c["bytes"] for c in split["categories"]}["gradient"] >= 20 * MIB


def _context(split: MemorySplit) -> JobContext:
    return JobContext(analyses=None, capture=CaptureInfo(3, 2, memory_split=split))  # type: ignore[arg-type]


def test_a_split_without_the_replay_is_not_judged():
    gradients = (CategoryBytes("gradient", 24 * MIB),)
    split = MemorySplit(device="cpu", peak_bytes=60 * MIB, held_before_bytes=0, phase="forward", categories=gradients,
                        activation_modules=(), step_span=2)  # fmt: skip
    outcome = GRADIENTS_HELD_AT_PEAK.check(_context(split), GRADIENTS_HELD_AT_PEAK)
    assert isinstance(outcome, NotJudged) and "older skalpel" in outcome.reason
