"""Loading reports progress over all files; the bar shows in a terminal once loading takes over a second."""

from __future__ import annotations

import io

from rich.console import Console

from skalpel.report import progress
from skalpel.trace import load

from .conftest import corpus


def test_progress_covers_every_file_of_a_folder() -> None:
    folder = corpus("hta/trace_filter")
    calls: list[tuple[int, int]] = []
    trace = load(folder, on_progress=lambda done, total: calls.append((done, total)))
    assert trace.rank_ids == [0, 1]
    total = sum(path.stat().st_size for path in folder.glob("*.json.gz"))
    assert {t for _, t in calls} == {total}  # one total over both files, from the first call on
    done = [d for d, _ in calls]
    assert done == sorted(done) and done[-1] == total
    assert any(d < total / 2 for d in done) and any(total / 2 < d < total for d in done)  # the first file ends halfway


def test_bar_shows_in_a_terminal_after_the_delay(monkeypatch) -> None:
    monkeypatch.setattr(progress, "SHOW_AFTER_S", 0.0)
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    with progress.load_progress(console=console) as on_progress:
        load(corpus("hta/trace_filter"), on_progress=on_progress)
    assert "loading trace" in out.getvalue()


def test_no_bar_when_not_a_terminal(monkeypatch) -> None:
    monkeypatch.setattr(progress, "SHOW_AFTER_S", 0.0)
    out = io.StringIO()
    with progress.load_progress(console=Console(file=out, force_terminal=False)) as on_progress:
        load(corpus("hta/trace_filter"), on_progress=on_progress)
    assert out.getvalue() == ""


def test_rank_bars_show_each_rank_in_flight_and_the_job(monkeypatch) -> None:
    from skalpel.api import analyze_job
    from skalpel.trace.loader import find_trace_files

    monkeypatch.setattr(progress, "SHOW_AFTER_S", 0.0)
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    folder = corpus("hta/trace_filter")
    files = find_trace_files([folder])
    with progress.rank_progress(files, console=console) as on_rank:
        on_rank(0, 0.5)  # what a worker reports halfway through rank 0
        rendered = out.getvalue()
        analyze_job([folder], workers=1, on_rank_progress=on_rank)
    assert "ranks 0/2" in rendered and "sampled_rank-0.json.gz" in rendered
    assert "ranks 2/2" in out.getvalue() or "ranks 1/2" in out.getvalue()


def test_api_progress_is_bytes_over_all_rank_files() -> None:
    from skalpel import analyze

    folder = corpus("hta/trace_filter")
    calls: list[tuple[int, int]] = []
    report = analyze(folder, workers=2, on_progress=lambda done, total: calls.append((done, total)))
    assert [rank.rank for rank in report.ranks] == [0, 1]
    total = sum(path.stat().st_size for path in folder.glob("*.json.gz"))
    assert {t for _, t in calls} == {total} and calls[-1][0] == total
