"""`skalpel tune` on look-alikes of the real scripts of issue 35, run for real (short windows, few candidates).

- a quiet CPU loop whose AdamW steps over many small parameters: ``fused=True`` runs on the CPU in current
  torch (probed on the device, not assumed by device type), so tune offers it;
- a short run where ``torch.compile``'s one-time cost exceeds what its faster steps save over the whole run:
  not recommended, whatever its per-step speed-up, and the words say after how many steps it would pay;
- statements over several lines (the model, the optimizer, the DataLoader): every edit tune prints, for every
  candidate of the catalogue, written into the script, parses (``ast.parse``).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from skalpel.cores import usable_cores
from skalpel.tune import candidates, edits
from skalpel.tune.measure import Window, run_once

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
INDUCTOR_CACHE = {"TORCHINDUCTOR_CACHE_DIR": str(REPO / ".inductor-cache")}  # compiled once, warm after

FUSED_ADAMW = """
import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)


class Net(nn.Module):
    def __init__(self, width, depth):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        return x


model = Net(
    width=16,
    depth=80,
)
optimizer = torch.optim.AdamW(
    model.parameters(),
    lr=1e-3,
)
x = torch.randn(8, 16)
for step in range(30):
    optimizer.zero_grad()
    model(x).pow(2).mean().backward()
    optimizer.step()
"""

# 12 steps of a few ms: a compile's seconds of one-time work are more than the whole run.
SHORT_COMPILE = """
import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(
    nn.Linear(64, 64),
    nn.GELU(),
    nn.LayerNorm(64),
    nn.Linear(64, 64),
)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(32, 64)
for step in range(12):
    optimizer.zero_grad()
    model(x).tanh().pow(2).mean().backward()
    optimizer.step()
"""

LOADER_OVER_LINES = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def train():
    data = TensorDataset(torch.randn(512, 32), torch.randint(0, 4, (512,)))
    loader = DataLoader(
        data,
        batch_size=32,
        num_workers=4,
        persistent_workers=True,
    )
    model = nn.Sequential(
        nn.Linear(32, 64), nn.ReLU(),
        nn.Linear(64, 4),
    )
    optimizer = torch.optim.AdamW(model.parameters(),
                                  lr=1e-3)
    for x, y in loader:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()


if __name__ == "__main__":
    train()
"""


def _script(folder: Path, source: str, name: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(source))
    return path


