"""Fuzzing real corpus traces field by field (and byte by byte): `skalpel analyze` answers or says why in one line.

Each case takes a real trace from ../shared/traces, applies a few mutations from
tests/mutations.py (fields of the wrong type, times far out of range, missing keys,
overlapping or repeated steps, nesting thousands deep, hostile names, a broken header;
sometimes flipped bytes on top), and runs the whole CLI on it: load, analyses, findings,
terminal summary, JSON and HTML with the flame graph. The outcome must be a report
whose numbers are sane and finite (tests/fuzzcase.py judges it), or exit status 2 with one
'skalpel: error:' line; never a traceback, an internal error or a hang. A second test
damages one field at a time, as benchmarks/fuzz_fields.py does at scale.

The seed is fixed, so CI runs the same cases every time. Knobs for a longer hunt:
SKALPEL_FUZZ_CASES (default 24) and SKALPEL_FUZZ_SEED (default 15); a failure names its
case, seed, trace and mutations so that it can be replayed.
"""

from __future__ import annotations

import copy
import gzip
import os
import random
from pathlib import Path

import orjson
import pytest

from skalpel.cli import main
from skalpel.result.report import Report, ReportFormatError

from .conftest import REPO, corpus
from .fuzzcase import read_document, run_analyze, write_case
from .mutations import flip_bytes, mutate, serialize

CASES = int(os.environ.get("SKALPEL_FUZZ_CASES", "24"))
SEED = int(os.environ.get("SKALPEL_FUZZ_SEED", "15"))
ONE_FIELD_CASES = 240  # the quick run of benchmarks/fuzz_fields.py: one field each, small traces
SOURCES = (
    "hta/with_gpu_user_annotation/step_based_trace_2543932.json.gz",  # steps, kernels, gpu annotations
    "hta/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz",  # CUDA training steps
    "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",  # ROCm
    "hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",  # CPU only
    "hta/triton_example/triton_example.json.gz",  # Triton kernels
    "kineto/docs/traces/before_fix_trace.json",  # uncompressed, older Kineto
    "extra/AMD-AGI__TraceLens/tests/traces/torch_compile_triton/trace.json.gz",  # torch.compile
    "extra/facebookresearch__param/et_replay/tests/inputs/dlrm_kineto_extracted/worker0_step_12.1694128201545.pt.trace.json.gz",  # NCCL
)  # fmt: skip
SMALL = (
    "hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    "hta/triton_example/triton_example.json.gz",
    "extra/AMD-AGI__TraceLens/tests/traces/torch_compile_triton/trace.json.gz",
)
FRESH = REPO / "tests" / "traces" / "h200" / "graph_break-fixed.json.gz"  # skalpel's own capture: its header's fields


@pytest.fixture(scope="module")
def documents() -> dict[str, dict]:
    return {relative: read_document(corpus(relative)) for relative in SOURCES}


@pytest.mark.parametrize("case", range(CASES))
def test_mutated_real_trace_gets_a_report_or_one_line(case: int, documents, tmp_path: Path) -> None:
    rng = random.Random(SEED * 1_000_003 + case)
    source = rng.choice(SOURCES)
    document = copy.deepcopy(documents[source])
    applied = mutate(document, rng, rng.randint(1, 4))
    data = serialize(document)
    if rng.random() < 0.25:
        flips = rng.randint(1, 6)
        data = flip_bytes(data, rng, flips)
        applied.append(f"{flips} bytes flipped")
    compressed = rng.random() < 0.5
    path = tmp_path / ("trace.json.gz" if compressed else "trace.json")
    path.write_bytes(gzip.compress(data, compresslevel=1) if compressed else data)
    outcome, _ = run_analyze([path], tmp_path)
    assert outcome.kind != "internal", f"case {case} (SKALPEL_FUZZ_SEED={SEED}): {source}: {applied}\n{outcome.detail}"


def test_one_field_at_a_time_never_ends_in_an_internal_error(tmp_path: Path) -> None:
    """A few hundred cases of benchmarks/fuzz_fields.py's kind on small traces and a fresh capture: 0 internal errors."""
    files = {relative: {Path(relative).name: read_document(corpus(relative))} for relative in SMALL}
    files["fresh"] = {FRESH.name: read_document(FRESH)}
    failures = []
    for case in range(ONE_FIELD_CASES):
        rng = random.Random(SEED * 1_000_003 + case)
        source = rng.choice(sorted(files))
        folder = tmp_path / f"case{case}"
        folder.mkdir()
        paths, applied = write_case(folder, files[source], rng, 1)
        outcome, _ = run_analyze(paths, folder)
        if outcome.kind == "internal":
            failures.append(f"case {case}: {source}: {applied}\n{outcome.detail[:1500]}")
    assert not failures, f"{len(failures)} of {ONE_FIELD_CASES}:\n" + "\n".join(failures[:3])


