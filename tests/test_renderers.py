"""Every renderer of every table (report/base.py, tune/renderers.py) on the same stored results.

A Report renderer is tried on an empty report, one with one finding, one of several ranks and one
with torch.compile regions; a diff renderer on two comparisons of them; a tune renderer on a
result with a winner and a failure. Each stored result carries HOSTILE (or full_report's EVIL
names) where names from a trace or a script go. Then the lookups, and ``--out FILE`` on the command line.
"""

from __future__ import annotations

import json
from html import escape
from importlib import resources
from pathlib import Path

import jsonschema
import pytest

from skalpel.cli import main
from skalpel.errors import SkalpelError
from skalpel.report.base import DIFF_RENDERERS, RENDERERS, HtmlRenderer, TextRenderer, for_path, named
from skalpel.result.diff import DiffResult, diff_reports
from skalpel.result.report import Report
from skalpel.tune.renderers import TUNE_RENDERERS
from skalpel.tune.result import Baseline, CandidateResult, TuneResult

from .report_fixtures import (
    EVIL,
    EVIL_SCRIPT,
    EVIL_TITLE,
    HOSTILE,
    STORED_REPORTS,
    compiled_report,
    full_report,
    one_finding_report,
    several_ranks_report,
    tiny_kineto,
)


def tune_result() -> TuneResult:
    change = {"location": f"train.py:31 in {HOSTILE}", "before": "DataLoader(ds)",
              "after": "DataLoader(ds, num_workers=2)", "edit": "pass num_workers=2 to DataLoader(...)"}  # fmt: skip
    winner = CandidateResult("num_workers", "build batches in worker processes", "finding dataloader_bound",
                             {"dataloader": {"num_workers": 2}}, [change], verdict="faster", median_ms=20.0,
                             noise_pct=3.0, speedup=1.8, change_pct=-44.4, band_pct=3.0, run_ms=[20.0, 20.6], runs=2,
                             steps=20)  # fmt: skip
    broken = CandidateResult("compile", "torch.compile the model", "--try", {"compile": "default"}, [],
                             verdict="error", runs=1, error=f"RuntimeError: {HOSTILE}")  # fmt: skip
    return TuneResult(f"train{HOSTILE}.py", ["--lr", "0.1"], 3, 10, 2, 2, "cpu", ["dataloader_bound"],
                      "a profiled run (skalpel run)", Baseline(36.0, 2.5, [36.0, 35.2, 36.4], 3, 30),
                      [winner, broken], [], ["num_workers"], 300.0)  # fmt: skip


HOSTILES = (HOSTILE, EVIL, EVIL_TITLE, EVIL_SCRIPT)  # full_report's names are the last three
STORED = {
    "report": STORED_REPORTS,
    "diff": {
        "finding_appeared": lambda: diff_reports(compiled_report(), one_finding_report(), labels=("before", "after")),
        "same_ranks": lambda: diff_reports(several_ranks_report(), several_ranks_report(), labels=("a", "b")),
    },
    "tune": {"winner_and_error": tune_result},
}
TABLES = {"report": RENDERERS, "diff": DIFF_RENDERERS, "tune": TUNE_RENDERERS}
SCHEMAS = {"report": ("skalpel.result", "report.schema.json"), "diff": ("skalpel.result", "diff.schema.json"),
           "tune": ("skalpel.tune", "tune.schema.json")}  # fmt: skip
CASES = [(kind, renderer, case) for kind, table in TABLES.items() for renderer in table for case in STORED[kind]]


def must_show(result: Report | DiffResult | TuneResult, form: str) -> list[str]:
    """What a reader must find in the ``form`` (text, html) of ``result``, as plain text."""
    if isinstance(result, Report):
        nothing = {"text": "No findings were produced for this trace.", "html": "No bottleneck found."}[form]
        shown = [finding.title for finding in result.findings] or [nothing]
        if len(result.ranks) > 1:
            shown += [f"rank {rank.rank}" for rank in result.ranks]
        regions = [row for rank in result.ranks for row in rank.extra.get("compiled", {}).get("regions", ())]
        return shown + [row["location"] for row in regions]
    if isinstance(result, DiffResult):
        titles = [change.after.title for change in result.appeared] + [change.before.title for change in result.disappeared]
        return [*titles, f"({result.step.change_pct:+.1f}%)"]
    return ["Recommended", *result.recommended, *(entry.name for entry in result.candidates)]


