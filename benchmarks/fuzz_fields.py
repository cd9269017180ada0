"""Field-level fuzzing of real traces at scale: how often `skalpel analyze` ends in an internal error.

Each case picks a real trace from ../shared/traces (one file, or the rank files of a job, a
CPU-only trace among them), decodes it, damages one field of one event or of the header (a few
in one case of four) with tests/mutations.py: removed, of the wrong type, NaN, an infinity, huge,
negative, zero, an event written twice, and the rest of the mutations the CI fuzz test uses. It
writes the result to a scratch folder and runs ``skalpel analyze --json --html --workers 1`` in
this process. tests/fuzzcase.py judges the outcome: ok, a clear error (exit 2, one line), or an
internal error (a traceback, an internal error, an exception, a hang, NaN or an infinity in the
Report or where the HTML shows a number, or numbers that are not sane).

Deterministic: case K of seed S is the same case on every run, whatever --cases and --first say,
so a failure is replayed with ``--first K --cases 1 --seed S``. Single process: run chunks side by
side with --first to go faster.

    python benchmarks/fuzz_fields.py [--cases 10000] [--seed 34] [--first 0] [--show 10] [--keep DIR]
"""

from __future__ import annotations

import argparse
import collections
import copy
import random
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests/ is a package of the checkout, not of the installed skalpel

import orjson

from tests.fuzzcase import Outcome, read_document, run_analyze, write_case

TRACES = ROOT.parent / "shared" / "traces"
FRESH = ROOT / "tests" / "traces" / "h200"  # skalpel's own captures: line samples, memory, flops, a compile log
_DLRM = "extra/facebookresearch__param/et_replay/tests/inputs/dlrm_kineto_extracted/"
SOURCES: dict[str, tuple[Path, ...]] = {  # a short name -> the files of one trace (several: a job's ranks)
    "gpu_annotation": (TRACES / "hta/with_gpu_user_annotation/step_based_trace_2543932.json.gz",),
    "alexnet": (TRACES / "hta/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz",),
    "rocm": (TRACES / "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",),
    "cpu_only": (TRACES / "hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",),
    "triton": (TRACES / "hta/triton_example/triton_example.json.gz",),
    "event_sync": (TRACES / "hta/critical_path/cuda_event_sync/event_sync_trace.json.gz",),
    "kineto_before_fix": (TRACES / "kineto/docs/traces/before_fix_trace.json",),
    "compile": (TRACES / "extra/AMD-AGI__TraceLens/tests/traces/torch_compile_triton/trace.json.gz",),
    "bert_memory": (TRACES / "extra/AMD-AGI__TraceLens/tests/traces/h100/gaunernst_bert-small-uncased__1016001.json.gz",),
    "vit_memory": (TRACES / "extra/AMD-AGI__TraceLens/tests/traces/h100/Falconsai_nsfw_image_detection__1016002.json.gz",),
    "dlrm_rank0": (TRACES / _DLRM / "worker0_step_12.1694128201545.pt.trace.json.gz",),
    "hta_2_ranks": (TRACES / "hta/trace_filter/sampled_rank-0.json.gz", TRACES / "hta/trace_filter/sampled_rank-1.json.gz"),
    "dlrm_3_ranks": (TRACES / _DLRM / "worker0_step_12.1694128201545.pt.trace.json.gz",
                     TRACES / _DLRM / "worker1_step_12.1694128201556.pt.trace.json.gz",
                     TRACES / _DLRM / "worker2_step_12.1694128201554.pt.trace.json.gz"),
    "fresh_clean": (FRESH / "clean.json.gz",),
    "fresh_compile": (FRESH / "graph_break.json.gz",),
    "fresh_pageable": (FRESH / "pageable.json.gz",),
    "run_folder": (FRESH / "sync_item.json.gz",),  # as `skalpel run` leaves it: the trace and its report.json
}  # fmt: skip


CAPTURE = {  # the capture facts of a `skalpel demo` run (report.json's "capture")
    "warmup_steps": 3, "active_steps": 5, "overhead_pct": 66.55, "noise_pct": 86.41, "repeats": 2,
    "script": "skalpel.demo", "exit_status": 0, "unprofiled_step_ms": 90.0263, "profiled_step_ms": 149.9378,
    "window_medians_ms": [70.2517, 177.1367], "wait_steps": 1, "overhead_noise_pct": 86.41, "baseline_steps": 6,
    "step_signal": "optimizer.step()",
    "cpu": {"intra_op_threads": 1, "inter_op_threads": 2, "loader_workers": 0, "processes": 1, "cores_available": 2,
            "cpu_quota_cores": None, "cpu_s": 0.253, "wall_s": 0.4279, "steps": 5, "load_avg_1m": 6.23,
            "runnable_now": 8, "run_queue_wait_s": 0.1802},
}  # fmt: skip


