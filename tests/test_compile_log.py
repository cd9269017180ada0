"""torch.compile causes: dynamo's events collected at capture, read back from the trace header, judged.

Hand-built traces with a ``skalpel_compile`` header check the reading and the rules on both
sides of their thresholds; real captures (slow: they compile) check that the capture writes
the header from dynamo's own hooks without TORCH_LOGS, and that the trace stays loadable.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from skalpel.analysis.compile import compile_log
from skalpel.analysis.steps import segment_steps
from skalpel.api import analyze
from skalpel.trace.kinds import Kind
from skalpel.trace.loader import load

from .test_findings_rules import STEP_US, TraceBuilder, _steps


def _log(compilations=(), graph_breaks=(), limits=(), stacks_off=False) -> dict:
    return {"format": "skalpel.compile/1", "sources": ["test"], "stacks_off": stacks_off,
            "compilations": list(compilations), "graph_breaks": list(graph_breaks), "limits": list(limits)}  # fmt: skip


def _compilation(compile_id: str, step: int | None, reason: str | None = None, **extra) -> dict:
    return {"compile_id": compile_id, "frame": "forward", "file": "model.py", "line": 30, "backward": False,
            "duration_ms": 400.0, "recompile_reason": reason, "call_site": "train.py:42 in train_step",
            "step": step, **extra}  # fmt: skip


def _write(tmp_path: Path, builder: TraceBuilder, log: dict | None) -> Path:
    path = builder.write(tmp_path / "trace.json")
    document = json.loads(path.read_text())
    document["deviceProperties"] = []  # a CPU run
    for event in document["traceEvents"]:
        event.pop("args", None) if event["cat"] == "kernel" else None
    if log is not None:
        document["skalpel_compile"] = log
    path.write_text(json.dumps(document))
    return path


def _compiled_steps(count: int = 4) -> TraceBuilder:
    builder = TraceBuilder()
    _steps(builder, count)
    for number in range(count):
        builder.host("TorchDynamo Cache Lookup", number * STEP_US + 10, 20)
        builder.host("Torch-Compiled Region: 0/0", number * STEP_US + 40, 8000)
    return builder


def _by_id(report, finding_id):
    return [finding for finding in report.findings if finding.id == finding_id]


@pytest.mark.parametrize(
    ("guard", "kind", "fix_words"),
    [
        ("0/0: tensor 'x' size mismatch at index 0. expected 8, actual 9", "shape", "mark_dynamic"),
        ("0/0: GLOBAL_STATE changed: grad_mode", "grad_mode", "outside the compiled region"),
        ("0/0: ___stack0 == 2.5  # scale = x.max().item()", "python_value", "pass it as a tensor"),
    ],
)
def test_recompilation_names_the_guard_and_the_matching_fix(tmp_path, guard, kind, fix_words):
    log = _log([_compilation("0/0", None), _compilation("0/1", 2, guard), _compilation("0/2", 3, guard)])
    report = analyze(_write(tmp_path, _compiled_steps(), log))
    (finding,) = _by_id(report, "recompilation")
    assert finding.severity == "warning"
    assert finding.evidence["recompiles_in_steps"] == 2 and finding.evidence["recompiling_steps_pct"] == 50
    assert finding.evidence["guard"] == guard.split("  #")[0] and finding.evidence["guard_kind"] == kind
    assert fix_words in finding.fix
    assert finding.locations[0] == "train.py:42 in train_step"  # the user's line that called the compiled code
    assert guard.split("  #")[0] in finding.title


def test_recompiles_before_the_window_are_info_only(tmp_path):
    """Steps 0-1 are not recorded (the trace's steps are ProfilerStep#1..#4 but the recompile was at #0)."""
    log = _log([_compilation("0/0", None), _compilation("0/1", 0, "0/0: GLOBAL_STATE changed: grad_mode")])
    report = analyze(_write(tmp_path, _compiled_steps(), log))
    (finding,) = _by_id(report, "recompilation")
    assert finding.severity == "info" and "before the profiled steps" in finding.title
    assert not [f for f in report.findings if f.id == "compile_overhead"]


def test_compile_overhead_both_sides_of_the_floor(tmp_path):
    slow = _log([_compilation("0/0", None), _compilation("0/1", 2, "0/0: tensor 'x' size mismatch at index 0")])
    (finding,) = _by_id(analyze(_write(tmp_path, _compiled_steps(), slow)), "compile_overhead")
    assert finding.evidence["compile_ms"] == 400 and finding.evidence["share_pct"] >= 10
    quick = _log([_compilation("0/0", None), _compilation("0/1", 2, "0/0: x", duration_ms=20.0)])
    assert _by_id(analyze(_write(tmp_path, _compiled_steps(), quick)), "compile_overhead") == []


def test_recompile_limit_reached(tmp_path):
    limit = {"limit": "recompile_limit", "value": 8, "function": "'forward' (model.py:30)", "step": 3,
             "last_reason": "0/7: tensor 'x' size mismatch at index 0. expected 15, actual 16"}  # fmt: skip
    recompile = _compilation("0/1", 1, "0/0: tensor 'x' size mismatch at index 0", duration_ms=20.0)  # quick: the limit alone
    log = _log([_compilation("0/0", None), recompile], limits=[limit])
    (finding,) = _by_id(analyze(_write(tmp_path, _compiled_steps(), log)), "compile_overhead")
    assert finding.severity == "warning" and "runs eagerly" in finding.title and "recompile_limit (8)" in finding.title
    assert finding.evidence["in_profiled_steps"] is True and finding.evidence["limit_value"] == 8
    assert "mark_dynamic" in finding.fix


def test_graph_break_both_sides_of_the_share(tmp_path):
    breaks = [{"file": "model.py", "line": 33, "reason": "Unsupported Tensor.item() call with capture_scalar_outputs=False"}]
    compilations = [_compilation("0/0", None), _compilation("1/0", None, frame="torch_dynamo_resume_in_forward_at_33", line=33)]
    report = analyze(_write(tmp_path, _compiled_steps(), _log(compilations, breaks)))
    (finding,) = _by_id(report, "graph_break")
    assert finding.severity == "warning" and finding.evidence["share_pct"] >= 10  # region 0/0: 80% of each step
    assert finding.locations == ("model.py:33 in forward",)
    assert "Tensor.item()" in finding.title and finding.evidence["eager_ms_per_step"] is None  # no CompiledFunction
    small = _compiled_steps()
    small.events = [event for event in small.events if "Region" not in event["name"]]
    small.host("Torch-Compiled Region: 0/0", 50, 500)  # once, 0.5 ms of 40 ms
    (finding,) = _by_id(analyze(_write(tmp_path, small, _log(compilations, breaks))), "graph_break")
    assert finding.severity == "info"


def test_without_a_compile_log_one_compiled_frame_shows_no_break(tmp_path):
    """One frame's region and nothing nested in it: no resume frame ran, so no graph break (tests/test_compile_from_trace.py)."""
    report = analyze(_write(tmp_path, _compiled_steps(), None))
    assert _by_id(report, "graph_break") == []
    assert not [f for f in report.findings if f.id == "not_judged" and "graph_break" in f.title]


def test_compile_log_reads_back_and_bad_headers_are_ignored(tmp_path):
    log = _log([_compilation("0/0", None), _compilation("0/1", 2, "guard"), "junk"], [{"file": "m.py", "line": "x"}])
    trace = load(_write(tmp_path, _compiled_steps(), log))
    read = compile_log(trace, segment_steps(trace))
    assert [item.compile_id for item in read.compilations] == ["0/0", "0/1"]
    assert read.recompiles[0].in_window and read.recompiles[0].step == 2
    assert read.graph_breaks[0].location == "m.py:?"
    document = json.loads((tmp_path / "trace.json").read_text())
    document["skalpel_compile"] = "not an object"
    (tmp_path / "trace.json").write_text(json.dumps(document))
    trace = load(tmp_path / "trace.json")
    assert compile_log(trace, segment_steps(trace)) is None


# -- real captures --------------------------------------------------------------------------------
def _capture(tmp_path: Path, function, batches, **options):
    import skalpel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with skalpel.profile(wait=1, warmup=1, active=3, out=tmp_path / "run", **options) as run:
            for batch in batches:
                function(batch)
                run.step()
    return run


@pytest.fixture()
def dynamo():
    import torch  # a dependency of skalpel: never skipped
    torch.set_num_threads(1)
    torch._dynamo.reset()
    limit = torch._dynamo.config.recompile_limit
    yield torch
    torch._dynamo.config.recompile_limit = limit
    torch._dynamo.reset()


@pytest.mark.slow
def test_capture_writes_guards_and_the_limit_without_torch_logs(dynamo, tmp_path, capfd):
    torch = dynamo
    torch._dynamo.config.recompile_limit = 3

    def scale(x):
        return torch.sin(x) * 2

    compiled = torch.compile(scale, backend="eager", dynamic=False)
    run = _capture(tmp_path, compiled, [torch.randn(4 + step) for step in range(6)])
    stderr = capfd.readouterr().err
    assert "Recompiling function" not in stderr  # nothing printed that the user did not ask for
    header = json.loads((tmp_path / "run" / "report.json").read_text())
    compiled_summary = header["ranks"][0]["extra"]["compiled"]
    assert compiled_summary["limits_reached"] == 1 and compiled_summary["recompilations"] == 2
    assert "torch._dynamo.callback" in compiled_summary["sources"]
    report = run.report()
    limit = _by_id(report, "compile_overhead")[0]
    assert "recompile_limit (3)" in limit.title and "scale" in limit.evidence["function"]
    recompilation = _by_id(report, "recompilation")[0]
    assert "tensor 'x' size mismatch at index 0" in recompilation.evidence["guard"]
    assert recompilation.locations[0].endswith(f"in {_capture.__name__}")  # the line that called the compiled code


@pytest.mark.slow
def test_stacks_are_dropped_for_a_window_after_compilation(dynamo, tmp_path):
    torch = dynamo
    compiled = torch.compile(lambda x: torch.cos(x) + 1, backend="eager")
    run = _capture(tmp_path, compiled, [torch.randn(8)] * 6)
    trace = load(run.trace_paths)
    assert trace.ranks[0].compile_log["stacks_off"] is True
    assert not (trace.stack >= 0).any() and not (trace.kind == Kind.PYTHON).any()  # no Python stacks recorded
    assert any("Python stacks were not recorded" in warning for warning in run.report().warnings)
