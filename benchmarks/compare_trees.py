"""Do two source trees give the same reports? Byte for byte, on every trace of the corpus.

Runs ``skalpel analyze TARGET --json J --html H`` (terminal report on stdout), ``analyze --json -``
and ``explain --json`` under each tree, for every trace file of ``../shared/traces`` and every folder
that holds trace files, plus ``skalpel diff`` of the corpus's before/after pair, and compares stdout,
stderr, exit status and the written files. Paths of the scratch folder are normalised.

    python benchmarks/compare_trees.py --before /tmp/skalpel-before/src [--after src] [--only SUBSTR]

Prints one line per difference and a count; exits 1 when any output differs. A refactor that must
not change behaviour (issue 19) is checked with it. ``--verdicts`` compares the verdicts only: for every
target, the findings (id, severity, rank) and the rules not judged, before and after, and prints each
change with both titles (a change of behaviour on purpose, issue 33, is listed with it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "traces"
TRACE_SUFFIXES = (".json", ".json.gz")


def targets(corpus: Path) -> list[Path]:
    """Every trace file of the corpus, and every folder that directly holds one."""
    files = sorted(
        p for p in corpus.rglob("*") if p.is_file() and p.name.endswith(TRACE_SUFFIXES) and "README" not in p.name
    )
    folders = sorted({p.parent for p in files})
    return files + folders


def commands(corpus: Path) -> list[tuple[str, list[str], list[str]]]:
    """(label, argv after `skalpel`, names of files the command writes) for each check."""
    out = []
    for target in targets(corpus):
        label = str(target.relative_to(corpus))
        out.append((label, ["analyze", str(target), "--json", "{tmp}/r.json", "--html", "{tmp}/r.html"],
                    ["r.json", "r.html"]))  # fmt: skip
        out.append((label + " [--json -]", ["analyze", str(target), "--json", "-"], []))
    pair = corpus / "hta" / "trace_diff"
    if pair.is_dir():
        out.append(("diff trace_diff", ["diff", str(pair / "control"), str(pair / "test"), "--json", "{tmp}/d.json",
                                        "--html", "{tmp}/d.html"], ["d.json", "d.html"]))  # fmt: skip
    out.append(("explain --json", ["explain", "--json"], []))
    return out


def run(src: Path, argv: list[str], written: list[str]) -> dict[str, bytes]:
    with tempfile.TemporaryDirectory(prefix="skalpel-cmp-") as tmp:
        args = [a.replace("{tmp}", tmp) for a in argv]
        env = dict(os.environ, PYTHONPATH=str(src), COLUMNS="120", NO_COLOR="1")
        done = subprocess.run([sys.executable, "-m", "skalpel", *args], capture_output=True, env=env, cwd=tmp)
        result = {"stdout": done.stdout, "stderr": done.stderr, "rc": str(done.returncode).encode()}
        for name in written:
            path = Path(tmp) / name
            result[name] = path.read_bytes() if path.exists() else b"<missing>"
        return {k: v.replace(tmp.encode(), b"{tmp}") for k, v in result.items()}


def verdict(output: bytes) -> dict[tuple, str]:
    """(id, severity, rank) -> title of each finding of ``analyze --json -``'s report; a not-judged note by its
    rules. An output that is no report (an error) is one entry with its text."""
    try:
        report = json.loads(output)
    except ValueError:
        return {("error",): output.decode(errors="replace")[-200:]}
    found = {}
    for finding in report.get("findings", []):
        if finding["id"] == "not_judged":
            for rule in str(finding["evidence"].get("rules", "")).split(", "):
                found[("not_judged", rule)] = finding["evidence"].get("reason", "")
        else:
            found[(finding["id"], finding["severity"], finding.get("rank"))] = finding["title"]
    return found


def verdict_changes(args: argparse.Namespace) -> int:
    """The verdicts of both trees on every target, and each that changed."""
    checks = [c for c in commands(CORPUS) if args.only in c[0] and c[0].endswith("[--json -]")]

    def compare(check):
        label, argv, written = check
        before, after = (verdict(run(tree, argv, written)["stdout"]) for tree in (args.before, args.after))
        return label, [(key, before.get(key), after.get(key)) for key in sorted(set(before) | set(after), key=str)
                       if key not in before or key not in after]  # fmt: skip

    changed = 0
    with ThreadPoolExecutor(args.jobs) as pool:
        for label, changes in pool.map(compare, checks):
            changed += bool(changes)
            for key, before, after in changes:
                sign = "+" if before is None else "-"
                print(f"{sign} {label.removesuffix(' [--json -]')}: {' '.join(str(part) for part in key)}: "
                      f"{after if before is None else before}", flush=True)
    print(f"{len(checks)} targets, {changed} with a changed verdict")
    return 1 if changed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, type=Path, help="the other tree's src/ folder")
    parser.add_argument("--after", default=ROOT / "src", type=Path, help="this tree's src/ (default)")
    parser.add_argument("--only", default="", help="only targets whose label contains this")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--verdicts", action="store_true", help="compare the findings only, and list each change")
    args = parser.parse_args()
    for tree in (args.before, args.after):  # run from a scratch folder: a relative path would silently miss
        if not (tree.resolve() / "skalpel" / "__init__.py").is_file():
            parser.error(f"{tree} holds no skalpel package (give a tree's src/ folder)")
    args.before, args.after = args.before.resolve(), args.after.resolve()
    if args.verdicts:
        return verdict_changes(args)
    checks = [c for c in commands(CORPUS) if args.only in c[0]]

    def compare(check):
        label, argv, written = check
        before, after = run(args.before, argv, written), run(args.after, argv, written)
        return label, [k for k in before if before[k] != after[k]]

    differing = 0
    with ThreadPoolExecutor(args.jobs) as pool:
        for label, keys in pool.map(compare, checks):
            if keys:
                differing += 1
                print(f"DIFFERS  {label}: {', '.join(keys)}", flush=True)
    print(f"{len(checks)} checks, {differing} differ ({len(targets(CORPUS))} corpus targets)")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
