"""One field-fuzz case, built and judged: shared by tests/test_field_fuzz.py and benchmarks/fuzz_fields.py.

A case copies a real trace (one file, or the rank files of a job) into a folder, mutates one
document with tests/mutations.py, runs ``skalpel analyze --json --html`` in this process and
sorts the outcome:

- ``ok``: exit 0, and the report keeps the contract: no NaN or infinity anywhere in the Report
  (orjson would write it as null without a word), none in the HTML where a number belongs, the
  numbers a user reads sane (``check_sane``);
- ``error``: exit 2 with one ``skalpel: error:`` line;
- ``internal``: anything else: an internal error, a traceback, an exception out of ``main``, a
  hang, another exit status, or a report that breaks the contract.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import gzip
import io
import math
import random
import re
import signal
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from skalpel.cli import main
from skalpel.result.report import Report

from .mutations import mutate, serialize

CASE_LIMIT_S = 120  # far beyond what any case needs on a loaded 2-core machine: only a hang reaches it
_NOT_A_NUMBER = re.compile(r"(?i)(?<![\w.\\-])[-+]?(?:nan|inf|infinity)(?![\w(])")
"""nan, inf or Infinity standing alone, as f-strings, str() and JavaScript write a non-finite number."""


class Hang(BaseException):
    """Raised by the alarm: a BaseException, so that no handler in skalpel can swallow it."""


@contextlib.contextmanager
def time_limit(seconds: int) -> Iterator[None]:
    def expire(signum, frame):
        raise Hang(f"no answer after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@dataclass(frozen=True)
class Outcome:
    kind: str  # ok, error or internal
    detail: str  # the error line, or what went wrong


def read_document(path: Path) -> dict:
    raw = path.read_bytes()
    return orjson.loads(gzip.decompress(raw) if path.name.endswith(".gz") else raw)


def write_case(folder: Path, files: dict[str, dict], rng: random.Random, count: int) -> tuple[list[Path], list[str]]:
    """The documents ``files`` (name -> decoded trace) written to ``folder``, one of them mutated ``count`` times.

    Returns the paths to analyse (the folder itself for a job of several files) and the mutations.
    """
    target = rng.choice(sorted(files))
    applied = []
    for name, document in files.items():
        if name == target:
            document = copy.deepcopy(document)
            applied = [f"{name}: {text}" for text in mutate(document, rng, count)]
            data = serialize(document)
        else:
            data = orjson.dumps(document)
        (folder / name).write_bytes(gzip.compress(data, compresslevel=1) if name.endswith(".gz") else data)
    return ([folder] if len(files) > 1 else [folder / target]), applied


def run_analyze(paths: list[Path], out: Path) -> tuple[Outcome, Report | None]:
    """``skalpel analyze PATHS --json --html --workers 1`` in this process, judged; the report when it wrote one."""
    written: list[Report] = []
    to_json = Report.to_json

    def recording(report: Report) -> bytes:
        written.append(report)
        return to_json(report)

    stdout, stderr = io.StringIO(), io.StringIO()
    argv = ["analyze", *map(str, paths), "--json", str(out / "r.json"), "--html", str(out / "r.html"), "--workers", "1"]
    Report.to_json = recording  # type: ignore[method-assign]
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr), time_limit(CASE_LIMIT_S):
            status = main(argv)
    except BaseException as error:  # noqa: BLE001 (a hang, or an exception main let out: both are the finding)
        return Outcome("internal", f"{type(error).__name__} out of main: {error}\n{traceback.format_exc()[-2000:]}"), None
    finally:
        Report.to_json = to_json  # type: ignore[method-assign]
    err = stderr.getvalue()
    if "Traceback" in err or "internal error" in err:
        return Outcome("internal", err[-3000:]), None
    if "\x1b" in stdout.getvalue() + err:
        return Outcome("internal", "an escape sequence from the trace reached the terminal"), None
    if status == 2 and err.startswith("skalpel: error: ") and err.count("\n") == 1:
        return Outcome("error", err.strip()), None
    if status != 0:
        return Outcome("internal", f"exit status {status}: {err[-3000:]}"), None
    report = written[-1] if written else Report.from_json((out / "r.json").read_bytes())
    problems = non_finite(report) + html_non_finite((out / "r.html").read_text(encoding="utf-8", errors="replace"))
    problems += insane(report)
    if problems:
        return Outcome("internal", "; ".join(problems[:5])), report
    return Outcome("ok", ""), report


def non_finite(value: Any, where: str = "report") -> list[str]:
    """Where ``value`` (a Report, or any dataclass, mapping, sequence or number inside one) holds NaN or an infinity."""
    if isinstance(value, float) or type(value).__module__ == "numpy" and hasattr(value, "dtype"):
        try:
            return [] if math.isfinite(float(value)) else [f"{where} = {float(value)}"]
        except (TypeError, ValueError):  # a numpy array: its items
            return [f"{where} = non-finite array"] if not all(math.isfinite(float(v)) for v in value.ravel()) else []
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        found = []
        for field in dataclasses.fields(value):
            found += non_finite(getattr(value, field.name), f"{where}.{field.name}")
        return found
    if isinstance(value, dict):
        return [problem for key, item in value.items() for problem in non_finite(item, f"{where}[{key!r:.40}]")]
    if isinstance(value, (list, tuple)):
        return [problem for i, item in enumerate(value) for problem in non_finite(item, f"{where}[{i}]")]
    if isinstance(value, str) and _NOT_A_NUMBER.search(value):
        return [f"{where} = {value[:120]!r} (a non-finite number in text)"]
    return []


def html_non_finite(html: str) -> list[str]:
    """Places where the HTML report prints NaN or an infinity."""
    return [f"html: ...{html[max(match.start() - 80, 0):match.end() + 20]!r}..." for match in _NOT_A_NUMBER.finditer(html)]


def insane(report: Report) -> list[str]:
    """Numbers a user reads that are not sane: negative times, shares that are not shares."""
    problems = []
    steps = report.steps
    if steps.count < 0 or not steps.median_ms >= 0:
        problems.append(f"steps: count {steps.count}, median {steps.median_ms} ms")
    for rank in report.ranks:
        if not all(ms >= 0 for ms in rank.step_ms):
            problems.append(f"rank {rank.rank}: a step time below 0")
        shares = rank.step_breakdown_pct
        if not all(-0.01 <= value <= 100.01 for value in shares.values()):
            problems.append(f"rank {rank.rank}: step breakdown {shares}")
        elif shares and sum(shares.values()) > 0 and abs(sum(shares.values()) - 100.0) >= 0.5:
            problems.append(f"rank {rank.rank}: step breakdown sums to {sum(shares.values())}")
        if rank.gpu is not None and not 0 <= rank.gpu.idle_pct <= 100.01:
            problems.append(f"rank {rank.rank}: gpu idle {rank.gpu.idle_pct}%")
    return problems
