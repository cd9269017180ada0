"""The README and docs/*.md against the code, so that they cannot drift (issue 19, item 7).

- Every ``skalpel ...`` line of a ``bash`` block parses as ``skalpel.cli.main`` parses it: the
  subcommand exists and each ``--option`` is one that subcommand accepts, written in full.
- A ``bash`` block after ``<!-- test: run -->`` is run through ``skalpel.cli.main``: each of its
  commands must exit 0. Paths under ``../shared/traces`` are corpus traces.
- A ``text`` block after ``<!-- test: output of the command above -->`` is an excerpt of the
  output of that run block's command (``...`` marks a cut).
- Benchmark lines name a script of ``benchmarks/`` and options it defines; ``./dev`` lines a
  command of ``dev``.
- Relative links, and repository paths in inline code, point to files that exist.

docs/testing.md says the same for the writers of the docs.
"""

from __future__ import annotations

import argparse
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from skalpel import cli
from tests.conftest import REPO, corpus

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL = "bash"
RUN = "<!-- test: run -->"
OUTPUT = "<!-- test: output of the command above -->"
CORPUS_PREFIX = "../shared/traces/"
WIDTH = "100"  # the terminal width the output excerpts were copied at
# Written in parallel by other engineers (issue 19); they exist once the branches are merged.
LATER_PAGES = {"docs/environment.md", "docs/architecture.md"}
# Inline code that names a file of the repository; `skalpel/...` is a path inside src/.
REPO_PATH = re.compile(r"^(?:src|tests|benchmarks|examples|docs|\.ci|skalpel)/[\w./*-]+$")
DEV_COMMANDS = {"demo", "test", "setup"}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    marker: str  # the `<!-- test: ... -->` comment just before the block, or ""

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def split_page(page: Path) -> tuple[list[Block], str]:
    """The fenced blocks of ``page``, and its prose (the text outside them)."""
    blocks, prose = [], []
    lines = page.read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        if not line.startswith("```"):
            prose.append(line)
            index += 1
            continue
        end = next((i for i in range(index + 1, len(lines)) if lines[i].startswith("```")), None)
        assert end is not None, f"{page.relative_to(REPO)}:{index + 1}: a fenced block is never closed"
        before = next((lines[i].strip() for i in range(index - 1, -1, -1) if lines[i].strip()), "")
        marker = before if before.startswith("<!-- test") else ""
        blocks.append(Block(page, index + 1, line[3:].strip(), "\n".join(lines[index + 1 : end]), marker))
        index = end + 1
    return blocks, "\n".join(prose)


BLOCKS = [block for page in PAGES for block in split_page(page)[0]]
SHELL_BLOCKS = [block for block in BLOCKS if block.lang == SHELL]


def shell_lines(block: Block) -> list[tuple[int, list[str]]]:
    """(line number, words) of each command of a shell block, comments dropped, continuations joined."""
    commands, pending = [], ""
    for offset, line in enumerate(block.text.splitlines(), start=1):
        pending += line
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        words = shlex.split(pending, comments=True)
        pending = ""
        if words:
            commands.append((block.line + offset, words))
    return commands


def skalpel_argv(words: list[str]) -> list[str] | None:
    """The words after ``skalpel`` (or ``-m skalpel``), or None when the line runs something else."""
    if words[0] == "skalpel":
        return words[1:]
    for index in range(len(words) - 1):
        if words[index : index + 2] == ["-m", "skalpel"]:
            return words[index + 2 :]
    return None


def skalpel_commands(blocks: list[Block]) -> list[tuple[str, list[str]]]:
    return [
        (f"{block.page.relative_to(REPO)}:{line}", argv)
        for block in blocks
        for line, words in shell_lines(block)
        if (argv := skalpel_argv(words)) is not None
    ]


COMMANDS = skalpel_commands(SHELL_BLOCKS)
RUN_BLOCKS = [block for block in SHELL_BLOCKS if block.marker == RUN]


def test_the_docs_have_examples_to_check():
    """The collection itself: a change to the parsing above that found nothing would pass every test below."""
    assert len(PAGES) >= 9, [p.name for p in PAGES]
    assert len(COMMANDS) >= 30
    assert len(RUN_BLOCKS) >= 4
    assert any(block.marker == OUTPUT for block in BLOCKS)


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.where)
def test_every_block_names_its_language_and_markers_are_known(block):
    assert block.lang, f"{block.where}: name the block's language (bash, text, python, ...) so it is checked"
    assert block.marker in ("", RUN, OUTPUT), f"{block.where}: unknown marker {block.marker!r}"
    if block.marker == RUN:
        assert block.lang == SHELL, f"{block.where}: only {SHELL} blocks are run"
        assert skalpel_commands([block]), f"{block.where}: a run block with no skalpel command"
    if block.marker == OUTPUT:
        assert block.lang == "text", f"{block.where}: an output excerpt is a text block"


def parse(argv: list[str], capsys) -> tuple[argparse.ArgumentParser, list[str]]:
    """Parse ``argv`` as ``cli.main`` does; returns the parser that owns its options and the words that are ours."""
    parser = cli.build_parser(argv[0] if argv else None)
    words, _script_args = cli.split_script_args(parser, argv)
    try:
        args = parser.parse_args(words)
    except SystemExit as stop:  # argparse's way to say "bad arguments" (2), or --help/--version (0)
        code = stop.code
    else:
        code = None
    if code is not None:
        error = capsys.readouterr().err.strip().splitlines()
        assert code == 0, f"skalpel {shlex.join(argv)}: {error[-1] if error else code}"
        return parser, words
    script_args = getattr(args, "args", None) or []  # run and tune: the script's own words
    ours = words[: len(words) - len(script_args)]
    return (cli._subparser(parser, args.command) if args.command else parser), ours


