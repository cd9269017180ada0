"""scripts/add_finding.py writes a finding that the registry takes and whose two tests pass, in a copy of the tree."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO


@pytest.mark.slow
def test_a_new_findings_skeleton_registers_and_its_tests_pass(tmp_path: Path) -> None:
    copy = tmp_path / "tree"
    for part in ("src", "tests", "scripts"):
        shutil.copytree(REPO / part, copy / part, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copy(REPO / "pyproject.toml", copy / "pyproject.toml")
    if (REPO.parent / "shared").exists():  # beside the copy as beside the checkout: the registry reads DESIGN.md there
        (tmp_path / "shared").symlink_to(REPO.parent / "shared")
    env = dict(os.environ, PYTHONPATH=str(copy / "src"))
    made = subprocess.run([sys.executable, str(copy / "scripts" / "add_finding.py"), "optimizer_heavy", "--family",
                           "host", "--lane", "host", "--cause", "optimizer", "--root", str(copy)],
                          capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert "wrote" in made.stdout and (copy / "tests" / "test_rule_optimizer_heavy.py").exists()
    tests = ["tests/test_rule_optimizer_heavy.py", "tests/test_registry.py"]
    pytest_ = [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", *tests]
    ran = subprocess.run([*pytest_, "-k", "not documented"], capture_output=True, text=True, env=env, cwd=copy,
                         timeout=300)  # fmt: skip
    assert ran.returncode == 0, ran.stdout[-3000:]
    assert "passed" in ran.stdout
    # the docs are the author's to write: the registry refuses the skeleton's TODOs until they are
    docs = subprocess.run([*pytest_, "-k", "documented"], capture_output=True, text=True, env=env, cwd=copy, timeout=300)
    assert docs.returncode == 1 and "optimizer_heavy: 'Why it matters' is too short" in docs.stdout
    listed = subprocess.run([sys.executable, "-m", "skalpel", "explain", "optimizer_heavy"], capture_output=True,
                            text=True, env=env, cwd=copy, timeout=120)  # fmt: skip
    assert listed.returncode == 0 and "optimizer_heavy  (host, warning)" in listed.stdout


def test_a_cause_the_lane_lacks_is_refused(tmp_path: Path) -> None:
    made = subprocess.run([sys.executable, str(REPO / "scripts" / "add_finding.py"), "x_bound", "--family", "host",
                           "--lane", "device", "--cause", "python", "--root", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert made.returncode != 0 and "not a cause of the device lane" in made.stderr