class Sources(dict):
    """Each source's documents, decoded when first asked for: source -> file name -> document."""

    def __missing__(self, name: str) -> dict[str, dict]:
        if name == "run_folder":  # a re-analysis reads the capture facts back from the folder's report.json
            (trace,) = SOURCES[name]
            self[name] = {"trace-rank0.json.gz": read_document(trace), "report.json": report_document(trace)}
        else:
            self[name] = {path.name: read_document(path) for path in SOURCES[name]}
        return self[name]


def report_document(trace: Path) -> dict:
    """The report.json of a `skalpel run` of ``trace``: its report, with the capture facts a run records."""
    with tempfile.TemporaryDirectory(prefix="skalpel-fuzz-") as scratch:
        outcome, _ = run_analyze([trace], Path(scratch))
        assert outcome.kind == "ok", outcome
        document = orjson.loads((Path(scratch) / "r.json").read_bytes())
    document["capture"] = copy.deepcopy(CAPTURE)
    return document


def pick(case: int, seed: int) -> tuple[random.Random, str]:
    """Case ``case``'s random generator and source: the same whatever else the run does."""
    rng = random.Random(seed * 1_000_003 + case)
    return rng, rng.choice(sorted(SOURCES))


def run_case(case: int, seed: int, documents: Sources, scratch: Path) -> tuple[str, list[str], Outcome]:
    rng, source = pick(case, seed)
    folder = scratch / f"case{case}"
    folder.mkdir()
    try:
        paths, applied = write_case(folder, documents[source], rng, 1 if rng.random() < 0.75 else rng.randint(2, 3))
        out = scratch / f"out{case}"
        out.mkdir()
        outcome, _ = run_analyze(paths, out)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(scratch / f"out{case}", ignore_errors=True)
    return source, applied, outcome


def _error_class(line: str) -> str:
    """An error line without its file's path and numbers: what kind of clear error it is."""
    text = line.removeprefix("skalpel: error: ")
    text = re.sub(r"\S*skalpel-fuzz-\S*?: ", "", text)
    return re.sub(r"\d+", "N", text)[:90]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=34)
    parser.add_argument("--first", type=int, default=0, help="the first case's number (to run a chunk or replay one)")
    parser.add_argument("--show", type=int, default=10, help="failing cases printed in full")
    parser.add_argument("--only", nargs="*", choices=sorted(SOURCES), help="skip the cases of other sources")
    args = parser.parse_args(argv)
    documents = Sources()
    counts: collections.Counter[str] = collections.Counter()
    per_source: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    classes: collections.Counter[str] = collections.Counter()
    errors: collections.Counter[str] = collections.Counter()
    failures = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="skalpel-fuzz-") as scratch:
        for case in range(args.first, args.first + args.cases):
            if args.only and pick(case, args.seed)[1] not in args.only:
                continue
            source, applied, outcome = run_case(case, args.seed, documents, Path(scratch))
            counts[outcome.kind] += 1
            per_source[source][outcome.kind] += 1
            if outcome.kind == "error":
                errors[_error_class(outcome.detail)] += 1
            if outcome.kind == "internal":
                classes[outcome.detail.splitlines()[0][:100] if outcome.detail else "?"] += 1
                failures.append((case, source, applied, outcome))
            if (done := sum(counts.values())) % 500 == 0:
                print(f"... {done} cases, {time.perf_counter() - started:.0f} s, {dict(counts)}", file=sys.stderr, flush=True)
    wall = time.perf_counter() - started
    print(f"{sum(counts.values())} cases (first {args.first}, seed {args.seed}) over {len(per_source)} traces in {wall:.0f} s")
    print("outcomes: " + ", ".join(f"{kind} {counts[kind]}" for kind in ("ok", "error", "internal")))
    for source in sorted(per_source):
        tally = per_source[source]
        print(f"  {source:18} ok {tally['ok']:5}  error {tally['error']:5}  internal {tally['internal']:3}")
    for text, number in errors.most_common(8):
        print(f"error x{number}: {text}")
    for text, number in classes.most_common():
        print(f"internal x{number}: {text}")
    for case, source, applied, outcome in failures[: args.show]:
        print(f"\ncase {case} ({source}): {applied}")
        print(f"  replay: python benchmarks/fuzz_fields.py --seed {args.seed} --first {case} --cases 1")
        print("  " + outcome.detail[-1500:].replace("\n", "\n  "))
    return 1 if counts["internal"] else 0


if __name__ == "__main__":
    sys.exit(main())
