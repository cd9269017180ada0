"""skalpel's own work leaves the script's warnings as a plain run shows them.

Silencing the profiler's warnings with ``warnings.catch_warnings`` + ``filterwarnings`` at each
window's edge reset every module's record of warnings already shown: a once-per-location
warning (torch's dropout2d on a 3-D input, in the PyTorch examples' mnist_rnn) was printed 5
times under ``skalpel run`` and once alone. ``capture/quiet.ignored`` silences in place.
"""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from skalpel.capture.quiet import ignored


def _shown_in_loop(between) -> list[str]:
    """Messages shown by a once-per-location warning raised in a loop, ``between`` run between its calls."""
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("default")
        for _ in range(4):
            warnings.warn("the script's own warning", UserWarning)
            with between():
                warnings.warn("Profiler clears events at the end of each cycle", UserWarning)
    return [str(item.message) for item in shown]


def _old_quiet():
    """What skalpel did before: the control that shows the test can fail."""
    class quiet(warnings.catch_warnings):
        def __enter__(self):
            super().__enter__()
            warnings.filterwarnings("ignore", message=".*Profiler clears events.*")

    return quiet()


def test_silencing_its_own_warnings_keeps_the_scripts_once_per_location_record() -> None:
    assert _shown_in_loop(lambda: ignored(".*Profiler clears events.*")) == ["the script's own warning"]
    # the filters' reset shows the script's warning again after every silenced block
    assert _shown_in_loop(_old_quiet).count("the script's own warning") == 4


def test_the_silenced_message_shows_again_outside_and_the_scripts_filters_are_kept() -> None:
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", message="the script ignores this")
        before = list(warnings.filters)
        with ignored("the script ignores this", "profiler's"):
            warnings.warn("profiler's own")
            warnings.warn("another")
        assert warnings.filters == before  # the script's equal filter stays, ours are gone
        warnings.warn("profiler's own")
        warnings.warn("the script ignores this")
    assert [str(item.message) for item in shown] == ["another", "profiler's own"]


# mnist_rnn's shape: a warning torch raises once per location in every step, and one of the script's own
SCRIPT = """
import warnings
import torch
import torch.nn.functional as F
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Linear(8, 8)
opt = torch.optim.Adam(model.parameters())
for step in range(20):
    warnings.warn("the script's once-per-location warning")
    x = F.dropout2d(torch.randn(4, 2, 8), 0.25)  # 3-D input: torch warns once per location
    loss = model(x).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
"""


@pytest.mark.slow
def test_a_warning_shown_once_alone_is_shown_once_under_skalpel_run(tmp_path: Path) -> None:
    (tmp_path / "main.py").write_text(SCRIPT)
    alone = subprocess.run([sys.executable, "main.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    profiled = subprocess.run([sys.executable, "-m", "skalpel", "run", "--out", str(tmp_path / "run"), "main.py"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert alone.returncode == 0 and profiled.returncode == 0, profiled.stderr
    for message in ("the script's once-per-location warning", "dropout2d"):
        shown = [[line for line in done.stderr.splitlines() if message in line and "Warning" in line]
                 for done in (alone, profiled)]  # fmt: skip
        assert len(shown[0]) == 1, alone.stderr  # shown once alone
        assert len(shown[1]) == 1, profiled.stderr
    assert (tmp_path / "run" / "report.json").exists()  # the steps were recorded: skalpel's work did run
