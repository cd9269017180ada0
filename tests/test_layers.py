"""The layering is a checked contract: `lint-imports` keeps `.importlinter` on this tree, and breaks on a planted breach.

`.importlinter` names the layers (contract at the bottom, commands at the top) and forbids
cycles between sibling modules; function-local imports count, so a lazy import cannot hide an
arrow that points up. The planted cases copy the package, add one import, and run the same check.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO

CONTRACT = REPO / ".importlinter"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint(src: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    if not LINT_IMPORTS.exists():
        pytest.fail(f"lint-imports not installed beside {sys.executable} (the test extra installs import-linter)")
    env = dict(os.environ, PYTHONPATH=str(src))
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", str(CONTRACT)], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=120)  # fmt: skip


def _planted(tmp_path: Path, module: str, line: str) -> Path:
    """A copy of the package whose ``module`` (a path under skalpel/) gains a function-local import ``line``."""
    src = tmp_path / "src"
    shutil.copytree(REPO / "src" / "skalpel", src / "skalpel", ignore=shutil.ignore_patterns("__pycache__"))
    target = src / "skalpel" / module
    target.write_text(target.read_text() + f"\n\ndef _planted():\n    {line}  # noqa\n")
    return src


def test_the_tree_keeps_its_layers() -> None:
    done = _lint(REPO / "src", REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


@pytest.mark.parametrize(
    ("module", "line", "named"),
    [
        ("trace/model.py", "from ..tune import command", "skalpel.trace.model -> skalpel.tune.command"),
        ("result/report.py", "from ..diagnose import registry", "skalpel.result.report -> skalpel.diagnose.registry"),
        ("analysis/ops.py", "from ..report import terminal", "skalpel.analysis.ops -> skalpel.report.terminal"),
        ("result/diff.py", "from ..files import write_file", "skalpel.result.diff -> skalpel.files"),
    ],
    ids=["trace-imports-tune", "contract-imports-diagnose", "analysis-imports-renderer", "contract-imports-files"],
)
def test_a_planted_upward_import_breaks_the_contract(tmp_path: Path, module: str, line: str, named: str) -> None:
    done = _lint(_planted(tmp_path, module, line), tmp_path)
    assert done.returncode != 0
    assert named in " ".join(done.stdout.split())  # the report names the import that points up


def test_a_planted_cycle_between_siblings_breaks_the_contract(tmp_path: Path) -> None:
    # job.build imports analysis.bundle; analysis importing job back closes a circle (and points up)
    done = _lint(_planted(tmp_path, "analysis/bundle.py", "from ..job import build"), tmp_path)
    assert done.returncode != 0
    assert "skalpel.analysis.bundle -> skalpel.job.build" in " ".join(done.stdout.split())