@pytest.mark.parametrize("where, argv", COMMANDS, ids=[where for where, _ in COMMANDS])
def test_every_skalpel_command_parses(where, argv, capsys):
    assert argv, f"{where}: `skalpel` alone; name a command"
    known = set(cli._COMMANDS)
    assert argv[0] in known or argv[0].startswith("-"), f"{where}: no command {argv[0]!r} (there are {sorted(known)})"
    parser, ours = parse(argv, capsys)
    accepted = {option for action in parser._actions for option in action.option_strings}
    for word in ours:
        if word.startswith("--") and word != "--":
            option = word.split("=", 1)[0]
            assert option in accepted, f"{where}: `skalpel {argv[0]}` has no {option} (it has {sorted(accepted)})"


def real_argv(argv: list[str]) -> list[str]:
    """``argv`` with corpus paths made absolute (the test skips, or fails under CI, without the corpus)."""
    return [str(corpus(word[len(CORPUS_PREFIX) :])) if word.startswith(CORPUS_PREFIX) else word for word in argv]


def normalised(text: str) -> str:
    """Text without the panels' box drawing and with every run of whitespace one space: wrapping aside."""
    return " ".join(re.sub("[\u2500-\u257f]", " ", text).split())


def excerpt_after(block: Block) -> Block | None:
    later = [b for b in BLOCKS if b.page == block.page and b.line > block.line]
    return later[0] if later and later[0].marker == OUTPUT else None


@pytest.mark.parametrize("block", RUN_BLOCKS, ids=lambda b: b.where)
def test_runnable_examples_run(block, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("COLUMNS", WIDTH)
    monkeypatch.chdir(tmp_path)  # anything a command writes lands here, not in the checkout
    outputs = []
    for where, argv in skalpel_commands([block]):
        capsys.readouterr()
        code = cli.main(real_argv(argv))
        captured = capsys.readouterr()
        assert code == 0, f"{where}: skalpel {shlex.join(argv)} exited {code}: {captured.err.strip()[-500:]}"
        outputs.append(captured.out)
    excerpt = excerpt_after(block)
    if excerpt is None:
        return
    assert len(outputs) == 1, f"{excerpt.where}: an output excerpt follows a run block of one command"
    printed = normalised(outputs[0])
    for part in re.split(r"^\.\.\.$", excerpt.text, flags=re.M):
        if part.strip():
            assert normalised(part) in printed, f"{excerpt.where}: not in the output any more:\n{part.strip()}"


BENCHMARK_LINES = [
    (f"{block.page.relative_to(REPO)}:{line}", words)
    for block in SHELL_BLOCKS
    for line, words in shell_lines(block)
    if any(word.startswith("benchmarks/") and word.endswith(".py") for word in words)
]


@pytest.mark.parametrize("where, words", BENCHMARK_LINES, ids=[where for where, _ in BENCHMARK_LINES])
def test_benchmark_lines_name_real_scripts_and_options(where, words):
    script = next(word for word in words if word.startswith("benchmarks/") and word.endswith(".py"))
    path = REPO / script
    assert path.is_file(), f"{where}: no {script}"
    source = path.read_text(encoding="utf-8")
    for word in words[words.index(script) + 1 :]:
        if word.startswith("--"):
            assert f'"{word.split("=", 1)[0]}"' in source, f"{where}: {script} defines no option {word}"


def test_dev_lines_name_dev_commands():
    lines = [(block.where, words) for block in SHELL_BLOCKS for _, words in shell_lines(block) if "./dev" in words]
    assert lines
    for where, words in lines:
        command = words[words.index("./dev") + 1 : words.index("./dev") + 2]
        assert command and command[0] in DEV_COMMANDS, f"{where}: ./dev {' '.join(command)} is not a dev command"


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for the headings of ``page``."""
    _, prose = split_page(page)
    headings = re.findall(r"^#+\s+(.*)$", prose, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_point_to_files(page):
    _, prose = split_page(page)
    for target in re.findall(r"\]\(([^)\s]+)\)", prose):
        if re.match(r"^[a-z]+:", target):
            continue  # https:, mailto:
        file, _, anchor = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        name = path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else str(path)
        if name in LATER_PAGES and not path.exists():
            continue
        assert path.exists(), f"{page.relative_to(REPO)}: link to {target}: no such file"
        if anchor and path.suffix == ".md":
            assert anchor in anchors(path), f"{page.relative_to(REPO)}: link to {target}: no such heading"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_repository_paths_in_inline_code_exist(page):
    blocks, prose = split_page(page)
    words = re.findall(r"`([^`\n]+)`", prose)
    words += [word for block in blocks if block.lang == SHELL for _, line in shell_lines(block) for word in line]
    for word in words:
        if not REPO_PATH.match(word):
            continue
        base = REPO / "src" if word.startswith("skalpel/") else REPO
        assert list(base.glob(word)), f"{page.relative_to(REPO)}: `{word}` does not exist"
