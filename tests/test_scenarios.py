"""Each scenario in examples/scenarios runs under `skalpel run` and gets its planted finding.

A scenario marks its planted line with ``# PLANTED``. Ops carry their call stack at the
current line; Python frames name their function by its ``def`` line, and skalpel's line
sampler names the statement that was running. So a location is right when it names the
scenario file, the function holding the planted line, and the planted line itself.

The clean baseline runs first and alone, with the default capture options, pinned to one core
with one thread: its test always runs and asserts that nothing about the code reaches warning
level; a busy machine may add the measurement's own warnings (cpu_contention naming the other
processes), never a finding about the script. Then the
planted scenarios start at once (module fixture) and each test waits for its own, so their
slow parts (starting torch, writing the run folder) overlap; their effects are large.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from skalpel.diagnose import lookup

from .conftest import assert_not_blamed, pinned

pytestmark = pytest.mark.slow  # every test here starts a `skalpel run`

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = REPO / "examples" / "scenarios"
SKALPEL = REPO / ".venv" / "bin" / "skalpel"
QUICK = ("--wait", "0", "--warmup", "1", "--active", "4", "--stop-after-capture")
# Run one at a time before the others: the quiet baseline, and tiny_ops, whose step is thousands of
# microsecond ops (the runs beside it would stretch them; its profiler overhead is asserted measured, not its size).
SOLO = {"baseline": ("--stop-after-capture",), "tiny_ops": QUICK}  # baseline: wait 1, warm-up 2, active 5
# The negative controls: one core, one thread, whatever else the machine runs (by run folder: the eager twin of
# compiled_clean, which only feeds the diff, is not pinned).
PINNED = {"baseline", "compiled_clean"}
RUNS = {
    "dataloader_starved": QUICK,
    "memory_leak": QUICK,
    "memory_spike": QUICK,
    "host_preprocessing": QUICK,
    "no_warmup": ("--wait", "0", "--warmup", "0", "--active", "1", "--stop-after-capture"),
}
COMPILED = ("--wait", "0", "--warmup", "1", "--active", "4", "--stop-after-capture")
SLOW_RUNS = {
    "recompile": ("--wait", "0", "--warmup", "1", "--active", "3", "--stop-after-capture"),
    # Inductor on the CPU; its cache in ./.inductor-cache (git-ignored), kept between test runs.
    "graph_break": COMPILED,
    "compile_train_eval": COMPILED,
    "compiled_clean": COMPILED,
}
COMPILE_FINDINGS = ("recompilation", "graph_break", "compile_overhead")
LOCATION = re.compile(r"^(?P<path>.+):(?P<line>\d+) in (?P<func>.+)$")
TIMEOUT_S = 900


def _command() -> list[str]:
    return [str(SKALPEL)] if SKALPEL.exists() else [sys.executable, "-m", "skalpel"]


def _start(name: str, options: tuple[str, ...], out: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    log = open(out.parent / f"{out.name}.log", "wb")
    environment = {**os.environ, "PYTHONHASHSEED": "0", **(env or {})}
    return subprocess.Popen(
        [*_command(), "run", *options, "--out", str(out), str(SCENARIOS / f"{name}.py")],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        **(pinned(environment) if out.name in PINNED else {"env": environment}),
    )


class Runs:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.processes: dict[str, subprocess.Popen] = {}

    def start(self, table: dict[str, tuple[str, ...]]) -> None:
        for name, options in table.items():
            self.processes[name] = _start(name, options, self.root / name)

    def report(self, name: str) -> dict:
        if name not in self.processes:
            self.start({name: SLOW_RUNS[name]})
        process = self.processes[name]
        status = process.wait(timeout=TIMEOUT_S)
        log = (self.root / f"{name}.log").read_text(errors="replace")
        assert status == 0, f"skalpel run {name} exited {status}:\n{log[-3000:]}"
        return json.loads((self.root / name / "report.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    runs = Runs(tmp_path_factory.mktemp("scenarios"))
    for name, options in SOLO.items():
        runs.start({name: options})
        runs.processes[name].wait(timeout=TIMEOUT_S)
    runs.start(RUNS)
    yield runs
    for process in runs.processes.values():
        if process.poll() is None:
            process.kill()


def _planted_function(name: str, *, exact: bool = True) -> tuple[str, int, int]:
    """(function name, first line, last line) of the planted statement (the ``# PLANTED`` line, or the
    loop it heads) in the function holding it; with ``exact=False`` of the whole function."""
    source = (SCENARIOS / f"{name}.py").read_text()
    marker = next(number for number, line in enumerate(source.splitlines(), 1) if "# PLANTED" in line)
    functions = [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.FunctionDef)]
    holder = min(
        (node for node in functions if node.lineno <= marker <= node.end_lineno),
        key=lambda node: node.end_lineno - node.lineno,
    )
    if not exact:
        return holder.name, holder.lineno, holder.end_lineno
    statement = min(  # the planted statement: its line, or the lines of the loop it heads
        (node for node in ast.walk(holder) if isinstance(node, ast.stmt) and node.lineno == marker),
        key=lambda node: node.end_lineno - node.lineno,
    )
    return holder.name, statement.lineno, statement.end_lineno


def _assert_located(finding: dict, name: str, *, exact: bool = True) -> None:
    function, first, last = _planted_function(name, exact=exact)
    for location in finding["locations"]:
        match = LOCATION.match(location)
        if (
            match
            and Path(match["path"]).name == f"{name}.py"
            and match["func"] == function
            and first <= int(match["line"]) <= last
        ):
            return
    pytest.fail(f"{finding['id']}: no location in {name}.py:{first}-{last} ({function}): {finding['locations']}")


def _finding(report: dict, finding_id: str) -> dict:
    found = [finding for finding in report["findings"] if finding["id"] == finding_id]
    assert found, f"{finding_id} missing; findings: {[(f['id'], f['severity'], f['title']) for f in report['findings']]}"
    return found[0]


def _serious(report: dict) -> list[dict]:
    return [finding for finding in report["findings"] if finding["severity"] in ("critical", "warning")]


def test_findings_lead_the_report(runs):
    findings = runs.report("dataloader_starved")["findings"]
    order = ["critical", "warning", "info"]
    ranks = [order.index(finding["severity"]) for finding in findings]
    assert ranks == sorted(ranks)


def test_baseline_has_no_warning(runs):
    """The negative control always runs, pinned to one core with one thread (SOLO): nothing about the code may
    warn. The machine may be busy (CI on 2 shared cores): a measurement warning then says so, and never blames
    the script: cpu_contention names the other processes, not the script's one thread, as the cause."""
    report = runs.report("baseline")
    cpu = report["capture"]["cpu"]
    assert cpu["cores_available"] == 1 and cpu["intra_op_threads"] == 1  # pinned
    code = [f for f in _serious(report) if lookup(f["id"]).family != "measurement"]
    assert code == [], [(f["id"], f["title"]) for f in code]
    for contention in [f for f in report["findings"] if f["id"] == "cpu_contention"]:
        assert_not_blamed(contention)
    breakdown = report["ranks"][0]["step_breakdown_pct"]
    assert max(breakdown, key=breakdown.get) == "cpu_exec", breakdown  # the matmuls
    if not _serious(report):  # the verdict comes when nothing warns, the machine's warnings included
        verdict = _finding(report, "no_bottleneck")
        assert verdict["evidence"]["median_step_ms"] > 0
        assert verdict["evidence"]["largest_category"] == "cpu_exec"