CAPTURE = {  # the capture facts of a `skalpel demo` run, as its report.json keeps them
    "warmup_steps": 3, "active_steps": 5, "overhead_pct": 66.55, "noise_pct": 86.41, "repeats": 2, "script": "demo",
    "exit_status": 0, "unprofiled_step_ms": 90.0, "profiled_step_ms": 149.9, "window_medians_ms": [70.2, 177.1],
    "wait_steps": 1, "overhead_noise_pct": 86.41, "baseline_steps": 6, "step_signal": "optimizer.step()",
    "cpu": {"intra_op_threads": 1, "inter_op_threads": 2, "loader_workers": 0, "processes": 1, "cores_available": 2,
            "cpu_quota_cores": None, "cpu_s": 0.253, "wall_s": 0.4279, "steps": 5, "load_avg_1m": 6.23,
            "runnable_now": 8, "run_queue_wait_s": 0.1802},
}  # fmt: skip


@pytest.fixture(scope="module")
def run_report(tmp_path_factory) -> dict:
    """The report.json `skalpel run` leaves beside a fresh capture (its capture facts a demo run's)."""
    folder = tmp_path_factory.mktemp("report")
    outcome, _ = run_analyze([FRESH], folder)
    assert outcome.kind == "ok", outcome.detail
    document = orjson.loads((folder / "r.json").read_bytes())
    document["capture"] = copy.deepcopy(CAPTURE)
    return document


def _run_folder(tmp_path: Path, report: dict, where: tuple, value: object) -> Path:
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "trace-rank0.json.gz").write_bytes(FRESH.read_bytes())
    document = copy.deepcopy(report)
    holder = document
    for key in where[:-1]:
        holder = holder[key]
    if value is _MISSING:
        del holder[where[-1]]
    else:
        holder[where[-1]] = value
    (folder / "report.json").write_bytes(serialize(document))
    return folder


_MISSING = object()


def test_intact_capture_facts_are_read_back(tmp_path: Path, run_report: dict) -> None:
    folder = _run_folder(tmp_path, run_report, ("capture", "script"), "demo")
    outcome, report = run_analyze([folder], tmp_path)
    assert outcome.kind == "ok", outcome.detail
    assert report.capture is not None and report.capture.cpu["cpu_s"] == 0.253
    assert not [w for w in report.warnings if "capture facts" in w]


@pytest.mark.parametrize("where, value", [
    (("capture", "cpu", "cpu_s"), -1.7976931348623157e308),  # was cores_used -inf in the evidence and the HTML
    (("capture", "cpu", "cpu_s"), 1e300),
    (("capture", "cpu", "wall_s"), 1e-300 * 0),
    (("capture", "cpu", "intra_op_threads"), 2**70),  # was an internal error: orjson cannot write it back
    (("capture", "cpu", "intra_op_threads"), -1.7976931348623157e308),
    (("capture", "cpu", "cpu_s"), "0.25"),
    (("capture", "cpu", "cpu_s"), _MISSING),
    (("capture", "cpu", "loader_workers"), -3),
    (("capture", "profiled_step_ms"), 1.7976931348623157e308),
    (("capture", "overhead_pct"), -1e300),
    (("capture", "window_medians_ms", 0), -5.0),
    (("capture", "warmup_steps"), 2**64),
])  # fmt: skip
def test_damaged_capture_facts_are_left_out_with_a_warning(tmp_path: Path, run_report: dict, where, value) -> None:
    """A run folder's report.json with one capture fact no capture produces: the facts are absent, and the report says why."""
    folder = _run_folder(tmp_path, run_report, where, value)
    outcome, report = run_analyze([folder], tmp_path)
    assert outcome.kind == "ok", outcome.detail
    if where[-1] == "wall_s":  # 0 s: a capture too short to judge, not a damaged one
        return
    assert report.capture is None
    (warning,) = [w for w in report.warnings if "capture facts" in w]
    assert ".".join(str(key) for key in where[:2]) in warning or "capture" in warning


def test_a_report_with_a_number_beyond_64_bits_is_not_read(tmp_path: Path, run_report: dict) -> None:
    """`skalpel diff` reads reports: an integer orjson cannot write back is a clear error, not an internal one."""
    document = copy.deepcopy(run_report)
    document["steps"]["count"] = 2**70
    path = tmp_path / "report.json"
    path.write_bytes(serialize(document))
    with pytest.raises(ReportFormatError, match="steps.count"):
        Report.from_json(path.read_bytes())
    assert main(["diff", str(path), str(path)]) == 2
