"""`skalpel diff` and the CLI take bad values calmly: one line that names the problem, never a traceback.

Hand-edited report.json files (a wrong type anywhere names the field), option values
that make no sense, an empty path, a UTF-8 byte order mark, special files (a FIFO,
/dev/zero, a loop of symbolic links), and one damaged rank file among good ones.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from skalpel.cli import main

from .test_hostile_traces import OPS, _step, _write

STEPS = [_step(1, 0, 300), _step(2, 300, 300), _step(3, 600, 300)]


def _one_line_error(capsys, *argv: str) -> str:
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.startswith("skalpel: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


def _usage_error(capsys, *argv: str) -> str:
    """argparse rejects the value: exit status 2 and the reason, before anything runs."""
    with pytest.raises(SystemExit) as stopped:
        main(list(argv))
    assert stopped.value.code == 2
    return capsys.readouterr().err


@pytest.fixture()
def report_json(tmp_path: Path, capsys) -> Path:
    trace = _write(tmp_path / "trace.json", STEPS + OPS)
    path = tmp_path / "report.json"
    assert main(["analyze", str(trace), "--json", str(path)]) == 0
    capsys.readouterr()
    return path


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (lambda d: d["ranks"][0]["top_ops"][0].__setitem__("self_ms", "fast"), "ranks[0].top_ops[0].self_ms: expected a number, got a string"),
        (lambda d: d.__setitem__("steps", [1, 2]), "steps: expected an object, got a list"),
        (lambda d: d["steps"].__setitem__("count", 2.5), "steps.count: expected an integer, got a number"),
        (lambda d: d["source"].__setitem__("paths", "trace.json"), "source.paths: expected a list, got a string"),
        (lambda d: d["findings"][0].__setitem__("severity", "meh"), "findings[0].severity: expected one of critical"),
        (lambda d: d["findings"][0].__setitem__("evidence", None), "findings[0].evidence: expected an object, got null"),
        (lambda d: d["ranks"][0].__setitem__("step_breakdown_pct", {"kernel": "x"}), "ranks[0].step_breakdown_pct"),
        (lambda d: d.__setitem__("ranks", {"0": {}}), "ranks: expected a list, got an object"),
        (lambda d: d["ranks"][0].pop("step_ms"), "ranks[0]: the field 'step_ms' is missing"),
        (lambda d: d.__setitem__("warnings", [1]), "warnings: expected a list"),
    ],
    ids=["op-time", "steps", "count", "paths", "severity", "evidence", "breakdown", "ranks", "missing", "warnings"],
)
def test_hand_edited_report_names_the_field(report_json: Path, tmp_path: Path, capsys, edit, named) -> None:
    document = json.loads(report_json.read_text())
    edit(document)
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(document))
    message = _one_line_error(capsys, "diff", str(report_json), str(edited))
    assert "AFTER" in message and named in message, message


def test_report_and_trace_with_a_byte_order_mark(report_json: Path, tmp_path: Path, capsys) -> None:
    bom_report = tmp_path / "bom-report.json"
    bom_report.write_bytes(b"\xef\xbb\xbf" + report_json.read_bytes())
    bom_trace = tmp_path / "bom-trace.json"
    bom_trace.write_bytes(b"\xef\xbb\xbf" + (tmp_path / "trace.json").read_bytes())
    assert main(["diff", str(bom_report), str(bom_trace)]) == 0
    assert "no change beyond the noise" in capsys.readouterr().out
    assert main(["analyze", str(bom_trace)]) == 0


@pytest.mark.parametrize("value", ["nan", "-1", "inf", "-inf", "five"])
def test_fail_if_slower_takes_a_finite_percentage(report_json: Path, capsys, value) -> None:
    err = _usage_error(capsys, "diff", str(report_json), str(report_json), f"--fail-if-slower={value}")
    assert "--fail-if-slower" in err


@pytest.mark.parametrize("argv", [["run", "--nproc", "0", "x.py"], ["run", "--nproc", "-2", "x.py"],
                                  ["commbench", "--nproc", "0"], ["commbench", "--iters", "0"], ["demo", "--steps", "0"]])  # fmt: skip
def test_counts_must_be_positive(capsys, argv) -> None:
    assert "a count must be 1 or more" in _usage_error(capsys, *argv)


@pytest.mark.parametrize(("argv", "words"), [
    (["analyze", "--workers", "five", "t.json"], "expected a count, got 'five'"),
    (["analyze", "--rank", "-1", "t.json"], "a rank number must be 0 or more, got -1"),
    (["analyze", "--rank", "r0", "t.json"], "expected a rank number, got 'r0'"),
])  # fmt: skip
def test_counts_and_ranks_say_what_they_expected(capsys, argv, words) -> None:
    """One factory (cli._int_at_least) for both, each with its floor and its words."""
    err = _usage_error(capsys, *argv)
    assert words in err and "Traceback" not in err


def test_rank_zero_is_a_rank() -> None:
    from skalpel.cli import _RANK

    assert _RANK("0") == 0


def test_empty_path_is_an_error_not_the_current_folder(report_json: Path, capsys) -> None:
    assert "an empty path ('')" in _one_line_error(capsys, "analyze", "")
    assert "BEFORE: an empty path ('')" in _one_line_error(capsys, "diff", "", str(report_json))


def test_special_files_are_named(tmp_path: Path, report_json: Path, capsys) -> None:
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    loop = tmp_path / "loop.json"
    loop.symlink_to(tmp_path / "loop2.json")
    (tmp_path / "loop2.json").symlink_to(loop)
    assert "a named pipe (FIFO), not a trace file" in _one_line_error(capsys, "analyze", str(fifo))
    assert "a device file, not a trace file" in _one_line_error(capsys, "analyze", "/dev/zero")
    assert "a loop of symbolic links" in _one_line_error(capsys, "analyze", str(loop))
    assert "AFTER" in _one_line_error(capsys, "diff", str(report_json), str(fifo))
    assert "BEFORE" in _one_line_error(capsys, "diff", str(loop), str(report_json))


def test_path_too_long(tmp_path: Path, capsys) -> None:
    message = _one_line_error(capsys, "analyze", str(tmp_path / ("x" * 300 + ".json")))
    assert "the path is too long for the file system" in message and len(message) < 400


def test_one_corrupt_rank_file_is_reported_and_the_others_analysed(tmp_path: Path) -> None:
    from skalpel.api import analyze

    folder = tmp_path / "job"
    folder.mkdir()
    for rank in (0, 1, 3):
        _write(folder / f"trace-rank{rank}.json", STEPS + OPS)
    (folder / "trace-rank2.json").write_text('{"traceEvents": [{"ph": "X", "na')
    report = analyze(folder)
    assert [rank.rank for rank in report.ranks] == [0, 1, 3]
    notes = " | ".join(report.warnings)
    assert "skipped a file that does not load" in notes and "trace-rank2.json" in notes


def test_a_folder_where_no_file_loads(tmp_path: Path, capsys) -> None:
    for rank in (0, 1):
        (tmp_path / f"trace-rank{rank}.json").write_text("not json")
    assert "none of the 2 files loads" in _one_line_error(capsys, "analyze", str(tmp_path))


_COMMANDS = ("analyze", "diff", "run", "demo", "explain", "commbench", "tune", "watch", "history", "mcp")


def test_help_and_a_misspelt_command_name_every_command(capsys) -> None:
    """A command builds only its own parser (cli.build_parser); the help and a misspelt command still list all."""
    with pytest.raises(SystemExit) as stopped:
        main(["--help"])
    assert stopped.value.code == 0
    listed = re.findall(r"^    (\w+)", capsys.readouterr().out, re.M)
    assert tuple(listed) == _COMMANDS
    err = _usage_error(capsys, "analyse", "trace.json")
    assert "invalid choice: 'analyse' (choose from " + ", ".join(f"'{name}'" for name in _COMMANDS) + ")" in err


@pytest.mark.parametrize(
    ("command", "options"),
    [("run", ("--warmup", "--step-on", "--nproc")), ("demo", ("--repeat",)), ("tune", ("--try", "--budget")),
     ("watch", ("--cooldown", "--show"))],
)
def test_a_command_built_alone_keeps_its_options(capsys, command: str, options: tuple[str, ...]) -> None:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = capsys.readouterr().out
    assert out.startswith(f"usage: skalpel {command} ")
    assert all(option in out for option in options)