def test_starving_dataloader(runs):
    report = runs.report("dataloader_starved")
    finding = _finding(report, "dataloader_bound")
    assert finding["severity"] == "critical"
    evidence = finding["evidence"]
    assert evidence["share_pct"] >= 50  # 16 samples x 2 ms of sleep against a tiny MLP
    assert evidence["ms_per_step"] >= 30
    assert "_SingleProcessDataLoaderIter" in evidence["iterator"]
    assert "num_workers=0" in finding["fix"]
    _assert_located(finding, "dataloader_starved")


def test_memory_kept_alive_across_steps(runs):
    report = runs.report("memory_leak")
    finding = _finding(report, "memory_growth")
    evidence = finding["evidence"]
    assert evidence["growth_mib_per_step"] == pytest.approx(8.0, abs=0.5)  # one 1024 x 2048 float32 per step
    assert evidence["rising_steps_pct"] == 100
    assert evidence["device"] == "cpu"
    # the growth is located where the kept tensors are allocated (body(x)), not at the append that keeps them
    _assert_located(finding, "memory_leak", exact=False)
    assert not [f for f in report["findings"] if f["id"] == "memory_spike"]


def test_expand_then_materialise_spike(runs):
    report = runs.report("memory_spike")
    finding = _finding(report, "memory_spike")
    evidence = finding["evidence"]
    assert evidence["alloc_mib"] == pytest.approx(64.0)  # 4096 x 4096 float32
    assert evidence["share_pct"] >= 90
    assert evidence["op"] == "aten::contiguous"
    _assert_located(finding, "memory_spike")
    assert not [f for f in report["findings"] if f["id"] == "memory_growth"]
    # the 64 MiB copy is the step's time too: a tiny MLP beside it (hot_op, with the copy's "materialised" hint)
    hot = _finding(report, "hot_op")
    assert hot["evidence"]["op"] == "aten::copy_" and hot["evidence"]["share_pct"] >= 50
    assert "materialised" in hot["fix"]
    _assert_located(hot, "memory_spike")


