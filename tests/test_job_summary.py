"""A job of many ranks reads like one: findings across ranks, the job summary, outliers and groups.

A synthetic job (tests/jobbuilder.py) plants two kinds of ranks, a straggler and a slow link;
the report must group the two kinds, name the straggler and the slow link, and say nothing of
the other ranks. On the corpus's multi-rank sets, the findings are the per-rank rules' findings
merged: the same ids, the same (id, rank) pairs once expanded.
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest

from skalpel.api import analyze_job, load_report
from skalpel.cli import main
from skalpel.job.report_of import report_of
from skalpel.job.summary import histogram, outliers
from skalpel.report import html
from skalpel.report.terminal import render_text
from skalpel.report.terminal_job import sparkline
from skalpel.result.diff import diff_reports
from skalpel.result.report import AcrossRanks, Report, rank_ranges

from .conftest import corpus
from .jobbuilder import TWO_KINDS, RankKind, build_job, planted
from .report_fixtures import DomSummary, chromium, console_messages, needs_browser

PAIR = "hta/trace_filter"
DLRM = "extra/facebookresearch__param/et_replay/tests/inputs/dlrm_kineto_extracted"
RANKS, STRAGGLER, SLOW_LINK = 24, 5, 17


@pytest.fixture(scope="module")
def planted_report(tmp_path_factory: pytest.TempPathFactory) -> Report:
    folder = tmp_path_factory.mktemp("planted")
    build_job(folder, RANKS, planted(RANKS, straggler=STRAGGLER, slow_link=SLOW_LINK))
    return analyze_job([folder], workers=1).report


def test_rank_ranges() -> None:
    assert rank_ranges([3, 0, 1, 2, 7, 9, 10]) == "0-3, 7, 9-10"
    assert rank_ranges([5]) == "5"
    assert rank_ranges([]) == ""
    assert rank_ranges(range(2, 256, 4)) == "2-254 every 4"
    assert rank_ranges([1, 3, 5, 6, 7, 10, 20, 30, 40]) == "1, 3, 5-7, 10-40 every 10"
    assert rank_ranges([4, 5, 12, 13]) == "4-5, 12-13"


def test_robust_outliers_need_a_real_difference() -> None:
    alike = {rank: 10.0 for rank in range(100)}
    assert outliers({**alike, 3: 10.01}, "ms") == ()  # a rounding, not an outlier
    assert [rank for rank, _, _ in outliers({**alike, 3: 14.0}, "ms")] == [3]
    half = {rank: 10.0 if rank < 50 else 20.0 for rank in range(100)}
    assert outliers(half, "ms") == ()  # two kinds of ranks are groups, not outliers
    many = {**alike, **{rank: 30.0 for rank in range(20)}}
    assert outliers(many, "ms") == ()  # a fifth of the ranks beyond the cut: a group of their own
    assert histogram([1.0, 1.0, 2.0], 1.0, 2.0, bins=4) == (2, 0, 0, 1)
    assert sparkline((2, 0, 0, 1)) == "█  ▄"  # an empty bin is blank, a bin of half the fullest half high


def test_planted_groups_straggler_and_slow_link(planted_report: Report) -> None:
    job = planted_report.job
    assert job is not None and job.ranks == RANKS
    groups = {group.ranks: group for group in job.groups}
    assert "0-4, 6-11" in groups and "12-16, 18-23" in groups  # the two kinds, each without its odd rank
    assert set(job.outliers) == {STRAGGLER, SLOW_LINK}  # and no other rank
    by_metric = {metric.name: {rank for rank, _, _ in metric.outliers} for metric in job.metrics}
    assert STRAGGLER in by_metric["wait_ms"]  # it waits for nobody
    assert SLOW_LINK in by_metric["comm_ms"]  # its collectives take longer
    (all_reduce,) = job.collectives
    assert all_reduce.type == "all_reduce" and all_reduce.ranks == RANKS and all_reduce.slowest == (SLOW_LINK,)
    straggler = next(finding for finding in planted_report.findings if finding.id == "straggler_rank")
    assert straggler.evidence["rank"] == STRAGGLER
    idle = [finding for finding in planted_report.findings if finding.id == "gpu_idle"]
    assert len(idle) == 1  # one finding for the host-heavy kind, not one per rank
    assert idle[0].rank is None and idle[0].across is not None
    assert set(idle[0].ranks) == set(range(12, 24)) - {SLOW_LINK}
    assert idle[0].across.ranks == "12-16, 18-23" and len(idle[0].across.per_rank) == 11
    assert "idle" in idle[0].across.differs and "other 13 ranks" in idle[0].across.differs
    assert set(job.shown) == {0, 12, STRAGGLER, SLOW_LINK}  # the outliers and one rank of each kind


def test_planted_terminal_report_leads_with_the_summary(planted_report: Report) -> None:
    text = render_text(planted_report)
    assert text.index("verdict") < text.index("job: 24 ranks") < text.index("rank 0 ")
    panels = [line for line in text.splitlines() if line.startswith("╭─ rank ")]
    assert [line.split()[2] for line in panels] == ["0", "5", "12", "17"]
    assert "rank 5: comm 0.99 ms (median 6.99)" in text and "rank 17: step 22.15 ms (median 16.15)" in text
    assert "─ rank 5 (outlier) " in text and "─ rank 12 (shows 11 ranks: 12-16, 18-23) " in text
    assert "on 11 of 24 ranks (12-16, 18-23)" in text
    every = render_text(planted_report, width=100)
    assert len(every.splitlines()) < 120


def test_rank_options_show_more_panels(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    build_job(tmp_path, 12, lambda rank: RankKind())
    assert main(["analyze", str(tmp_path), "--workers", "1", "--rank", "7", "--rank", "99"]) == 0
    out = capsys.readouterr().out
    assert "─ rank 7 " in out and "─ rank 3 " not in out and "--rank 99: not a rank of this job" in out
    assert out.count("top ops by self device time") == 1  # the rank asked for: its whole panel, the others brief
    assert main(["analyze", str(tmp_path), "--workers", "1", "--all-ranks"]) == 0
    out = capsys.readouterr().out
    assert all(f"─ rank {rank} " in out for rank in range(12))


def test_report_with_a_job_round_trips(planted_report: Report) -> None:
    again = Report.from_json(planted_report.to_json())
    assert again == planted_report
    assert render_text(again) == render_text(planted_report)


def _before_merging(paths) -> tuple[Report, tuple]:
    """A job's report, and its findings as the rules raised them (one per rank) before ``across_ranks`` merged them:
    the real function, watched on its way."""
    from skalpel.job import build

    seen, merge = [], build.across_ranks

    def watched(findings, ranks):
        seen.append(findings)
        return merge(findings, ranks)

    build.across_ranks = watched
    try:
        report = report_of(paths, workers=1).report
    finally:
        build.across_ranks = merge
    return report, seen[-1]


@pytest.mark.parametrize("name", [PAIR, DLRM])
def test_corpus_jobs_keep_their_findings_merged(name: str) -> None:
    report, raw = _before_merging(corpus(name))  # the rules' findings, one per rank as before
    assert {finding.id for finding in raw} == {finding.id for finding in report.findings}
    expanded = Counter()
    for finding in report.findings:
        if finding.across is not None and finding.across.per_rank:
            expanded.update((finding.id, item["rank"]) for item in finding.across.per_rank)
        else:
            expanded[(finding.id, finding.rank)] += 1
    assert expanded == Counter((finding.id, finding.rank) for finding in raw)
    assert len(report.findings) <= len(raw)
    for finding in report.findings:  # as severe as its worst rank, and says where it is less so
        severities = {item["severity"] for item in finding.across.per_rank} if finding.across else set()
        if len(severities) > 1:
            assert finding.severity == min(severities, key=["critical", "warning", "info"].index)
            assert all(f"{severity} on " in finding.across.describe() for severity in severities)


def test_a_scattered_severity_list_is_cut_to_a_count_and_its_first_ranks():
    # ranks 2, 6, 7 of every 8 critical, the rest warning (as the 256-rank DLRM job): 96 and 160 ranks in 64 and
    # 96 ranges, which took 12 lines of an 80-column terminal
    per_rank = tuple({"rank": rank, "severity": "critical" if rank % 8 in (2, 6, 7) else "warning"} for rank in range(256))
    across = AcrossRanks(ranks="0-255", count=256, of=256, key="idle_pct", min=34.8, median=58.2, max=78.7,
                         worst=(2, 6), per_rank=per_rank)  # fmt: skip
    text = across.describe()
    assert "critical on 96 ranks (2, 6-7, 10, 14-15, 18, 22-23, 26, …)" in text
    assert "warning on 160 ranks (0-1, 3-5, 8-9, 11-13, 16-17, 19-21, …)" in text
    assert len(text) < 250
    few = AcrossRanks(ranks="0-3", count=4, of=4, per_rank=per_rank[:4]).describe()
    assert few == "on 4 of 4 ranks (0-3); critical on 2, warning on 0-1, 3"  # short lists stay whole
    assert "critical on 2-254 every 4" in AcrossRanks(ranks="0-255", count=256, of=256, per_rank=tuple(
        {"rank": rank, "severity": "critical" if rank % 4 == 2 else "warning"} for rank in range(256))).describe()


def _thousand_ranks(report: Report) -> Report:
    """The planted job's ranks repeated to 1,000 (rank r is a copy of rank r % 24), summarised again."""
    import dataclasses

    from skalpel.job.summary import job_summary

    ranks = tuple(dataclasses.replace(report.ranks[rank % RANKS], rank=rank) for rank in range(1000))
    return dataclasses.replace(report, ranks=ranks, job=job_summary(ranks))


