"""A green CI means something: under SKALPEL_CI=1 a missing prerequisite fails the test instead of skipping it.

Runs pytest in a subprocess on a small test file that asks for a corpus trace that is
not there and for Chromium (absent or not): locally the first is skipped with its reason
printed (-rs), under CI it fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO

pytestmark = pytest.mark.slow  # starts pytest in a subprocess

PROBE = '''
from tests.conftest import corpus


def test_needs_a_corpus_trace():
    corpus("no/such/trace.json.gz")
'''


def _pytest(probe: Path, strict: bool) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "SKALPEL_CI"}
    if strict:
        env["SKALPEL_CI"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(probe)],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=300)  # fmt: skip


def test_missing_corpus_skips_locally_and_fails_under_ci() -> None:
    probe = REPO / "tests" / "test_zz_strictness_probe.py"  # inside tests/, so that conftest and -rs apply
    probe.write_text(PROBE)
    try:
        local, strict = _pytest(probe, strict=False), _pytest(probe, strict=True)
    finally:
        probe.unlink()
    assert local.returncode == 0 and "1 skipped" in local.stdout
    assert "SKIPPED" in local.stdout and "shared trace corpus not found" in local.stdout  # the reason is printed
    assert strict.returncode == 1 and "1 failed" in strict.stdout
    assert "shared trace corpus not found" in strict.stdout and "SKALPEL_CI=1" in strict.stdout
