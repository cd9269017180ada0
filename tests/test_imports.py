"""`skalpel analyze`, `diff`, `explain` and `--help` never import torch (only `capture/` may).

Each command runs in a fresh interpreter, through the CLI entry point in-process, and the
interpreter then lists what it imported: torch must not be there, nor the capture modules,
nor what only other commands need (each command builds only its own argument parser).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .conftest import corpus

_PROBE = """
import json, sys
from skalpel.cli import main
try:
    status = main(json.loads(sys.argv[1]))
except SystemExit as exit:
    status = exit.code
print(json.dumps({"status": status, "modules": sorted(sys.modules)}))
"""


def _imported_by(args: list[str], tmp_path) -> tuple[int, set[str]]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(args)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["status"], set(result["modules"])


@pytest.mark.parametrize(
    "command",
    [
        ["--help"],
        ["explain"],
        ["explain", "dataloader_bound", "--json"],
        ["analyze", "{pair}", "--json", "out.json"],
        ["analyze", "{pair}", "--html", "out.html", "--workers", "1"],
        ["diff", "{pair}", "{pair}"],
    ],
    ids=["help", "explain", "explain-id", "analyze-json", "analyze-html", "diff"],
)
def test_command_never_imports_torch(command: list[str], tmp_path) -> None:
    pair = str(corpus("hta/trace_filter"))
    status, modules = _imported_by([part.format(pair=pair) for part in command], tmp_path)
    assert status in (0, None)
    assert "torch" not in modules
    assert not {name for name in modules if name.startswith("skalpel.capture.")} - _HELP_CAPTURE
    if command != ["--help"]:  # the help lists every command's options; a command builds only its own
        assert not _OTHER_COMMANDS & modules
    # the integrations' frameworks (the extras), installed or not, are imported only by what uses them
    assert not {name.split(".")[0] for name in modules} & _EXTRAS
    assert not {name for name in modules if name.startswith(("skalpel.integrations", "skalpel.agent"))}


_EXTRAS = {"lightning", "pytorch_lightning", "transformers", "accelerate", "mcp", "IPython", "ipykernel", "nbclient"}
# The capture modules the help may import: the run's options, with the step signals (boundaries.py: no torch).
_HELP_CAPTURE = {"skalpel.capture.command", "skalpel.capture.settings", "skalpel.capture.boundaries"}
# What only `run`, `demo` and `tune` need for their options (capture settings, tune candidates, traceback).
_OTHER_COMMANDS = {"skalpel.capture", *_HELP_CAPTURE, "skalpel.tune.command", "skalpel.tune.candidates"}


def test_json_to_stdout_of_one_rank_imports_no_terminal_renderer(tmp_path) -> None:
    status, modules = _imported_by(["analyze", str(corpus("hta/trace_filter/sampled_rank-0.json.gz")), "--json", "-"],
                                   tmp_path)  # fmt: skip
    assert status == 0
    assert "skalpel.job.build" in modules  # the report was made
    assert not {"rich", "skalpel.report.terminal", "difflib"} & modules  # nothing prints it; one rank: no matching


def test_help_imports_no_analysis_or_terminal_renderer(tmp_path) -> None:
    status, modules = _imported_by(["--help"], tmp_path)
    assert status == 0
    heavy = {"numpy", "rich.console", "skalpel.analysis", "skalpel.trace.loader", "skalpel.diagnose"}
    assert not heavy & modules