@needs_browser
@pytest.mark.slow
def test_browser_renders_a_thousand_rank_page(planted_report: Report, tmp_path: Path) -> None:
    page = tmp_path / "job.html"
    page.write_text(html.render(_thousand_ranks(planted_report)))
    assert page.stat().st_size < 3 * 2**20
    dumped = chromium(page, "--dump-dom", tmp=tmp_path)
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    assert console_messages(dumped.stderr) == []
    dom = DomSummary(dumped.stdout)
    assert "Job: 1000 ranks" in "".join(dom.text)
    assert dom.tags.get("img") == 3  # the rank x step heatmaps: step time, idle, collective wait
    shot = tmp_path / "job.png"
    taken = chromium(page, f"--screenshot={shot}", "--window-size=1280,2000", tmp=tmp_path)
    assert taken.returncode == 0 and shot.stat().st_size > 20_000


def test_bad_input_is_said_once_in_the_notes(tmp_path: Path) -> None:
    """Missing ranks, ranks of different lengths, another job's files and many tiny files: one note each."""
    build_job(tmp_path, 48, lambda rank: RankKind())
    for rank in range(40, 48):
        (tmp_path / f"rank{rank}.json").unlink()  # missing ranks 40-47
    build_job(tmp_path / "short", 48, lambda rank: RankKind(), steps=3)
    for rank in range(30, 40):  # ranks 30-39 recorded a step less
        (tmp_path / "short" / f"rank{rank}.json").replace(tmp_path / f"rank{rank}.json")
    shutil.rmtree(tmp_path / "short")
    build_job(tmp_path, 3, lambda rank: RankKind(), job="job-b", name="other-job-rank{rank}.json")
    for index in range(1000):
        (tmp_path / f"tiny{index:04}.json").write_text("{}")
    report = analyze_job([tmp_path], workers=1).report
    notes = report.warnings
    assert len(notes) <= 8, notes
    assert sum("do not load" in note for note in notes) == 1 and any("skipped 1,000 files" in note for note in notes)
    assert sum("repeat a rank" in note for note in notes) == 1  # the other job's ranks 0-2 beside this one's
    assert sum("missing: 40-47" in note for note in notes) == 1
    assert sum("different numbers of steps (ranks 30-39: 3; ranks 0-29: 4)" in note for note in notes) == 1
    assert sum("different runs" in note for note in notes) == 1
    assert all(len(note) < 1000 for note in notes)
    assert all(finding.rank is None or finding.across is not None for finding in report.findings)  # no report per rank


