"""Fuzzing real corpus traces field by field (and byte by byte): `skalpel analyze` answers or says why in one line.

Each case takes a real trace from ../shared/traces, applies a few mutations from
tests/mutations.py (fields of the wrong type, times far out of range, missing keys,
overlapping or repeated steps, nesting thousands deep, hostile names, a broken header;
sometimes flipped bytes on top), and runs the whole CLI on it: load, analyses, findings,
terminal summary, JSON and HTML with the flame graph. The outcome must be a report
whose numbers are sane, or exit status 2 with one 'skalpel: error:' line; never a
traceback, an internal error or a hang.

The seed is fixed, so CI runs the same cases every time. Knobs for a longer hunt:
SKALPEL_FUZZ_CASES (default 24) and SKALPEL_FUZZ_SEED (default 15); a failure names its
case, seed, trace and mutations so that it can be replayed.
"""

from __future__ import annotations

import copy
import gzip
import math
import os
import random
import signal
from contextlib import contextmanager
from pathlib import Path

import orjson
import pytest

from skalpel.cli import main
from skalpel.result.report import Report

from .conftest import corpus
from .mutations import flip_bytes, mutate, serialize

CASES = int(os.environ.get("SKALPEL_FUZZ_CASES", "24"))
SEED = int(os.environ.get("SKALPEL_FUZZ_SEED", "15"))
CASE_LIMIT_S = 120  # far beyond what any case needs on a loaded 2-core machine: only a hang reaches it
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


class Hang(BaseException):
    """Raised by the alarm: a BaseException, so that no handler in skalpel can swallow it."""


@contextmanager
def _time_limit(seconds: int):
    def expire(signum, frame):
        raise Hang(f"no answer after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture(scope="module")
def documents() -> dict[str, dict]:
    loaded = {}
    for relative in SOURCES:
        raw = corpus(relative).read_bytes()
        loaded[relative] = orjson.loads(gzip.decompress(raw) if relative.endswith(".gz") else raw)
    return loaded


def _check_sane(report: Report, context: str) -> None:
    """Numbers a user would read: finite, and shares that are shares."""
    steps = report.steps
    assert steps.count >= 0 and math.isfinite(steps.median_ms) and steps.median_ms >= 0, context
    for rank in report.ranks:
        assert all(math.isfinite(ms) and ms >= 0 for ms in rank.step_ms), context
        shares = rank.step_breakdown_pct
        assert all(-0.01 <= value <= 100.01 for value in shares.values()), (context, shares)
        if shares and sum(shares.values()) > 0:
            assert abs(sum(shares.values()) - 100.0) < 0.5, (context, shares)
        if rank.gpu is not None:
            assert 0 <= rank.gpu.idle_pct <= 100.01, (context, rank.gpu)


@pytest.mark.parametrize("case", range(CASES))
def test_mutated_real_trace_gets_a_report_or_one_line(case: int, documents, tmp_path: Path, capsys) -> None:
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
    context = f"case {case} (SKALPEL_FUZZ_SEED={SEED}): {source}: {applied}"
    with _time_limit(CASE_LIMIT_S):
        status = main(["analyze", str(path), "--json", str(tmp_path / "r.json"), "--html", str(tmp_path / "r.html")])
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "internal error" not in err, f"{context}\n{err[-3000:]}"
    assert "\x1b" not in out + err, context  # no escape sequence from the trace reaches the terminal
    if status == 2:
        assert err.startswith("skalpel: error: ") and err.count("\n") == 1, f"{context}\n{err[-3000:]}"
        return
    assert status == 0, f"{context}\n{err[-3000:]}"
    _check_sane(Report.from_json((tmp_path / "r.json").read_bytes()), context)
    assert (tmp_path / "r.html").stat().st_size > 0
