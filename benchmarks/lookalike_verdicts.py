"""What skalpel says today on the look-alike traces of issue 33 (``tests/ledger_lookalikes.py``).

Builds every case (a planted failure shape and its quiet twin per class) into a scratch folder,
runs ``skalpel.api.analyze`` on each and prints, per case: the engineer's verdict, the steps and
each rank's step breakdown, the findings (id, severity, title) and the not-judged notes. Nothing
is timed: it is a before/after record of verdicts for the ledger's work.

    python benchmarks/lookalike_verdicts.py [--keep DIR] [--only PREFIX ...]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests/ is a package of the checkout, not of the installed skalpel

from skalpel.api import analyze
from tests.ledger_lookalikes import CASES, Case, write


def _breakdown(rank) -> str:
    shares = sorted(rank.step_breakdown_pct.items(), key=lambda item: -item[1])
    return ", ".join(f"{name} {share:.1f}%" for name, share in shares if share >= 0.5)


def describe(case: Case, folder: Path) -> list[str]:
    """The lines printed for one case."""
    report = analyze(write(case.build(), folder, case.name))
    kind = "planted" if case.planted else "twin"
    steps = report.steps
    lines = [
        f"## {case.name} (class {case.issue_class}, {kind})",
        f"expected: {case.expect}",
        (f"steps: {steps.count} {'marked' if steps.marked else 'unmarked (pseudo-steps)'}, median {steps.median_ms:.2f} "
         f"ms; device: {report.source.device}; ranks: {len(report.ranks)}"),
    ]
    for rank in report.ranks:
        gpu = f"; gpu idle {rank.gpu.idle_pct:.1f}%" if rank.gpu is not None else ""
        lines.append(f"  rank {rank.rank}: {_breakdown(rank)}{gpu}")
    for finding in report.findings:
        if finding.id == "not_judged":
            continue
        where = f" [rank {finding.rank}]" if finding.rank is not None else ""
        lines.append(f"  - {finding.id} {finding.severity}{where}: {finding.title}")
    for finding in report.findings:
        if finding.id == "not_judged":
            lines.append(f"  . {finding.title}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="write the traces here (kept) instead of a temporary folder")
    parser.add_argument("--only", nargs="*", default=[], help="case names starting with these")
    args = parser.parse_args(argv)
    cases = [case for case in CASES if not args.only or case.name.startswith(tuple(args.only))]
    with tempfile.TemporaryDirectory(prefix="lookalikes-") as scratch:
        folder = args.keep or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        for case in cases:
            print("\n".join(describe(case, folder)), end="\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
