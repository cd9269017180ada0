"""Shared fixtures: the stored real traces in ../shared/traces, one way to skip, and what CI must not skip.

Every skip goes through ``skip``, ``skip_unless`` or ``importorskip`` here (``test_ci_strictness``
checks that no test file calls pytest's own). Locally a skipped test prints its reason (``-rs`` in
pyproject.toml) and the run ends with the list of skips. Under CI (``SKALPEL_CI=1``, set by
``.ci/run``) a skip whose reason is not on the reviewed allow-list ``tests/skip_allowlist.txt``
fails the test instead, whatever raised it: a green CI means that everything ran. CI also loads
a derandomised Hypothesis profile, so that a red run can be run again to the same result.

``./dev test`` runs the suite on two pytest-xdist workers, a file's tests on one worker (``--dist loadfile``:
a module fixture's real runs happen once). The skips are judged where the test ran and listed by the
process that prints the summary; a real run several files read (``demo_run``) is made once per test run,
whichever worker asks first.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
TRACES = SHARED / "traces"
DESIGN = SHARED / "DESIGN.md"
ALLOWLIST = Path(__file__).resolve().parent / "skip_allowlist.txt"
STRICT = os.environ.get("SKALPEL_CI") == "1"
"""Under CI a skip not on the allow-list fails the test."""

# A suite started in the background of a non-interactive shell (`./dev test &` in a script) inherits SIGINT
# ignored, and passes that on to every process it starts: Python then installs no KeyboardInterrupt handler,
# and the tests that press Ctrl-C on a real `skalpel run` or `tune` wait for a signal nobody hears. The
# suite's own processes get the interactive default back (a handler is reset to "default" across exec).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

try:  # the test extra has Hypothesis; conftest must not need it
    from hypothesis import settings as _hypothesis_settings

    _hypothesis_settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
    if STRICT:
        _hypothesis_settings.load_profile("ci")
except ImportError:  # pragma: no cover
    pass


def skip(reason: str) -> None:
    """Skip the test with ``reason`` (under CI a failure unless the reason is on the allow-list)."""
    pytest.skip(reason)


def skip_unless(condition: bool, reason: str) -> pytest.MarkDecorator:
    """A mark that skips the test with ``reason`` when ``condition`` is false (CI: see ``skip``)."""
    return pytest.mark.skipif(not condition, reason=reason)


def importorskip(module: str):
    """The module ``module``, or a skip saying it is not installed (CI: see ``skip``)."""
    return pytest.importorskip(module, reason=f"{module} not installed")


def missing(reason: str) -> None:
    """Skip the test for a missing prerequisite (the corpus, Chromium): under CI a failure."""
    skip(reason)


def corpus(relative: str) -> Path:
    """Path of a stored trace; skips the test when the shared corpus is not beside the checkout (fails under CI)."""
    path = TRACES / relative
    if not path.exists():
        missing(f"shared trace corpus not found: {path}")
    return path


def uncompressed_copy(tmp_path: Path, name: str, keep: float = 1.0) -> Path:
    """The corpus trace ``name`` gunzipped into ``tmp_path`` (its first ``keep`` share only: a cut-off file)."""
    import gzip

    data = gzip.decompress(corpus(name).read_bytes())
    target = tmp_path / corpus(name).name.removesuffix(".gz")
    target.write_bytes(data[: int(len(data) * keep)])
    return target


# ---- real runs shared by the tests that read them ------------------------------------------------------------------


def _run_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The temporary folder of this whole test run: under xdist the workers' common parent, else the base."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextmanager
def _locked(path: Path):
    """Hold an exclusive lock on the file ``path`` (created if missing): one worker at a time."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """One real ``skalpel demo`` with its defaults (24 steps, two windows): (the finished process, its run folder),
    run once per test run for the tests of several files that read its report and pages: under xdist the first
    worker to ask runs it while the others wait on its lock, then read what it left."""
    import subprocess
    import sys

    root = _run_root(tmp_path_factory)
    folder, record = root / "demo-run" / "demo", root / "demo-run" / "done.json"
    with _locked(root / "demo-run.lock"):
        if not record.exists():
            folder.parent.mkdir(exist_ok=True)
            done = subprocess.run([sys.executable, "-m", "skalpel", "demo", "--out", str(folder)], capture_output=True,
                                  text=True, timeout=600, cwd=folder.parent)  # fmt: skip
            fields = {"args": done.args, "returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr}
            record.write_text(json.dumps(fields))
    return subprocess.CompletedProcess(**json.loads(record.read_text())), folder


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under xdist, the files with the most slow tests first (stable: a file keeps its order): with ``--dist
    loadfile --no-loadscope-reorder`` (``./dev test``) the long files start at once and the quick ones fill the
    workers' last minutes, instead of a lone torchrun file running at the end on one worker."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    slow: dict[Path, int] = {}
    for item in items:
        slow[item.path] = slow.get(item.path, 0) + (item.get_closest_marker("slow") is not None)
    items.sort(key=lambda item: -slow[item.path])


# ---- files that need the machine to themselves ---------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def _machine_share(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """A file marked ``alone`` (``pytestmark``: real multi-rank jobs, straggler and contention verdicts that follow
    the load) runs while no other file does; the other files share the machine. Under xdist on 2 cores, a
    torchrun job beside another file's real runs was judged on a machine at twice its load, and its verdict
    changed with it (CI, 2026-12-05: a straggler from 3x the calls not named). A file lock: shared for the other
    files, exclusive for an ``alone`` one; a turnstile lets the exclusive one in as soon as the current file ends,
    instead of waiting for a moment when no worker holds its share."""
    alone = request.node.get_closest_marker("alone") is not None
    root = _run_root(tmp_path_factory)
    with open(root / "machine.turnstile", "a") as turnstile, open(root / "machine.lock", "a") as share:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(share, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(share, fcntl.LOCK_UN)


# ---- negative controls that run on a busy machine instead of skipping -------------------------------------------


def pinned(env: dict[str, str] | None = None) -> dict:
    """``subprocess`` keyword arguments that run a child on one core with one thread (``OMP_NUM_THREADS=1``):
    a real-run negative control asks the machine for no more than it has. The core is the last this process may
    use, counted from the end by the xdist worker's number (gw0 the last, gw1 the one before): two workers'
    controls do not share one core while the other has none."""
    cores = sorted(os.sched_getaffinity(0))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    core = cores[-1 - int(worker) % len(cores)] if worker.isdigit() else cores[-1]
    return {
        "preexec_fn": lambda: os.sched_setaffinity(0, {core}),
        "env": {**(env if env is not None else os.environ), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
    }


def assert_not_blamed(contention: dict) -> None:
    """A ``cpu_contention`` finding (JSON) on a script that asks for one thread on its one core: other processes
    took the core, and the fix must say so instead of telling the script to change."""
    evidence = contention["evidence"]
    assert evidence["threads_asked"] == 1 and evidence["cores_available"] == 1, evidence
    assert "set_num_threads" not in contention["fix"] and "num_workers" not in contention["fix"], contention["fix"]
    assert "other processes" in contention["fix"], contention["fix"]


# ---- the skip allow-list and the list of skips at the end of a run -------------------------------------------


def allowed_skips() -> dict[str, str]:
    """The allow-list: the start of each skip reason CI accepts -> why (``reason -- why`` a line, # comments)."""
    entries = {}
    for line in ALLOWLIST.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            reason, _, why = line.partition(" -- ")
            entries[reason.strip()] = why.strip()
    return entries


def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


_SKIPS: dict[str, tuple[str, bool]] = {}  # test id -> (reason, on the allow-list), in the order seen


def _judge_skip(report: pytest.TestReport | pytest.CollectReport) -> None:
    """Where the test ran: mark a skip on its report (``skalpel_skip``, which xdist carries to the controller with
    the report) and, under CI, turn one not on the allow-list into a failure."""
    if not report.skipped or hasattr(report, "wasxfail"):  # an expected failure is not a skip
        return
    reason = _skip_reason(report)
    allowed = any(reason.startswith(entry) for entry in allowed_skips())
    report.skalpel_skip = (reason, allowed)
    if STRICT and not allowed:
        report.outcome = "failed"
        report.longrepr = f"{reason} (skipped under SKALPEL_CI=1: CI runs every test not on {ALLOWLIST.name})"


def _note_skip(report: pytest.TestReport | pytest.CollectReport) -> None:
    """Where the summary is printed (the controller under xdist, which sees every worker's reports): list it."""
    judged = getattr(report, "skalpel_skip", None)
    if judged is not None:
        reason, allowed = judged
        _SKIPS.setdefault(report.nodeid, (reason, allowed))  # each xdist worker collects, and reports, a module


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _judge_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _judge_skip(outcome.get_result())


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _note_skip(report)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    _note_skip(report)


def pytest_terminal_summary(terminalreporter) -> None:
    terminalreporter.section(f"skips ({len(_SKIPS)})")
    if not _SKIPS:  # said all the same: a run (and its CI log) shows that the skips were looked for
        terminalreporter.write_line("no test skipped")
    for nodeid, (reason, allowed) in _SKIPS.items():
        mark = "allowed" if allowed else ("FAILED in CI" if STRICT else "not on the CI allow-list")
        terminalreporter.write_line(f"{nodeid}: {reason} [{mark}]")
