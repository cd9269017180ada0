"""Add a new finding's skeleton: its rule on the ledger, its thresholds, its registration and both tests.

    python scripts/add_finding.py ID --family FAMILY --lane host|device --cause CAUSE [--share PCT] [--floor MS]

writes, as ruff's ``add_rule.py`` does for a lint rule:

* ``src/skalpel/diagnose/ID.py``: the ``Rule`` with its docs under the five headings, and a check that
  fires when CAUSE holds PCT% or more of the lane's steady time (one-time work taken out) and FLOOR ms
  a unit or more, reading the ledger only;
* a ``Threshold`` named after the id at the end of ``src/skalpel/diagnose/thresholds.py``;
* the module's registration in ``src/skalpel/diagnose/registry.py``;
* ``tests/test_rule_ID.py``: a firing case and its quiet look-alike on hand-built ledgers.

Then write the docs (the TODOs), a look-alike in the Kineto schema (``tests/ledger_lookalikes.py``), and a
line in docs/findings.md. ``--root`` writes into another checkout (the generator's own test uses it).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from string import Template

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from skalpel.analysis.ledger import DEVICE_CAUSES, HOST_CAUSES  # after the path is set

RULE = Template('''"""$id: TODO one line: what the finding says, in the user's words."""

from __future__ import annotations

from . import thresholds
from .rule import Context, Docs, Outcome, Rule


def _check(ctx: Context, rule: Rule) -> Outcome:
    ledger = ctx.analyses.ledger
    findings = []
    for rank, found in (ledger.ranks.items() if ledger is not None else ()):
        lane = found.lane("$lane")
        if lane is None:
            continue
        share = lane.share_pct("$cause", steady=True)
        ms = lane.ms_per_unit("$cause")
        if share < rule.thresholds.share_pct or ms < rule.thresholds.floor:
            continue
        evidence = {"share_pct": share, "ms_per_unit": ms, "judged_over": found.describe()}
        findings.append(rule.finding(evidence, severity=rule.severity_for(share), rank=rank))
    return findings


$const = Rule(
    id="$id",
    family="$family",
    severity="warning",
    title="$words takes {share_pct:.0f}% of the $lane's time ({ms_per_unit:.1f} ms a unit)",
    thresholds=thresholds.$const,
    check=_check,
    fix="TODO: the one-line fix a user applies",
    docs=Docs(
        what="TODO: what it detects: `$cause` on the $lane lane of the ledger (skalpel explain ledger).",
        why="TODO: why it matters.",
        evidence="The share of the lane's steady time (one-time work taken out) and the ms a unit.",
        fix="TODO: how to fix it.",
        false_positives="TODO: what looks alike and is not.",
    ),
)

RULES = ($const,)
''')

THRESHOLD = Template('''
$const = Threshold($share, "of the $lane's steady time in $cause", $floor, "ms a unit")
''')

TEST = Template('''"""$id on hand-built ledgers: the cause it names fires it, its look-alike stays quiet."""

from __future__ import annotations

import pytest

from skalpel.diagnose.$module import $const
from tests.ledger_fixtures import ledger_context


def test_${id}_fires_where_${cause}_holds_the_$lane():
    ctx = ledger_context($lane={"$cause": 60.0, "$other": 40.0})
    [finding] = $const.check(ctx, $const)
    assert finding.id == "$id"
    assert finding.evidence["share_pct"] == pytest.approx(60.0)


def test_${id}_is_quiet_on_its_look_alike():
    """The same cause, a small share of the unit."""
    ctx = ledger_context($lane={"$cause": 1.0, "$other": 99.0})
    assert $const.check(ctx, $const) == []
''')


def add(root: Path, finding_id: str, family: str, lane: str, cause: str, share: float, floor: float) -> list[Path]:
    """Write the skeleton into the checkout at ``root``; the paths written or changed."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", finding_id):
        raise SystemExit(f"add_finding: an id is lower_snake_case: {finding_id!r}")
    causes = DEVICE_CAUSES if lane == "device" else HOST_CAUSES
    if cause not in causes:
        raise SystemExit(f"add_finding: {cause!r} is not a cause of the {lane} lane: {', '.join(causes)}")
    diagnose = root / "src" / "skalpel" / "diagnose"
    module = diagnose / f"{finding_id}.py"
    if module.exists():
        raise SystemExit(f"add_finding: {module} exists")
    const = finding_id.upper()
    other = next(name for name in ("compute", "python") if name in causes and name != cause)
    words = {"id": finding_id, "module": finding_id, "const": const, "family": family, "lane": lane, "cause": cause,
             "other": other, "words": cause.replace("_", " ").capitalize(), "share": f"{share:g}", "floor": f"{floor:g}"}
    module.write_text(RULE.substitute(words))
    thresholds = diagnose / "thresholds.py"
    thresholds.write_text(thresholds.read_text() + THRESHOLD.substitute(words))
    registry = diagnose / "registry.py"
    text = registry.read_text()
    text = text.replace("from .rule import Rule\n", f"from . import {finding_id}\nfrom .rule import Rule\n", 1)
    text = text.replace("_FAMILIES = (", f"_FAMILIES = ({finding_id}, ", 1)
    registry.write_text(text)
    test = root / "tests" / f"test_rule_{finding_id}.py"
    test.write_text(TEST.substitute(words))
    return [module, thresholds, registry, test]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("id", help="the finding's id, lower_snake_case (public and stable)")
    parser.add_argument("--family", required=True, help="its family (input, device, memory, ...)")
    parser.add_argument("--lane", choices=("host", "device"), required=True, help="the ledger lane it reads")
    parser.add_argument("--cause", required=True, help="the ledger cause it names (skalpel explain ledger)")
    parser.add_argument("--share", type=float, default=20.0, help="fires at this share of the steady time (20)")
    parser.add_argument("--floor", type=float, default=2.0, help="... and this many ms a unit (2)")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to write into")
    args = parser.parse_args(argv)
    for path in add(args.root, args.id, args.family, args.lane, args.cause, args.share, args.floor):
        print(f"wrote {path}")
    print("then: the docs' TODOs, a look-alike in tests/ledger_lookalikes.py, a line in docs/findings.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