def test_diff_of_two_jobs_follows_a_finding_across_its_ranks(planted_report: Report, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture) -> None:  # fmt: skip
    """The host-heavy kind fixed on all but one rank: gpu_idle persists, from ranks 12-16, 18-23 to rank 12."""
    fixed = tmp_path / "fixed"
    build_job(fixed, RANKS, lambda rank: TWO_KINDS[1] if rank == 12 else TWO_KINDS[0])
    before = tmp_path / "before.json"
    before.write_bytes(planted_report.to_json())
    after = analyze_job([fixed], workers=1).report
    result = diff_reports(load_report(before, which="BEFORE"), after)
    idle = [change for change in result.persisting if change.id == "gpu_idle"]
    assert len(idle) == 1 and not [change for change in result.appeared if change.id == "gpu_idle"]
    assert idle[0].after.across.ranks == "12"
    (tmp_path / "after.json").write_bytes(after.to_json())
    assert main(["diff", str(before), str(tmp_path / "after.json")]) == 0
    assert "(ranks 12-16, 18-23 -> 12)" in capsys.readouterr().out


def test_too_many_kinds_of_ranks_leave_a_bag_not_a_group_each() -> None:
    from skalpel.job import summary
    from skalpel.result.report import RankReport

    ranks = [RankReport(rank=rank, step_ms=(10.0 * 1.25**rank,), step_breakdown_pct={"kernel": 50.0}) for rank in range(40)]
    job = summary.job_summary(ranks)
    assert job is not None and len(job.groups) == summary.MAX_GROUPS + 1
    bag = job.groups[-1]
    assert not bag.alike and bag.members == tuple(range(summary.MAX_GROUPS, 40)) and bag.ranks == "32-39"
    assert all(group.alike and len(group.members) == 1 for group in job.groups[:-1])
    assert bag.representative not in job.shown
    assert "8 more ranks (32-39) like none of the 32 groups" in render_text(_with_job(job, ranks))


