"""Every event is classified once, in trace/: no analysis tests an event's name, and one module builds the device mask.

An AST walk of ``src/skalpel/analysis/`` and ``src/skalpel/diagnose/`` flags:

- ``name-id``: ``.name_id(...)``, looking an event name up by its text;
- ``name-test``: ``.startswith``/``.endswith`` on a name, ``in``/``not in``/``==`` with a name, a regex applied
  to a name. A name is ``<x>.names[...]``, ``names[...]``, ``<x>.name_of(...)``, an element of ``<x>.names``,
  a parameter called ``name``/``names``/``*_name``, or a variable bound from any of these;
- ``device-mask``: ``DEVICE_KIND_ARRAY`` anywhere but analysis/timeline.py (``timeline.device_mask``,
  ``device_events`` and ``device_busy`` are the one device timeline).

Op-specific knowledge (which names are Triton kernels, a collective's type from its name, the FLOP formula of
an aten op) lives in ``trace/roles.py`` and ``trace/opnames.py``, tested once per distinct name there.

    python tests/test_classify_once.py [SRC]    # the offences under SRC (default: this tree's src/), counted
"""

from __future__ import annotations

import ast
import shutil
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEVICE_MASK_HOME = "analysis/timeline.py"

_REGEX_METHODS = {"match", "search", "fullmatch", "findall", "finditer", "sub", "subn"}


def _is_source(node: ast.AST) -> bool:
    """An expression that is an event's name by its form alone: ``<x>.names[...]``, ``names[...]``, ``name_of(...)``."""
    if isinstance(node, ast.Subscript):
        value = node.value
        return (isinstance(value, ast.Attribute) and value.attr == "names") or (
            isinstance(value, ast.Name) and value.id == "names"
        )
    if isinstance(node, ast.Call):
        func = node.func
        return (isinstance(func, ast.Attribute) and func.attr == "name_of") or (
            isinstance(func, ast.Name) and func.id == "name_of"
        )
    return False


def _is_table(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "names"


def _is_name_parameter(arg: str) -> bool:
    return arg in ("name", "names") or arg.endswith("_name")


class _Scope(ast.NodeVisitor):
    """One function (or module) body: which local names hold event names, and the tests made on them."""

    def __init__(self, path: str, found: list[tuple[str, int, str]], tainted: set[str]) -> None:
        self.path, self.found, self.tainted = path, found, set(tainted)

    def _is_name(self, node: ast.AST | None) -> bool:
        """Whether ``node`` is an event's name, or a collection or transformation of names (``name.lower()``)."""
        if node is None:
            return False
        if _is_source(node) or (isinstance(node, ast.Name) and node.id in self.tainted):
            return True
        if isinstance(node, ast.Subscript):
            return self._is_name(node.value)
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and self._is_name(func.value):
                return True  # name.lower(), name.split(...)
            return isinstance(func, ast.Name) and func.id in ("str", "sorted", "set", "list") and any(
                self._is_name(a) for a in node.args
            )
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):
            return self._is_name(node.elt)
        if isinstance(node, ast.DictComp):
            return self._is_name(node.value)
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            return any(self._is_name(e) for e in node.elts)
        if isinstance(node, ast.Dict):
            return any(self._is_name(v) for v in node.values)
        if isinstance(node, ast.IfExp):
            return self._is_name(node.body) or self._is_name(node.orelse)
        if isinstance(node, ast.BinOp):
            return self._is_name(node.left) or self._is_name(node.right)
        return False

    def _yields_names(self, node: ast.AST) -> bool:
        """An iterable whose items are (or hold) names: the table of names, or a call over it (enumerate, zip)."""
        if _is_table(node) or self._is_name(node):
            return True
        return isinstance(node, ast.Call) and any(_is_table(a) or self._is_name(a) for a in node.args)

    def _taint_targets(self, target: ast.AST) -> None:
        for sub in ast.walk(target):
            if isinstance(sub, ast.Name):
                self.tainted.add(sub.id)

    def _flag(self, node: ast.AST, what: str) -> None:
        self.found.append((self.path, node.lineno, what))

    # bindings: taint flows through assignments and loops (run to a fixed point over the body first)
    def bind(self, body: list[ast.stmt]) -> None:
        while True:
            before = len(self.tainted)
            for node in (n for statement in body for n in _walk_local(statement)):
                if isinstance(node, ast.Assign) and self._is_name(node.value):
                    for target in node.targets:
                        self._taint_targets(target)
                elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)) and node.value is not None:
                    if self._is_name(node.value):
                        self._taint_targets(node.target)
                elif isinstance(node, (ast.For, ast.comprehension)) and self._yields_names(node.iter):
                    self._taint_targets(node.target)
            if len(self.tainted) == before:
                return

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        arguments = node.args
        params = {a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]}
        inner = _Scope(self.path, self.found, (self.tainted - params) | {p for p in params if _is_name_parameter(p)})
        body = node.body if isinstance(node.body, list) else [ast.Expr(node.body)]
        inner.bind(body)
        for statement in body:
            inner.visit(statement)

    visit_AsyncFunctionDef = visit_FunctionDef
    visit_Lambda = visit_FunctionDef

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute):
            if func.attr == "name_id":
                self._flag(node, "name-id")
            elif func.attr in ("startswith", "endswith") and self._is_name(func.value):
                self._flag(node, "name-test")
            elif (func.attr in _REGEX_METHODS or (isinstance(func.value, ast.Name) and func.value.id == "re")) and any(
                self._is_name(arg) for arg in node.args
            ):
                self._flag(node, "name-test")
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        operands = [node.left, *node.comparators]
        for op, left, right in zip(node.ops, operands, operands[1:]):
            if isinstance(op, (ast.In, ast.NotIn)) and (self._is_name(left) or self._is_name(right)):
                self._flag(node, "name-test")
            elif isinstance(op, (ast.Eq, ast.NotEq)) and any(
                self._is_name(a) and isinstance(b, ast.Constant) and isinstance(b.value, str)
                for a, b in ((left, right), (right, left))
            ):
                self._flag(node, "name-test")
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id == "DEVICE_KIND_ARRAY" and not self.path.endswith(DEVICE_MASK_HOME):
            self._flag(node, "device-mask")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr == "DEVICE_KIND_ARRAY" and not self.path.endswith(DEVICE_MASK_HOME):
            self._flag(node, "device-mask")
        self.generic_visit(node)


