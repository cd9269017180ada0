"""Where tune's edits go in the user's file: the whole statement a site belongs to, from the file's AST.

A call's frame line is the first line of its statement, and a statement may run over several lines
(``model = Net(\\n    a,\\n    b,\\n)``): an edit placed after that first line would not parse. So a site
names its statement's first and last lines (``end_lineno``), and the edits replace the whole statement
or go after its last line. ``apply`` writes a candidate's edits into the file's text (the tests parse
the result for every candidate). Nothing here imports torch.
"""

from __future__ import annotations

import ast
import functools
import re
import textwrap
from pathlib import Path
from typing import Any


@functools.lru_cache(maxsize=64)
def _spans(path: str) -> tuple[tuple[int, int, bool], ...]:
    """Every statement's (first line, last line, simple) in the file; a compound one (for, with, if) spans its
    header only. Empty when the file cannot be read or parsed."""
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return ()
    spans = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.stmt):
            continue
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
            spans.append((node.lineno, max(node.lineno, body[0].lineno - 1), False))
        else:
            spans.append((node.lineno, node.end_lineno or node.lineno, True))
    return tuple(spans)


def statement_at(path: str, line: int) -> dict[str, Any] | None:
    """The innermost statement holding ``line``: ``{line, end_line, indent, code, simple}``, its code dedented;
    None when the file does not parse or no statement holds the line."""
    holding = [span for span in _spans(path) if span[0] <= line <= span[1]]
    if not holding:
        return None
    first, last, simple = min(holding, key=lambda span: (span[1] - span[0], -span[0]))
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()[first - 1 : last]
    except OSError:
        return None
    indent = re.match(r"\s*", lines[0]).group(0) if lines else ""
    code = textwrap.dedent("\n".join(lines)).strip()
    return {"line": first, "end_line": last, "indent": indent, "code": code, "simple": simple}


def parses(code: str | None) -> bool:
    """``code`` (one statement or several, dedented) is valid Python."""
    if not code:
        return False
    try:
        ast.parse(textwrap.dedent(code))
    except SyntaxError:
        return False
    return True


def apply(source: str, changes: list[dict[str, Any]]) -> str:
    """``source`` with ``changes`` written in: each replaces the whole statement it names (``line``..``end_line``)
    with its ``after``, at the statement's indentation; one with no line (``torch.set_num_threads`` at the start)
    goes after the file's last top-level import. Changes with nothing to write, or on a statement an earlier
    change already rewrote, are left out."""
    lines = source.splitlines()
    placed: list[tuple[int, int, list[str]]] = []
    for change in changes:
        after = change.get("after")
        if not after:
            continue
        first, last = change.get("line"), change.get("end_line")
        if first is None:
            at = _after_imports(source)
            placed.append((at + 1, at, after.splitlines()))
            continue
        if any(first <= end and start <= last for start, end, _ in placed if start <= end):
            continue  # the statement was rewritten already
        indent = re.match(r"\s*", lines[first - 1]).group(0) if first - 1 < len(lines) else ""
        placed.append((first, last, [indent + text if text else text for text in after.splitlines()]))
    for first, last, new in sorted(placed, key=lambda item: (item[0], item[1]), reverse=True):
        lines[first - 1 : last] = new
    return "\n".join(lines) + "\n"


def _after_imports(source: str) -> int:
    """The last line of the file's last top-level import (0: none): where a line for the start of the script goes."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return 0
    ends = [node.end_lineno or node.lineno for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    return max(ends, default=0)
