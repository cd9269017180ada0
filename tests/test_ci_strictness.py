"""A green CI means something: every skip goes through conftest, and under SKALPEL_CI=1 a skip fails the run
unless its reason is on the reviewed allow-list (tests/skip_allowlist.txt); every run ends with its list of skips;
CI runs Hypothesis derandomised.

The probes run pytest in a subprocess on small test files in ``tmp_path``, with tests/conftest.py
loaded as a plugin (``-p tests.conftest``): nothing is written into tests/.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ALLOWLIST, REPO, allowed_skips

PROBE = '''
import pytest

from tests.conftest import corpus, importorskip, skip, skip_unless


def test_needs_a_corpus_trace():
    corpus("no/such/trace.json.gz")


def test_skipped_for_an_allowed_reason():
    skip("more workers than one core cannot be faster (probe)")


@skip_unless(False, "a reason nobody reviewed")
def test_skipped_by_a_mark():
    pass


def test_needs_a_module_that_is_not_there():
    importorskip("no_such_module_for_skalpel")


def test_skipped_by_pytest_itself():
    pytest.skip("pytest.skip, called directly")


def test_runs():
    pass


def test_ci_runs_hypothesis_derandomised():
    import os

    from hypothesis import settings

    strict = os.environ.get("SKALPEL_CI") == "1"
    assert settings().derandomize is strict and (settings().deadline is None or not strict)
'''


def _pytest(tmp_path: Path, strict: bool, *options: str) -> subprocess.CompletedProcess:
    probe = tmp_path / "test_probe.py"
    probe.write_text(PROBE)
    # CI and TF_BUILD: Hypothesis loads its own derandomised profile where it sees them; the probe decides
    env = {key: value for key, value in os.environ.items() if key not in ("SKALPEL_CI", "CI", "TF_BUILD")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    if strict:
        env["SKALPEL_CI"] = "1"
    command = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-p", "tests.conftest",
               "--rootdir", str(tmp_path), *options, str(probe)]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)


@pytest.mark.slow  # starts pytest in a subprocess
def test_skips_pass_locally_and_fail_under_ci_unless_allowed(tmp_path: Path) -> None:
    local = _pytest(tmp_path, strict=False)
    assert local.returncode == 0 and "2 passed, 5 skipped" in local.stdout, local.stdout
    assert "shared trace corpus not found" in local.stdout  # the reason is printed (-rs)
    summary = local.stdout[local.stdout.index("skips (5)"):]  # the list at the end of the run
    assert "test_needs_a_corpus_trace: shared trace corpus not found" in summary
    assert "no_such_module_for_skalpel not installed" in summary
    assert summary.count("[allowed]") == 1 and summary.count("[not on the CI allow-list]") == 4

    strict = _pytest(tmp_path, strict=True)
    # a skip in a test's call fails it; one in its setup (a skip mark) errors it: both make the run red
    assert strict.returncode == 1 and "3 failed, 2 passed, 1 skipped, 1 error" in strict.stdout, strict.stdout
    for reason in ("shared trace corpus not found", "a reason nobody reviewed", "no_such_module_for_skalpel",
                   "pytest.skip, called directly"):  # fmt: skip
        assert re.search(re.escape(reason) + r".*SKALPEL_CI=1", strict.stdout), reason
    assert strict.stdout.count("[FAILED in CI]") == 4 and strict.stdout.count("[allowed]") == 1
    assert not list((REPO / "tests").glob("test_probe*"))

    ran = _pytest(tmp_path, True, "-k", "test_runs")  # no skip: the section says so
    assert ran.returncode == 0 and "skips (0)" in ran.stdout and "no test skipped" in ran.stdout, ran.stdout


def test_the_allow_list_is_short_and_every_entry_says_why() -> None:
    entries = allowed_skips()
    assert 0 < len(entries) <= 5, f"{ALLOWLIST.name} is a short, reviewed list"
    assert all(len(why) >= 30 for why in entries.values()), entries


def test_every_skip_goes_through_conftest() -> None:
    """No test file skips by pytest's own calls: they would skip silently where conftest's hook does not look."""
    direct = re.compile(r"pytest\.(skip\(|importorskip\(|mark\.skipif\(|mark\.skip\b)")
    found = [f"{path.name}:{number}: {line.strip()}"
             for path in sorted((REPO / "tests").glob("*.py")) if path.name not in ("conftest.py", Path(__file__).name)
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if direct.search(line) and not line.lstrip().startswith(("#", '"', "'"))]  # fmt: skip
    assert found == [], found


@pytest.mark.slow  # starts pytest with two xdist workers in a subprocess
def test_under_xdist_the_skips_are_listed_once_and_ci_still_fails_on_them(tmp_path: Path) -> None:
    """``./dev test`` runs on xdist workers: the skips are judged in the worker that ran the test, and the
    controller, which prints the summary, lists each one once and ends red under SKALPEL_CI=1."""
    workers = ("-n", "2", "--dist", "load")  # load: the probe's tests spread over both workers
    local = _pytest(tmp_path, False, *workers)
    assert local.returncode == 0 and "2 passed, 5 skipped" in local.stdout, local.stdout
    summary = local.stdout[local.stdout.index("skips (5)"):]
    assert summary.count("[allowed]") == 1 and summary.count("[not on the CI allow-list]") == 4, summary

    strict = _pytest(tmp_path, True, *workers)
    assert strict.returncode == 1 and "3 failed, 2 passed, 1 skipped, 1 error" in strict.stdout, strict.stdout
    assert "skips (5)" in strict.stdout, strict.stdout
    assert strict.stdout.count("[FAILED in CI]") == 4 and strict.stdout.count("[allowed]") == 1, strict.stdout
    assert "bringing up nodes" in strict.stdout, strict.stdout  # xdist ran it
