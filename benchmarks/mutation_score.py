"""Mutation score of the fast tests on trace/ and analysis/: how many small planted bugs a test catches.

Each mutant changes one thing in one module (a comparison, an operator, ``+=`` into ``=``,
``and`` into ``or``, True into False, or a simple statement deleted), in a temporary copy of
the checkout; the fast tests that name the module, else its package's end-to-end tests
(``-m "not slow"``, first failure stops them), then run on the copy. A mutant is killed when they fail (or time out), survives when
they pass. The mutants are a seeded random sample over the modules (``--mutants``, ``--seed``),
so a run is repeatable and a survivor can be looked at again. No new dependency: ``ast`` and
``tokenize`` find the places to mutate.

    python benchmarks/mutation_score.py --mutants 40
    python benchmarks/mutation_score.py --modules trace/parallel.py analysis/mfu.py --mutants 20

It prints each mutant (file:line, the change, killed or SURVIVED, seconds) and the score.
"""

from __future__ import annotations

import argparse
import ast
import io
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tokenize
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("trace", "analysis")
SWAPS = {  # operator token -> its mutant
    "<": "<=", "<=": "<", ">": ">=", ">=": ">", "==": "!=", "!=": "==",
    "+": "-", "-": "+", "*": "/", "/": "*", "//": "*", "+=": "=", "-=": "=", "and": "or", "or": "and",
    "True": "False", "False": "True", "is": "is not", "in": "not in",
}  # fmt: skip
IGNORED = shutil.ignore_patterns(".git", ".venv", ".ruff_cache", ".inductor-cache", "__pycache__", "*.pyc")


@dataclass(frozen=True)
class Mutant:
    module: str  # relative to src/skalpel, e.g. "trace/parallel.py"
    line: int  # 1-based
    col: int
    old: str
    new: str

    def label(self) -> str:
        change = f"delete `{self.old.strip()[:60]}`" if self.new == "pass" else f"`{self.old}` -> `{self.new}`"
        return f"{self.module}:{self.line} {change}"

    def apply(self, source: str) -> str:
        lines = source.splitlines(keepends=True)
        text = lines[self.line - 1]
        if self.new == "pass":  # the whole statement, on its one line
            indent = text[: len(text) - len(text.lstrip())]
            lines[self.line - 1] = f"{indent}pass\n"
        else:
            assert text[self.col : self.col + len(self.old)] == self.old, (self, text)
            lines[self.line - 1] = text[: self.col] + self.new + text[self.col + len(self.old) :]
        return "".join(lines)


def mutants_of(module: str) -> list[Mutant]:
    source = (REPO / "src" / "skalpel" / module).read_text()
    found = []
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    previous = None
    for token in tokens:
        text = token.string
        if token.type in (tokenize.OP, tokenize.NAME) and text in SWAPS:
            if text == "in" and previous == "not":
                continue
            if text in ("-", "+") and previous in ("(", "[", ",", "=", "return", None, ":"):
                continue  # a sign, not a subtraction
            if text == "*" and previous in ("(", ",", "["):
                continue  # *args, not a product
            found.append(Mutant(module, token.start[0], token.start[1], text, SWAPS[text]))
        if token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT):
            previous = text
    tree = ast.parse(source)
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            statements = getattr(node, field, None)
            for statement in statements if isinstance(statements, list) else []:  # a lambda's body is one node
                simple = isinstance(statement, (ast.AugAssign, ast.Expr, ast.Assign)) and not (
                    isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)  # a docstring
                )
                if simple and statement.lineno == statement.end_lineno:
                    line = source.splitlines()[statement.lineno - 1]
                    found.append(Mutant(module, statement.lineno, statement.col_offset, line.strip(), "pass"))
    return [mutant for mutant in found if _parses(mutant.apply(source))]  # `is not not`, `for x not in`: dropped


def _parses(source: str) -> bool:
    try:
        ast.parse(source)
    except SyntaxError:
        return False
    return True


# For a module no test names (the loader's helpers, say): the tests that run its package end to end.
PACKAGE_TESTS = {
    "trace": ("tests/test_loader_corpus.py", "tests/test_loader_bad_input.py", "tests/test_hostile_traces.py"),
    "analysis": ("tests/test_findings_rules.py", "tests/test_findings_wild.py", "tests/test_findings_corpus.py"),
}


def tests_for(module: str) -> list[str]:
    """Test files that name the module (its import path or ``from ..package import name``) or are named after it
    (``tests/test_blame_peers.py`` tests ``blame_peers.py`` through ``run_analyses``), else its package's."""
    stem = Path(module).stem
    package = Path(module).parent.name
    pattern = re.compile(rf"\b{package}\.{stem}\b|from skalpel\.{package} import[^\n]*\b{stem}\b|\b{stem}\b\.")
    named = sorted(str(path.relative_to(REPO)) for path in (REPO / "tests").glob("test_*.py")
                   if path.stem == f"test_{stem}" or pattern.search(path.read_text()))  # fmt: skip
    return named or list(PACKAGE_TESTS.get(package, ()))


def run_tests(copy: Path, tests: list[str], timeout_s: float) -> tuple[bool, float]:
    """(passed, seconds) of the fast tests on the copy."""
    env = {**os.environ, "PYTHONPATH": str(copy / "src"), "PYTHONDONTWRITEBYTECODE": "1"}
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-m", "not slow", "-p", "no:cacheprovider", *tests]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=copy, env=env, capture_output=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return False, time.perf_counter() - start  # a hang is caught too
    return done.returncode == 0, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mutants", type=int, default=40, help="how many mutants to try (a seeded sample)")
    parser.add_argument("--seed", type=int, default=24)
    parser.add_argument("--modules", nargs="*", help="modules relative to src/skalpel (default: trace/ and analysis/)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per mutant's tests (over it: killed)")
    args = parser.parse_args()
    modules = args.modules or sorted(
        str(path.relative_to(REPO / "src" / "skalpel"))
        for package in PACKAGES for path in (REPO / "src" / "skalpel" / package).glob("*.py")
        if path.name != "__init__.py"
    )  # fmt: skip
    tested = {module: tests_for(module) for module in modules}
    pool = [mutant for module in modules if tested[module] for mutant in mutants_of(module)]
    untested = [module for module in modules if not tested[module]]
    sample = random.Random(args.seed).sample(pool, min(args.mutants, len(pool)))
    print(f"{len(pool)} mutants in {len(modules) - len(untested)} modules; trying {len(sample)} (seed {args.seed})")
    if untested:
        print(f"no test names: {', '.join(untested)}")
    killed = 0
    with tempfile.TemporaryDirectory(prefix="skalpel-mutants-") as temp:
        copy = Path(temp) / "repo"
        shutil.copytree(REPO, copy, ignore=IGNORED)
        shared = REPO.parent / "shared"
        if shared.exists():  # the corpus beside the checkout, as tests/conftest.py expects it
            (Path(temp) / "shared").symlink_to(shared)
        for number, mutant in enumerate(sorted(sample, key=lambda m: (m.module, m.line)), 1):
            target = copy / "src" / "skalpel" / mutant.module
            original = target.read_text()
            target.write_text(mutant.apply(original))
            try:
                passed, seconds = run_tests(copy, tested[mutant.module], args.timeout)
            finally:
                target.write_text(original)
            killed += not passed
            verdict = "SURVIVED" if passed else "killed"
            print(f"[{number}/{len(sample)}] {verdict:8} {seconds:6.1f} s  {mutant.label()}", flush=True)
    score = 100.0 * killed / max(len(sample), 1)
    print(f"mutation score: {killed}/{len(sample)} killed ({score:.0f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