@pytest.mark.parametrize(("kind", "renderer", "case"), CASES, ids=[f"{k}-{r.name}-{c}" for k, r, c in CASES])
def test_every_renderer_renders_every_stored_result(kind: str, renderer, case: str) -> None:
    result = STORED[kind][case]()
    out = renderer().render(result)
    assert isinstance(out, bytes) == renderer.binary and isinstance(out, (str, bytes))
    if renderer.name == "json":
        package, name = SCHEMAS[kind]
        jsonschema.validate(json.loads(out), json.loads(resources.files(package).joinpath(name).read_text()))
        if kind == "report":
            assert Report.from_json(out) == result  # reads back to the very report
        else:
            assert json.loads(out)["schema"] == f"skalpel.{kind}/1"
    elif renderer.name == "text":
        assert "\x1b[" not in out  # no colour codes in a file
        words = " ".join(out.split())  # rich wraps long lines inside its panels
        for text in must_show(result, "text"):
            assert " ".join(text.split()) in words, text
    else:
        assert renderer.name == "html" and out.startswith("<!DOCTYPE html>") and out.endswith("</html>\n")
        assert not [name for name in HOSTILES if name in out]  # a name from the trace is text, never markup
        assert [name for name in HOSTILES if escape(name) in out]
        for text in must_show(result, "html"):
            assert escape(text) in out, text


@pytest.mark.parametrize("kind", TABLES)
def test_each_table_has_one_renderer_per_extension_and_name(kind: str) -> None:
    table = TABLES[kind]
    assert {renderer.name for renderer in table} == {"json", "html", "text"}
    for renderer in table:
        assert for_path(f"out/x{renderer.extension}", table) is renderer
        assert for_path(f"X{renderer.extension.upper()}", table) is renderer  # REPORT.HTML is an HTML page too
        assert named(renderer.name, table) is renderer


@pytest.mark.parametrize("path", ["report.pdf", "report", "report.json.gz"])
def test_an_unknown_extension_is_a_clear_error(path: str) -> None:
    with pytest.raises(SkalpelError, match=r"cannot tell what to write to .* from its extension .* \.json, \.html, \.txt"):
        for_path(path)


def test_options_are_checked_when_the_renderer_is_built() -> None:
    with pytest.raises(TypeError, match="flame"):
        HtmlRenderer(flame=["not", "a", "tree"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="width"):
        TextRenderer(width=3)
    with pytest.raises(TypeError):
        TextRenderer(flame={})  # type: ignore[call-arg]  # an option of another renderer
    page = HtmlRenderer(flame={"name": "root", "value": 2.0, "children": []}).render(one_finding_report())
    assert 'id="flame-data"' in page and "no Python call stacks" not in page


@pytest.mark.parametrize("extension", [".json", ".html", ".txt"])
def test_analyze_out_writes_the_format_its_extension_names(extension: str, tmp_path: Path, capsys) -> None:
    trace = tiny_kineto(tmp_path / "t.json", op_name=HOSTILE)
    out = tmp_path / f"report{extension}"
    assert main(["analyze", str(trace), "--out", str(out), "--json", str(tmp_path / "same.json")]) == 0
    assert out.name in capsys.readouterr().out.replace("\n", "")  # "wrote PATH" (rich folds a long path anywhere)
    written = out.read_bytes()
    if extension == ".json":
        assert written == (tmp_path / "same.json").read_bytes()
        Report.from_json(written)
    elif extension == ".html":
        page = written.decode()
        assert page.startswith("<!DOCTYPE html>") and 'id="flame-data"' in page  # the flame graph was built for it
        assert HOSTILE not in page and escape(HOSTILE) in page
    else:
        assert "verdict" in written.decode() and "\x1b[" not in written.decode()


def test_diff_out_and_a_bad_extension_fails_before_any_work(tmp_path: Path, capsys) -> None:
    trace = tiny_kineto(tmp_path / "t.json")
    page = tmp_path / "diff.html"
    assert main(["diff", str(trace), str(trace), "--out", str(page)]) == 0
    assert "<h1>skalpel diff</h1>" in page.read_text()
    capsys.readouterr()
    for command in (["analyze", str(tmp_path / "missing")], ["diff", "nope", "nope"], ["tune", "nope.py"]):
        assert main([command[0], "--out", str(tmp_path / "x.pdf"), *command[1:]]) == 2  # tune's options go first
        assert "cannot tell what to write to" in capsys.readouterr().err  # not "no such file": the lookup comes first
    assert not (tmp_path / "x.pdf").exists()


def test_the_steps_line_of_a_job_says_its_count_pools_the_ranks() -> None:
    """A job's step count is every rank's steps together: 3 ranks of 12 steps read "36 steps (12 on each of 3
    ranks)", never "36 steps" (256 ranks of one step read as 256 steps next to "Only 1 profiled step")."""
    text = named("text")().render(full_report(ranks=3, steps=12))
    assert "36 steps (12 on each of 3 ranks): median 100.00 ms" in text
    one = named("text")().render(full_report(ranks=1, steps=12))
    assert "12 steps: median 100.00 ms" in one and "on each of" not in one