def _with_job(job, ranks) -> Report:
    from skalpel.result.report import Source, StepStats

    return Report(source=Source(paths=()), steps=StepStats(40, 10.0, 10.0, 0.0), ranks=tuple(ranks), job=job)


SCREEN_LINES = 100  # the whole terminal report of a job of many ranks, at 80 columns


@pytest.fixture(scope="module")
def dlrm_256() -> Report:
    """The corpus's 8-rank DLRM job as 256 ranks (rank r a copy of rank r % 8, as benchmarks/many_ranks.py builds
    it), each rank's findings merged across the 256 as a job's are; rank 77's steps planted three times as long."""
    import dataclasses

    from skalpel.job.across import across_ranks
    from skalpel.job.summary import job_summary

    eight, raw = _before_merging(corpus(DLRM))
    ranks = []
    for number in range(256):
        rank = dataclasses.replace(eight.ranks[number % 8], rank=number)
        if number == 77:
            rank = dataclasses.replace(rank, step_ms=tuple(3.0 * step for step in rank.step_ms))
        ranks.append(rank)
    findings = [finding for finding in raw if finding.rank is None]
    findings += [dataclasses.replace(finding, rank=number) for number in range(256) for finding in raw
                 if finding.rank == number % 8]  # fmt: skip
    return dataclasses.replace(eight, ranks=tuple(ranks), job=job_summary(ranks),
                               findings=across_ranks(tuple(findings), tuple(ranks)))  # fmt: skip


def test_a_256_rank_job_fits_a_screen_and_names_its_outlier_and_groups(dlrm_256: Report) -> None:
    job = dlrm_256.job
    assert job is not None and job.outliers == (77,)
    text = render_text(dlrm_256, width=80)
    lines = text.splitlines()
    assert len(lines) <= SCREEN_LINES, f"{len(lines)} lines:\n{text}"
    assert len(render_text(dlrm_256).splitlines()) <= SCREEN_LINES  # and in a 100-column summary.txt
    assert text.index("verdict") < text.index("job: 256 ranks") < text.index("─ rank 77 ")
    assert "on 256 of 256 ranks (0-255)" in text  # a finding across ranks, its ranks as a range
    assert "rank 77: step " in text and "─ rank 77 (outlier" in text  # the outlier: its line and its panel
    for group in ("2-254 every 4", "0-248 every 8", "7-255 every 8"):  # the groups, as ranges
        assert f"  {group} " in text
    panels = [int(line.split()[2]) for line in lines if line.startswith("╭─ rank ")]
    assert panels == sorted(job.shown)  # one panel an outlier and a group, no other
    assert all(len(line) <= 80 for line in lines)
    assert text.count("no Python stacks in this trace") <= 1  # a location every finding shares, said once


def test_outliers_alike_an_outlier_above_are_one_line_not_a_panel_each(planted_report: Report) -> None:
    """The planted job as 1,000 ranks: 83 outliers, in two groups of copies of the straggler and the slow link."""
    from skalpel.report.terminal import render, text_console

    report = _thousand_ranks(planted_report)
    text = render_text(report, width=80)
    panels = [int(line.split()[2]) for line in text.splitlines() if line.startswith("╭─ rank ")]
    assert panels == [0, 5, 12, 17]  # a group's first outlier keeps its panel
    assert "ranks 29, 53, 77: alike rank 5; ranks 41, 65, 89: alike rank 17" in " ".join(text.split())
    assert "rank 29: comm 0.99 ms (median 6.99)" in text  # the folded ranks keep their outlier lines
    assert len(text.splitlines()) <= SCREEN_LINES
    console = text_console(80)
    for part in render(report, ranks=(29,)):
        console.print(part)
    asked = console.export_text()
    assert "ranks 53, 77: alike rank 5;" in " ".join(asked.split())
    assert "╭─ rank 29 ─" in asked and asked.count("top ops by self device time") == 1  # asked for: its whole panel