def _tune(folder: Path, *args: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    out = folder / "tune.json"
    done = subprocess.run([sys.executable, "-m", "skalpel", "tune", "--no-profile", "--json", str(out), *args],
                          cwd=folder, capture_output=True, text=True, timeout=400,
                          env={**os.environ, "COLUMNS": "200", **(env or {})})  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done, json.loads(out.read_text())


def _line_of(script: Path, start: str) -> int:
    return next(number for number, line in enumerate(script.read_text().splitlines(), 1) if line.startswith(start))


def _assert_edits_parse(script: Path, changes: list[dict], what: str) -> str:
    edited = edits.apply(script.read_text(), changes)
    try:
        ast.parse(edited)
    except SyntaxError as error:  # the edited file, shown: where the edit went
        raise AssertionError(f"{what}: the edited script does not parse ({error}):\n{edited}") from None
    return edited


@pytest.fixture(scope="module")
def fused(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess, dict]:
    folder = tmp_path_factory.mktemp("fused")
    script = _script(folder, FUSED_ADAMW, "train.py")
    done, result = _tune(folder, "--skip", "compile", "--skip", "threads", "--warmup", "2", "--steps", "6",
                         "--repeats", "2", "--extra-runs", "1", "--budget", "150", str(script))  # fmt: skip
    return script, done, result


def test_fused_adamw_is_offered_on_the_cpu_where_this_torch_runs_it(fused) -> None:
    import torch

    from skalpel.tune.patches import fused_runs

    script, done, result = fused
    assert result["device"] == "cpu"
    names = [c["name"] for c in result["candidates"]]
    assert fused_runs(torch.optim.AdamW, "cpu", 1e-3)  # the pinned torch (2.13) runs fused AdamW on the CPU
    assert "fused_optimizer" in names and "fused_optimizer" not in {i["name"] for i in result["not_applicable"]}
    entry = next(c for c in result["candidates"] if c["name"] == "fused_optimizer")
    assert entry["reason"] == "this torch runs fused for AdamW on cpu (probed)" and entry["verdict"] != "error"
    assert not any(note.startswith("fused_optimizer: the run found nothing") for note in result["notes"])  # applied
    (change,) = entry["change"]
    first = _line_of(script, "optimizer = torch.optim.AdamW(")
    assert (change["line"], change["end_line"]) == (first, first + 3)  # the whole four-line statement
    assert change["after"] == "optimizer = torch.optim.AdamW(\n    model.parameters(),\n    lr=1e-3,\n    fused=True,\n)"
    edited = _assert_edits_parse(script, entry["change"], "fused_optimizer")
    assert "    fused=True,\n)\nx = torch.randn(8, 16)" in edited
    # the gain paired round by round: each run over the baseline run of its round, the median the speed-up
    assert len(entry["ratios"]) == len(entry["run_ms"]) >= 2
    assert entry["speedup"] * sorted(entry["ratios"])[0] <= 1.0 + 1e-3 <= entry["speedup"] * sorted(entry["ratios"])[-1] + 2e-3


def test_compile_on_a_short_run_is_weighed_over_the_whole_run(tmp_path: Path) -> None:
    script = _script(tmp_path, SHORT_COMPILE, "short.py")
    done, result = _tune(tmp_path, "--try", "compile", "--skip", "threads", "--warmup", "2", "--steps", "6",
                         "--repeats", "2", "--extra-runs", "0", "--budget", "200", str(script), env=INDUCTOR_CACHE)  # fmt: skip
    assert result["run_steps_from"] == "the script's end" and result["run_steps"] == 12
    base = result["baseline"]
    assert base["whole_run_s"] == pytest.approx(base["one_time_s"] + 12 * base["median_ms"] / 1000, abs=0.01)
    compiled = next(c for c in result["candidates"] if c["name"] == "compile")
    assert compiled["verdict"] != "error", compiled.get("error")
    # the compile's one-time work (seconds, even from a warm cache) against 12 steps of milliseconds
    assert compiled["one_time_s"] > base["one_time_s"] + 0.5, (compiled["one_time_s"], base["one_time_s"])
    assert compiled["whole_run_verdict"] == "slower" and compiled["whole_run_speedup"] < 1
    assert "compile" not in result["recommended"]
    if compiled["verdict"] == "faster":  # faster per step: the words say it does not pay over this run, and when
        assert compiled["break_even_steps"] > 12
        assert "compile: " in done.stdout and "per step, but its one-time cost" in done.stdout
        assert "--run-steps N" in done.stdout
    # the edit goes after the whole five-line model statement
    (change,) = compiled["change"]
    first = _line_of(script, "model = nn.Sequential(")
    assert (change["line"], change["end_line"]) == (first, first + 5)
    edited = _assert_edits_parse(script, compiled["change"], "compile")
    assert "    nn.Linear(64, 64),\n)\nmodel = torch.compile(model)\n" in edited


def test_the_whole_run_follows_run_steps_when_the_user_says_the_run_is_longer() -> None:
    """The same measurements over a run said to be 100000 steps long: the one-time cost is paid back, and a
    candidate faster per step is recommended (session.pays over the numbers, no stopwatch)."""
    from skalpel.tune.result import CandidateResult
    from skalpel.tune.session import recommend

    def weighed(steps: int) -> CandidateResult:
        base_one, base_ms, one, ms = 2.0, 5.0, 12.0, 2.5  # compile: +10 s once, 2x per step
        whole_base, whole = base_one + steps * base_ms / 1000, one + steps * ms / 1000
        verdict = "slower" if whole_base / whole < 1 / 1.03 else "faster" if whole_base / whole > 1.03 else "no_gain"
        return CandidateResult("compile", "", "", {}, [], verdict="faster", speedup=2.0, speedup_low=1.8,
                               whole_run_speedup=whole_base / whole, whole_run_verdict=verdict)  # fmt: skip

    assert recommend([weighed(12)]) == []
    assert recommend([weighed(100_000)]) == ["compile"]


@pytest.mark.parametrize("source", [FUSED_ADAMW, SHORT_COMPILE, LOADER_OVER_LINES], ids=["fused", "short", "loader"])
def test_every_candidates_edit_parses_on_every_lookalike(tmp_path: Path, source: str) -> None:
    """The facts of one real baseline run of each look-alike; every candidate of the catalogue (applicable or
    not), its edits written into the script: the file parses."""
    script = _script(tmp_path, source, "train.py")
    outcome = run_once(str(script), (), {}, Window(warmup=1, steps=2), max_seconds=None, timeout_s=120)
    assert not outcome.failed, outcome.log_tail
    facts, cores = outcome.facts, max(usable_cores(), 2)
    written = 0
    for candidate in candidates.CATALOGUE:
        changes = candidate.changes(facts, cores)
        _assert_edits_parse(script, changes, candidate.name)
        written += sum(1 for change in changes if change.get("after"))
    assert written >= 4  # edits were really written, not all left out
    if source is LOADER_OVER_LINES:
        (loader,) = candidates.BY_NAME["no_workers"].changes(facts, cores)
        first = _line_of(script, "    loader = DataLoader(")
        assert (loader["line"], loader["end_line"]) == (first, first + 5)
        assert "persistent_workers=False" in loader["after"] and "num_workers=0" in loader["after"]
        (model,) = candidates.BY_NAME["compile"].changes(facts, cores)
        assert model["after"].endswith(")\nmodel = torch.compile(model)")