def test_python_preprocessing_on_the_training_thread(runs):
    """Host work no op records is named by the user's function running it, with its share of the step: the
    numpy augmentation first, the tokenizing comprehension next; neither is "host wait" or framework overhead."""
    report = runs.report("host_preprocessing")
    finding = _finding(report, "host_bound")
    evidence = finding["evidence"]
    assert evidence["outside_ops_pct"] >= 50
    labels = [culprit["label"] for culprit in evidence["culprits"]]
    assert {"augment() in host_preprocessing.py:22", "<listcomp> in host_preprocessing.py:32"} <= set(labels[:2])
    shares = {culprit["label"]: culprit["share_pct"] for culprit in evidence["culprits"]}
    assert sum(shares[label] for label in labels[:2]) <= evidence["outside_ops_pct"] + 1e-6
    assert labels[0] in finding["title"] and "DataLoader workers" in finding["fix"]
    if labels[0].startswith("augment"):
        _assert_located(finding, "host_preprocessing", exact=False)
    assert not [f for f in report["findings"] if f["id"] in ("launch_bound", "dataloader_bound", "no_bottleneck")]


def test_thousands_of_tiny_ops(runs):
    report = runs.report("tiny_ops")
    finding = _finding(report, "launch_bound")
    assert not [f for f in report["findings"] if f["id"] == "host_bound"]  # the Python between tiny ops is theirs
    evidence = finding["evidence"]
    assert evidence["ops_per_step"] >= 1000
    assert evidence["tiny_op_pct"] >= 50
    assert evidence["overhead_pct"] >= 50
    # The Python frames name a function by its def line, the sampler the statement it caught: anywhere in the
    # planted function is right (under load the sampler caught the def line, 2 lines above the planted loop).
    _assert_located(finding, "tiny_ops", exact=False)
    # The profiler's overhead is wall time (thousands of traced calls per step): the capture must measure it
    # (both medians); whether it crosses the threshold is the machine's business (both sides: test_findings_rules).
    capture = report["capture"]
    assert capture["profiled_step_ms"] > 0 and capture["unprofiled_step_ms"] > 0
    assert capture["overhead_pct"] is not None
    for overhead in [f for f in report["findings"] if f["id"] == "profiler_overhead"]:
        assert overhead["evidence"]["overhead_pct"] == pytest.approx(capture["overhead_pct"])


def test_no_warmup_and_one_step(runs):
    report = runs.report("no_warmup")
    no_warmup = _finding(report, "no_warmup")
    assert no_warmup["evidence"]["warmup_steps"] == 0
    assert no_warmup["severity"] == "warning"
    too_few = _finding(report, "too_few_steps")
    assert too_few["evidence"]["steps"] == 1 and too_few["evidence"]["minimum"] == 3


@pytest.mark.slow
def test_recompiling_on_changing_shapes(runs):
    report = runs.report("recompile")
    finding = _finding(report, "recompilation")
    assert finding["severity"] == "warning"
    evidence = finding["evidence"]
    assert evidence["recompiles_in_steps"] >= 2  # every active step after the first has a new batch size
    assert evidence["recompiling_steps_pct"] >= 50
    assert len(evidence["compile_ids"]) >= 3
    _assert_located(finding, "recompile")
    # The guard that failed, in torch's words: it names the tensor and its size; the fix matches it.
    assert evidence["guard_kind"] == "shape"
    assert re.search(r"tensor 'x' size mismatch at index 0\. expected \d+, actual \d+", evidence["guard"])
    assert "mark_dynamic" in finding["fix"] and "dynamic=True" in finding["fix"]


