"""A real notebook, executed by nbclient in a fresh ipykernel of this interpreter: ``skalpel.profile()`` runs inside
a cell, and the session and ``skalpel.analyze()``'s Report show as the self-contained HTML report."""

from __future__ import annotations

import html
import json
import re
import sys
from pathlib import Path

import pytest

from .conftest import importorskip

pytestmark = pytest.mark.slow
SRC = Path(__file__).resolve().parent.parent / "src"

CELLS = [
    """import torch, skalpel
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
with skalpel.profile(out=OUT) as run:
    for step in range(14):
        optimizer.zero_grad()
        model(torch.randn(32, 128)).sum().backward()
        optimizer.step()
        run.step()""",
    "run",
    "report = skalpel.analyze(OUT)\nreport",
]


def _kernel_spec(root: Path) -> str:
    """A kernel spec for this interpreter (the venv's), with the worktree's skalpel first on its path."""
    folder = root / "kernels" / "skalpel-test"
    folder.mkdir(parents=True)
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "skalpel test", "language": "python", "env": {"PYTHONPATH": str(SRC)}}  # fmt: skip
    (folder / "kernel.json").write_text(json.dumps(spec))
    return "skalpel-test"


def _page(output: dict) -> str:
    """The whole HTML page inside an output's iframe."""
    markup = output["data"]["text/html"]
    found = re.fullmatch(r'<iframe class="skalpel-report" srcdoc="(.*?)" style="[^"]*"></iframe>', markup, re.S)
    assert found, markup[:300]
    return html.unescape(found.group(1))


def test_notebook_shows_the_report_inline(tmp_path, monkeypatch) -> None:
    nbformat = importorskip("nbformat")
    nbclient = importorskip("nbclient")
    importorskip("ipykernel")
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    kernel = _kernel_spec(tmp_path / "jupyter")
    out = tmp_path / "run"
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(f"OUT = {str(out)!r}")] + [nbformat.v4.new_code_cell(c) for c in CELLS]
    nbclient.NotebookClient(notebook, kernel_name=kernel, timeout=300,
                            resources={"metadata": {"path": str(tmp_path)}}).execute()  # fmt: skip
    profiled, shown_run, shown_report = notebook.cells[1:]
    assert not [o for o in profiled.outputs if o["output_type"] == "error"], profiled.outputs
    run_page = _page(shown_run.outputs[0])
    assert run_page == (out / "report.html").read_text(encoding="utf-8")  # the run folder's page, flame graph and all
    report_page = _page(shown_report.outputs[0])
    assert report_page.startswith("<!DOCTYPE html>") and "Verdict" in report_page

    import skalpel
    from skalpel.report.html import render

    assert report_page == render(skalpel.analyze(out))  # the same report, rendered here from the same run folder
    for page in (run_page, report_page):  # self-contained: nothing to fetch
        assert not re.search(r'(src|href)="(https?:)?//', page) and "default-src 'none'" in page
