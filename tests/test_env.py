"""Every SKALPEL_* variable is declared once (skalpel/env.py), documented once (docs/environment.md),
and read through the table."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from skalpel import env
from skalpel.capture import bounded, budget, distributed
from skalpel.trace import parallel

from .conftest import REPO

DOCS = REPO / "docs" / "environment.md"
_NAME = re.compile(r"(?<![A-Za-z0-9_])SKALPEL_[A-Z0-9_]+")
_ROW = re.compile(r"^\| `(SKALPEL_[A-Z0-9_]+)` \| (.*?) \| (.*) \|$")
# defaults written where a test, example or script reads its variable: environ.get("NAME", "default"), ${NAME:-default}
_READ_DEFAULT = re.compile(r'environ\.get\(\s*"(SKALPEL_\w+)",\s*"([^"]*)"|\$\{(SKALPEL_\w+):-([^}]*)\}')


def _sections() -> dict[str, list[tuple[str, str, str]]]:
    """The docs' tables, by section title: (name, default, doc) per row."""
    sections: dict[str, list[tuple[str, str, str]]] = {}
    title = ""
    for line in DOCS.read_text().splitlines():
        if line.startswith("## "):
            title = line[3:]
        elif row := _ROW.match(line):
            sections.setdefault(title, []).append(row.groups())
    return sections


def _repo_files() -> list[Path]:
    """The tracked files (and new ones), the docs page and this test left out."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    skip = {DOCS, Path(__file__).resolve()}
    return [REPO / name for name in listed if (REPO / name).is_file() and (REPO / name).resolve() not in skip]


def _mentions() -> dict[str, set[str]]:
    """Every SKALPEL_* name in the repository -> the files that mention it."""
    found: dict[str, set[str]] = {}
    for path in _repo_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for name in _NAME.findall(text):
            found.setdefault(name, set()).add(str(path.relative_to(REPO)))
    return found


def test_the_docs_table_is_the_package_table() -> None:
    documented = _sections()["skalpel"]
    declared = [(variable.name, variable.shown_default(), variable.doc) for variable in env.VARIABLES]
    assert documented == declared


def test_every_variable_in_the_repository_is_documented_and_none_is_stale() -> None:
    sections = _sections()
    documented = [row[0] for rows in sections.values() for row in rows]
    assert len(documented) == len(set(documented)), "a variable is listed twice"
    mentions = _mentions()
    assert set(mentions) - set(documented) == set(), "undocumented: add to docs/environment.md (the package's: env.py)"
    assert set(documented) - set(mentions) == set(), "documented but read nowhere: remove them"
    # a variable the package reads is in env.py; the development section holds only what the package never reads
    development = {row[0] for row in sections["skalpel's own tests and examples"]}
    in_package = {name for name, files in mentions.items() if any(file.startswith("src/") for file in files)}
    assert in_package == {variable.name for variable in env.VARIABLES}
    assert not development & in_package


def test_the_development_defaults_are_the_ones_their_readers_use() -> None:
    defaults = {name: default for rows in _sections().values() for name, default, _ in rows}
    read = []
    for path in _repo_files():
        if path.suffix in (".py", ""):  # Python, and the dev and .ci/run scripts
            try:
                read += [(m[1] or m[3], m[2] if m[1] else m[4]) for m in _READ_DEFAULT.finditer(path.read_text())]
            except UnicodeDecodeError:
                continue
    assert {name for name, _ in read} >= {"SKALPEL_FUZZ_CASES", "SKALPEL_SCENARIO_BACKEND", "SKALPEL_TORCH_PIN"}
    for name, default in read:
        assert default in defaults[name], f"{name}: read with default {default!r}, documented as {defaults[name]!r}"


def test_the_package_reads_no_variable_by_a_name_of_its_own() -> None:
    """Names are written once, in env.py; the readers use its rows (their ENV_* constants are the rows' names)."""
    quoted = re.compile(r"""["'](SKALPEL_[A-Z0-9_]+)["']""")
    offenders = [f"{path.relative_to(REPO)}: {name}" for path in (REPO / "src").rglob("*.py") if path.name != "env.py"
                 for name in quoted.findall(path.read_text())]  # fmt: skip
    assert offenders == []
    assert distributed.ENV_WAIT == env.RANK_WAIT_S.name and budget.ENV_BUDGET == env.RECORD_BUDGET_MB.name
    assert bounded.STACKS_BUDGET_BYTES == 64 * 2**20


def test_text_is_none_when_unset_or_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(env.RUN_ID.name, raising=False)
    assert env.text(env.RUN_ID) is None
    monkeypatch.setenv(env.RUN_ID.name, "")
    assert env.text(env.RUN_ID) is None
    monkeypatch.setenv(env.RUN_ID.name, "job-7")
    assert env.text(env.RUN_ID) == "job-7"


def test_a_number_that_cannot_be_read_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for raw, expected in (("2.5", 2.5), (" 30 ", 30.0), ("", 120.0), ("soon", 120.0)):
        monkeypatch.setenv(env.RANK_WAIT_S.name, raw)
        assert env.number(env.RANK_WAIT_S) == expected
        assert distributed._wait_s() == expected
    monkeypatch.delenv(env.RANK_WAIT_S.name)
    assert distributed._wait_s() == 120.0
    monkeypatch.setenv(env.STACKS_BUDGET_MB.name, "0.5")
    assert bounded._budget() == 0.5 * 2**20
    monkeypatch.setenv(env.STACKS_BUDGET_MB.name, "lots")
    assert bounded._budget() == 64 * 2**20


def test_the_record_budget_falls_back_to_the_memory_share(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(env.RECORD_BUDGET_MB.name, "16")
    assert budget.budget_bytes() == (16 * 2**20, "$SKALPEL_RECORD_BUDGET_MB")
    for unreadable in ("", "plenty", "nan"):
        monkeypatch.setenv(env.RECORD_BUDGET_MB.name, unreadable)
        chosen = budget.budget_bytes()
        assert chosen is None or "memory available" in chosen[1]


def test_load_processes_takes_whole_numbers_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(env.LOAD_PROCESSES.name, " 3 ")
    assert env.count(env.LOAD_PROCESSES) == 3 and parallel.process_count() == 3
    for ignored in ("", "2.5", "-1", "many"):
        monkeypatch.setenv(env.LOAD_PROCESSES.name, ignored)
        assert env.count(env.LOAD_PROCESSES) is None
    assert parallel.process_count(requested=5) == 5  # --workers wins