@pytest.fixture(scope="module")
def compiled_runs(runs):
    """The torch.compile scenarios start together (Inductor compiles for tens of seconds each)."""
    runs.start({name: SLOW_RUNS[name] for name in ("graph_break", "compile_train_eval", "compiled_clean")})
    runs.processes["compiled_clean_eager"] = _start(
        "compiled_clean", COMPILED, runs.root / "compiled_clean_eager", env={"SKALPEL_SCENARIO_COMPILE": "0"}
    )
    return runs


@pytest.mark.slow
def test_graph_break_from_item(compiled_runs):
    report = compiled_runs.report("graph_break")
    finding = _finding(report, "graph_break")
    evidence = finding["evidence"]
    assert evidence["graph_breaks"] == 1
    assert "Tensor.item()" in evidence["reasons"][0]
    _assert_located(finding, "graph_break")
    # The split forward's share of the step is a timing (a loaded machine slows the eager rest of the
    # step more): the severity must follow the share measured, at the rule's line.
    assert evidence["share_pct"] > 0
    assert finding["severity"] == ("warning" if evidence["share_pct"] >= 10 else "info"), evidence["share_pct"]
    assert evidence["eager_ms_per_step"] > 0  # Inductor's graphs are separable from the eager code between them
    assert "capture_scalar_outputs" in finding["fix"]
    compiled = report["ranks"][0]["extra"]["compiled"]
    assert compiled["graph_breaks"] == 1 and compiled["stacks_off"] is True
    functions = {row["location"].rsplit(" in ", 1)[-1] for row in compiled["regions"]}
    assert {"forward", "torch_dynamo_resume_in_forward_at_32"} <= functions  # regions named by the user's function
    assert all(row["graphs"] for row in compiled["regions"])  # each runs an Inductor graph


@pytest.mark.slow
def test_train_eval_switch_recompiles_on_grad_mode(compiled_runs):
    report = compiled_runs.report("compile_train_eval")
    finding = _finding(report, "recompilation")
    assert finding["severity"] == "warning"
    evidence = finding["evidence"]
    assert evidence["recompiles_in_steps"] == 1
    assert "GLOBAL_STATE changed: grad_mode" in evidence["guard"] and evidence["guard_kind"] == "grad_mode"
    assert "outside the compiled region" in finding["fix"] and "mark_dynamic" not in finding["fix"]
    _assert_located(finding, "compile_train_eval")
    overhead = _finding(report, "compile_overhead")  # compiling the eval graph inside a measured step
    assert overhead["evidence"]["compile_ms"] >= 50 and overhead["evidence"]["share_pct"] >= 10


@pytest.mark.slow
def test_clean_compiled_loop_stays_quiet(compiled_runs):
    """The compiled negative control, pinned like the baseline: nothing about the code may warn; a measurement
    warning may say the machine is busy, and a cpu_contention never blames the script's one thread."""
    report = compiled_runs.report("compiled_clean")
    cpu = report["capture"]["cpu"]
    assert cpu["cores_available"] == 1 and cpu["intra_op_threads"] == 1  # pinned
    assert not [f for f in report["findings"] if f["id"] in COMPILE_FINDINGS], report["findings"]
    code = [f for f in _serious(report) if lookup(f["id"]).family != "measurement"]
    assert code == [], [(f["id"], f["title"]) for f in code]
    for contention in [f for f in report["findings"] if f["id"] == "cpu_contention"]:
        assert_not_blamed(contention)
    compiled = report["ranks"][0]["extra"]["compiled"]
    assert compiled["recompilations"] == 0 and compiled["graph_breaks"] == 0 and compiled["limits_reached"] == 0
    assert compiled["regions"][0]["location"].endswith("in train_step")  # the compiled module's call site


@pytest.mark.slow
def test_diff_eager_against_compiled_names_the_region(compiled_runs, capsys):
    from skalpel.cli import main

    compiled_runs.report("compiled_clean")
    compiled_runs.report("compiled_clean_eager")
    out = compiled_runs.root / "diff.json"
    eager, compiled = compiled_runs.root / "compiled_clean_eager", compiled_runs.root / "compiled_clean"
    assert main(["diff", str(eager), str(compiled), "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    (region,) = [row for row in result["regions"] if row["name"].endswith("in train_step")]
    assert region["before_ms_per_step"] is None and region["after_ms_per_step"] > 0  # compiled on one side only
    assert any("runs eagerly" in note for note in result["notes"])
    assert "torch.compile regions" in capsys.readouterr().out