def _walk_local(node: ast.AST):
    """The nodes of a statement, not descending into nested functions (their own scope binds their names)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
        return
    yield node
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            yield from _walk_local(child)


def offences(src: Path, package: str) -> list[tuple[str, int, str]]:
    """(path under skalpel/, line, what) for every event-name test and device-mask build in ``package``."""
    found: list[tuple[str, int, str]] = []
    for file in sorted((src / "skalpel" / package).rglob("*.py")):
        path = file.relative_to(src / "skalpel").as_posix()
        tree = ast.parse(file.read_text(), str(file))
        scope = _Scope(path, found, set())
        scope.bind(tree.body)
        scope.visit(tree)
    return found


def counts(src: Path) -> dict[str, Counter]:
    """Offences per package and kind, and per file."""
    result: dict[str, Counter] = {}
    for package in ("analysis", "diagnose"):
        found = offences(src, package)
        result[package] = Counter(what for _, _, what in found)
        result[package + " files"] = Counter(path for path, _, _ in found)
    return result


def _print_counts(src: Path) -> None:
    for key, counted in counts(src).items():
        print(f"{key}: {sum(counted.values())} {dict(sorted(counted.items()))}")


def test_analysis_classifies_nothing_itself() -> None:
    found = offences(REPO / "src", "analysis")
    _print_counts(REPO / "src")
    assert not found, "event names tested in analysis/ (read trace.role / trace/opnames.py):\n" + "\n".join(
        f"  {path}:{line} {what}" for path, line, what in found
    )


def test_rules_classify_nothing_themselves() -> None:
    found = offences(REPO / "src", "diagnose")
    assert not found, "event names tested in diagnose/ (rules read analysis results):\n" + "\n".join(
        f"  {path}:{line} {what}" for path, line, what in found
    )


def _trace_reads(src: Path) -> list[tuple[str, int]]:
    """Places in diagnose/ that read the trace or compute an analysis: ``<x>.trace`` (``ctx.trace``,
    ``analyses.trace``) and ``<x>.result(...)``, outside rule.py, whose locator reads the events for user lines."""
    found = []
    for path in sorted((src / "skalpel" / "diagnose").glob("*.py")):
        if path.name == "rule.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr in ("trace", "result"):
                found.append((f"diagnose/{path.name}", node.lineno))
    return found


def test_rules_read_analysis_results_only() -> None:
    """No rule reads trace columns or builds an analysis: the bundle computes every result a rule reads."""
    assert _trace_reads(REPO / "src") == []


def test_a_planted_trace_read_in_a_rule_is_found(tmp_path: Path) -> None:
    src = _planted(tmp_path, "diagnose/cpu.py", "def _planted(ctx):\n    return ctx.trace.dur.sum()")
    assert ("diagnose/cpu.py", len((src / "skalpel" / "diagnose" / "cpu.py").read_text().splitlines())) in (
        _trace_reads(src))


def _planted(tmp_path: Path, module: str, body: str) -> Path:
    src = tmp_path / "src"
    shutil.copytree(REPO / "src" / "skalpel", src / "skalpel", ignore=shutil.ignore_patterns("__pycache__"))
    target = src / "skalpel" / module
    target.write_text(target.read_text() + "\n\n" + body + "\n")
    return src


def test_a_planted_name_test_is_found(tmp_path: Path) -> None:
    plants = {
        "startswith": "def _planted(trace, i):\n    return trace.names[i].startswith('triton_')",
        "bound": "def _planted(trace, i):\n    text = trace.name_of(i)\n    return 'Pageable' in text",
        "regex": "import re\ndef _planted(trace):\n    return [n for n in trace.names if re.match('aten::', n)]",
        "name_id": "def _planted(trace):\n    return trace.name_id('aten::mm')",
        "device-mask": "from ..trace.kinds import DEVICE_KIND_ARRAY\ndef _planted(trace):\n    return isin_few(trace.kind, DEVICE_KIND_ARRAY)",
    }
    for label, body in plants.items():
        src = _planted(tmp_path / label, "analysis/ops.py", body)
        found = [f for f in offences(src, "analysis") if f[0] == "analysis/ops.py"]
        assert found, f"the planted {label} went unseen"


def test_a_planted_name_test_in_diagnose_is_found(tmp_path: Path) -> None:
    src = _planted(tmp_path, "diagnose/cpu.py", "def _planted(trace, i):\n    return trace.names[i].endswith('x')")
    by_file = Counter(path for path, _, _ in offences(src, "diagnose"))
    assert by_file["diagnose/cpu.py"] > 0


if __name__ == "__main__":
    _print_counts(Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "src")
