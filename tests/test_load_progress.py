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
