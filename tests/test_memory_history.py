"""`skalpel run --memory-history`: the CPU run's one line (a real run), the snapshot read into the report's note (a
snapshot torch builds from a real CPU profile), and the option's forwarding and bad values.

The CUDA path itself (``_record_memory_history`` from the start, ``_dump_snapshot`` at the end or at the
out-of-memory error) needs a GPU: its parts are small functions tested here on what they read and write.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import textwrap

import pytest

from skalpel.capture.command import add_capture_options, forwarded_options
from skalpel.capture.conclude import _history_note
from skalpel.capture.memory_history import MemoryHistory, no_gpu_line, snapshot_name, snapshot_note
from tests.conftest import skip

TINY = textwrap.dedent(
    """
    import torch
    torch.set_num_threads(1)
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(8):
        optimizer.zero_grad()
        model(torch.randn(32, 64)).sum().backward()
        optimizer.step()
    """
)


@pytest.mark.slow
def test_a_cpu_run_says_it_needs_a_gpu_once_and_goes_on(tmp_path):
    import torch

    if torch.cuda.is_available():
        skip("this machine has CUDA: the snapshot is written instead")
    script = tmp_path / "train.py"
    script.write_text(TINY)
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "skalpel", "run", "--memory-history", "--out", str(out), str(script)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.count("--memory-history needs a CUDA GPU") == 1, done.stderr[-2000:]
    assert (out / "report.json").is_file()  # the run went on to its report
    assert not list(out.glob("*.pickle"))


def big_on_the_host(torch):
    return torch.zeros(1024, 1024)  # 4 MiB, the largest allocation of the profile


def real_snapshot(tmp_path):
    """The snapshot torch builds from a real CPU profile (the format _dump_snapshot writes, one host 'segment')."""
    import pickle

    import torch
    from torch.cuda._memory_viz import _profile_to_snapshot

    with torch.profiler.profile(profile_memory=True, record_shapes=True, with_stack=True) as prof:
        held = big_on_the_host(torch)
    path = tmp_path / snapshot_name(None)
    path.write_bytes(pickle.dumps(_profile_to_snapshot(prof)))
    return path, held


def test_the_snapshot_is_read_into_one_note(tmp_path):
    path, held = real_snapshot(tmp_path)
    note = snapshot_note(path)
    assert note.startswith(f"memory snapshot at the script's end: {path}")
    assert f"{os.path.basename(__file__)}:" in note and "big_on_the_host" in note  # the line that holds it
    assert "peaks over the" in note and f"`skalpel analyze {path}`" in note
    assert held.numel() == 2**20


def test_the_note_at_an_out_of_memory_error_names_the_snapshot(tmp_path):
    path, _ = real_snapshot(tmp_path)
    history = MemoryHistory(max_entries=10, written=path)  # what dump() leaves after writing the file
    note = _history_note(history, MemoryError())
    assert note is not None and note.startswith(f"memory snapshot at the out-of-memory error: {path}")
    failed = MemoryHistory(max_entries=10, failed="the memory snapshot could not be written to /x (OSError: full)")
    assert _history_note(failed, None) == failed.failed
    assert _history_note(None, MemoryError()) is None


def test_a_snapshot_that_cannot_be_read_is_said_in_the_note(tmp_path):
    path = tmp_path / "memory-snapshot.pickle"
    path.write_bytes(b"not a pickle")
    note = snapshot_note(path)
    assert "could not be read" in note and str(path) in note


def test_nothing_recorded_writes_nothing(tmp_path):
    history = MemoryHistory(max_entries=10)
    assert history.dump(tmp_path, None) is None and not list(tmp_path.iterdir())
    assert no_gpu_line(True) is None and "needs a CUDA GPU" in (no_gpu_line(False) or "")
    assert snapshot_name(3) == "memory-snapshot-rank3.pickle"


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_capture_options(parser)
    return parser.parse_args(argv)


def test_the_option_reaches_every_rank_and_bad_counts_are_refused():
    args = parse("--memory-history", "--memory-history-entries", "5000")
    assert args.memory_history and args.memory_history_entries == 5000
    forwarded = forwarded_options(args)
    assert forwarded[-3:] == ["--memory-history", "--memory-history-entries", "5000"]
    assert "--memory-history" not in forwarded_options(parse())
    for bad in ("0", "many"):
        with pytest.raises(argparse.ArgumentError, match="allocator action"):
            parse("--memory-history-entries", bad)
