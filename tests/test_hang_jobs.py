"""A job that stops, for real: 4 ranks of torchrun on gloo under `skalpel watch`, each with one planted fault.

Each job runs about 25 ms steps (a DataLoader batch, the gradients' all_reduce, the loss's all_reduce)
and goes wrong at step 30 on the planted rank(s): asleep in its DataLoader, one all_reduce skipped,
a different all_reduce size on two ranks, SIGKILL. The look-alike: a rank slow for five steps (1 s
each, half the bound) that goes on. `--hang-after 2`: the bound is 2 s (20x a 25 ms median is less).
A job that hangs is ended by the test (SIGTERM to torchrun) once every rank has dumped; gloo aborts
a mismatch by itself. The verdict is read afterwards from the run folder, as `skalpel analyze` does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import orjson
import pytest

from skalpel.watching import hangs

pytestmark = [pytest.mark.slow, pytest.mark.alone]  # 4 ranks each: the machine to themselves (conftest)

JOB = """
import argparse
import os
import signal
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--plant", default="none")
args = parser.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.set_num_threads(1)


class Batches(Dataset):
    def __len__(self):
        return args.steps

    def __getitem__(self, index):
        if args.plant == "sleep" and rank == 3 and index == 30:
            time.sleep(3600)  # PLANT-SLEEP: a rank stuck reading its data
        if args.plant == "raise" and rank == 3 and index == 30:
            raise ValueError(f"sample {index} is corrupt")  # PLANT-RAISE
        return torch.ones(64)


def average(grads, step):
    if args.plant == "skip" and rank == 3 and step == 30:
        return  # PLANT-SKIP: this rank skips the gradients' all_reduce once
    size = 65 if args.plant == "size" and rank >= 2 and step == 30 else 64
    dist.all_reduce(grads if size == 64 else torch.ones(size))  # LINE-GRADS


grads = torch.zeros(64)
for step, batch in enumerate(DataLoader(Batches(), batch_size=None)):
    if args.plant == "kill" and rank == 3 and step == 30:
        os.kill(os.getpid(), signal.SIGKILL)
    grads += batch
    average(grads, step)
    loss = torch.ones(1)
    dist.all_reduce(loss)  # LINE-LOSS
    slow = args.plant == "straggler" and rank == 3 and 30 <= step < 35
    time.sleep(1.0 if slow else 0.02)  # a straggler: half the bound, five steps, then on
dist.destroy_process_group()
"""


# DDP: the gradients' all_reduce is issued by DDP's reducer from C++, which torch.distributed's functions never see:
# the flight recorder (gloo included in torch 2.13) numbers it.
DDP_JOB = """
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.set_num_threads(1)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 8))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)


class Batches(Dataset):
    def __len__(self):
        return 60

    def __getitem__(self, index):
        if rank == 3 and index == 30:
            time.sleep(3600)  # PLANT-SLEEP: a rank stuck reading its data
        return torch.ones(64)


for batch in DataLoader(Batches(), batch_size=None):
    model(batch).sum().backward()  # LINE-BACKWARD
    optimizer.step()
    optimizer.zero_grad()
    time.sleep(0.02)
dist.destroy_process_group()
"""


def _line(marker: str, source: str = JOB) -> int:
    return next(number for number, text in enumerate(textwrap.dedent(source).splitlines(), 1) if marker in text)


def _job(tmp_path: Path, plant: str, *, hangs_expected: bool, source: str = JOB) -> tuple[Path, str, float]:
    """The job run to its end (or, when it hangs, until every rank dumped, then ended): its folder, its stderr, and
    how long it ran."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(source))
    out = tmp_path / "job"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4", "-m", "skalpel",
               "watch", "--out", str(out), "--hang-after", "2", "--no-capture", str(script),
               "--plant", plant]  # fmt: skip
    began = time.monotonic()
    with open(tmp_path / "stderr.txt", "w+") as log:
        job = subprocess.Popen(command, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = began + 120
            while job.poll() is None and time.monotonic() < deadline:
                if hangs_expected and len(list(out.glob("rank*/hang-1.json"))) == 4:
                    job.send_signal(signal.SIGTERM)  # torchrun passes it on to every rank
                    break
                time.sleep(0.2)
            job.wait(timeout=60)
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()
        log.seek(0)
        text = log.read()
    return out, text, time.monotonic() - began


def test_a_rank_asleep_in_its_data_loader_is_named_and_the_others_wait_in_the_next_all_reduce(tmp_path: Path) -> None:
    out, text, _ = _job(tmp_path, "sleep", hangs_expected=True)
    dumps = {rank: orjson.loads((out / f"rank{rank}" / "hang-1.json").read_bytes()) for rank in range(4)}
    for rank, dump in dumps.items():  # each rank noticed by itself, within 2x the bound, and said so
        # the dump fires once the stall passes the bound; written to the millisecond, a stall of 2.0004 s reads 2.0
        assert dump["bound_s"] == 2.0 and dump["bound_s"] <= dump["stalled_s"] < 2 * dump["bound_s"], dump
        assert f"rank {rank}: no step has ended for " in text
        assert any(stack["main"] for stack in dump["stacks"]) and len(dump["stacks"]) >= 2  # every thread
    findings, notes = hangs.verdict(out)
    (finding,) = findings
    assert finding.id == "collective_hang", (findings, notes)
    assert "the verdict so far" in text and "rank 3 never came: it is in " in text  # said live, by rank 0
    assert finding.evidence["waiting"] == "ranks 0-2" and finding.evidence["missing"] == "rank 3"
    assert finding.evidence["op"] == "all_reduce" and finding.evidence["sizes"] == [[64]]
    assert finding.evidence["waiting_lines"] == [f"{tmp_path / 'train.py'}:{_line('LINE-GRADS')} in average"]
    (missing,) = finding.evidence["missing_ranks"]
    assert missing["where"].endswith(f"train.py:{_line('PLANT-SLEEP')} __getitem__"), missing
    assert "dataloader.py" in missing["where"] and missing["last_collective"].endswith(": completed")
    assert finding.evidence["seq"] == int(missing["last_collective"].split()[0][1:]) + 1  # one ahead of rank 3
    assert finding.locations[0] == f"{tmp_path / 'train.py'}:{_line('PLANT-SLEEP')} in __getitem__"
    assert (out / "rank0" / "fr-trace-1.json").is_file()  # PyTorch's flight recorder records gloo: kept beside it
    shown = subprocess.run([sys.executable, "-m", "skalpel", "analyze", str(out)], capture_output=True, text=True,
                           timeout=120)  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert f"ranks 0-2 wait in all_reduce #{finding.evidence['seq']} (default)" in shown.stdout
    assert "rank 3 never came: it is in " in shown.stdout
    printed = subprocess.run([sys.executable, "-m", "skalpel", "analyze", str(out), "--json", "-"],
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    assert printed.returncode == 0, printed.stderr
    (reported,) = orjson.loads(printed.stdout)["findings"]  # the verdict in the report, as a finding
    assert reported["id"] == "collective_hang" and reported["evidence"]["missing"] == "rank 3"
    assert reported["evidence"]["seq"] == finding.evidence["seq"] and reported["locations"] == list(finding.locations)
    # a job run without skalpel: its flight-recorder dumps alone say the same (no line: the recorder keeps none)
    recorder = tmp_path / "recorder"
    recorder.mkdir()
    for rank in range(4):
        (recorder / f"fr_trace_rank_{rank}.json").write_bytes((out / f"rank{rank}" / "fr-trace-1.json").read_bytes())
    (alone,), _ = hangs.verdict(recorder)
    assert alone.id == "collective_hang" and alone.evidence["missing"] == "rank 3"
    assert alone.evidence["waiting"] == "ranks 0-2"


def test_under_ddp_the_flight_recorder_numbers_the_all_reduce_the_others_wait_in(tmp_path: Path) -> None:
    out, text, _ = _job(tmp_path, "none", hangs_expected=True, source=DDP_JOB)
    (finding,), notes = hangs.verdict(out)
    assert finding.id == "collective_hang", (finding, notes, text[-3000:])
    assert finding.evidence["record"] == "the flight recorder's" and finding.evidence["op"] == "all_reduce"
    assert finding.evidence["waiting"] == "ranks 0-2" and finding.evidence["missing"] == "rank 3"
    assert finding.evidence["waiting_lines"] == [f"{tmp_path / 'train.py'}:{_line('LINE-BACKWARD', DDP_JOB)} in "
                                                 "<module>"]  # fmt: skip
    (missing,) = finding.evidence["missing_ranks"]
    assert missing["where"].endswith(f"train.py:{_line('PLANT-SLEEP', DDP_JOB)} __getitem__"), missing


def test_a_skipped_all_reduce_is_a_mismatch_at_its_number_and_the_rank_gloo_aborted_died(tmp_path: Path) -> None:
    out, text, _ = _job(tmp_path, "skip", hangs_expected=False)
    findings, notes = hangs.verdict(out)
    by_id = {finding.id: finding for finding in findings}
    mismatch = by_id["collective_mismatch"]
    grads = f"{tmp_path / 'train.py'}:{_line('LINE-GRADS')} in average"
    loss = f"{tmp_path / 'train.py'}:{_line('LINE-LOSS')} in <module>"
    assert mismatch.evidence["seq"] == 2 * 30 + 1, (findings, text[-3000:])  # step 30's first all_reduce
    assert mismatch.evidence["variants"] == [
        {"ranks": [0, 1, 2], "op": "all_reduce", "sizes": [[64]], "line": grads},
        {"ranks": [3], "op": "all_reduce", "sizes": [[1]], "line": loss},
    ]
    assert "a collective skipped or added before it" in mismatch.title
    assert findings[0].id == "collective_mismatch"  # the cause first


def test_all_reduce_sizes_that_differ_are_a_mismatch_naming_both_sides(tmp_path: Path) -> None:
    out, text, _ = _job(tmp_path, "size", hangs_expected=False)
    findings, notes = hangs.verdict(out)
    mismatch = next(finding for finding in findings if finding.id == "collective_mismatch")
    assert mismatch.evidence["seq"] == 61, (findings, text[-3000:])
    assert mismatch.evidence["difference"] == (f"all_reduce of [[65]] on ranks 2-3, of [[64]] on ranks 0-1 at "
                                               f"{tmp_path / 'train.py'}:{_line('LINE-GRADS')} in average")  # fmt: skip
    died = [finding for finding in findings if finding.id == "rank_died"]
    assert all("fatal signal (Aborted" in finding.title for finding in died), died  # gloo's abort, if any


def test_a_rank_killed_with_sigkill_is_named_dead_with_its_last_step_and_collective(tmp_path: Path) -> None:
    out, text, _ = _job(tmp_path, "kill", hangs_expected=False)
    findings, notes = hangs.verdict(out)
    died = [finding for finding in findings if finding.id == "rank_died"]
    assert [finding.rank for finding in died] == [3], (findings, notes, text[-3000:])
    (dead,) = died
    # its step: that of its last collective (watch counts the loop's 30th iteration, index 29, as step 29)
    assert "killed without a word (SIGKILL" in dead.title and dead.evidence["step"] in (29, 30), dead.evidence
    assert dead.evidence["last_collective"].startswith("#60 all_reduce [[1]]")  # step 29's loss, completed
    assert {other["rank"] for other in dead.evidence["then_failed"]} <= {0, 1, 2}
    assert not any(finding.id == "collective_mismatch" for finding in findings)


def test_a_rank_that_raises_is_named_with_its_error_and_line_and_the_others_as_its_consequence(tmp_path: Path) -> None:
    out, text, _ = _job(tmp_path, "raise", hangs_expected=False)
    findings, notes = hangs.verdict(out)
    (dead,) = [finding for finding in findings if finding.id == "rank_died"]
    assert dead.rank == 3 and "ended on an error (exit status 1): ValueError: sample 30 is corrupt" in dead.title, (
        findings, text[-3000:])
    assert dead.locations == (f"{tmp_path / 'train.py'}:{_line('PLANT-RAISE')} in __getitem__",)
    assert {other["rank"] for other in dead.evidence["then_failed"]} <= {0, 1, 2}


def test_a_straggler_that_goes_on_is_no_hang(tmp_path: Path) -> None:
    out, text, _ = _job(tmp_path, "straggler", hangs_expected=False)
    assert "no step has ended" not in text, text[-3000:]
    assert not list(out.glob("rank*/hang-*.json"))
    assert hangs.verdict(out) == ([], [])


ONE = """
import time

import torch


def evaluate(seconds):
    time.sleep(seconds)  # PLANT-EVAL


model = torch.nn.Linear(8, 8)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(200):
    model(torch.ones(8)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    time.sleep(0.01)
    if step == 40:
        evaluate(float(__import__("sys").argv[1]))
"""


def _one(tmp_path: Path, seconds: str, *, stuck: bool) -> tuple[Path, str]:
    tmp_path.mkdir()
    script = tmp_path / "one.py"
    script.write_text(textwrap.dedent(ONE))
    out = tmp_path / "run"
    command = [sys.executable, "-m", "skalpel", "watch", "--out", str(out), "--hang-after", "1", "--no-capture",
               str(script), seconds]  # fmt: skip
    job = subprocess.Popen(command, cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    while stuck and not (out / "hang-1.json").exists() and time.monotonic() < deadline and job.poll() is None:
        time.sleep(0.1)
    if stuck:
        job.send_signal(signal.SIGTERM)
    _, stderr = job.communicate(timeout=60)
    return out, stderr


def test_one_process_stuck_is_a_step_hang_at_its_line_and_a_long_step_that_ends_is_marked_resolved(
    tmp_path: Path,
) -> None:
    out, stderr = _one(tmp_path / "stuck", "3600", stuck=True)
    dump = orjson.loads((out / "hang-1.json").read_bytes())
    assert dump["rank"] is None and dump["bound_s"] == 1.0 and 1.0 <= dump["stalled_s"] < 2.0, dump  # to the ms
    assert "step_hang: No step ended for 1 s after step" in stderr  # said live
    (finding,), notes = hangs.verdict(out)
    assert finding.id == "step_hang" and notes == []
    assert finding.locations == (f"{tmp_path / 'stuck' / 'one.py'}:{_line_of(ONE, 'PLANT-EVAL')} in evaluate",)
    # the look-alike: one evaluation of 2.5 s (past the 1 s bound) and the loop goes on
    out, stderr = _one(tmp_path / "slow", "2.5", stuck=False)
    dump = orjson.loads((out / "hang-1.json").read_bytes())
    assert 2.0 < dump["resolved_after_s"] < 10, dump
    assert "ended after" in stderr and "slow, not stuck" in stderr
    assert hangs.verdict(out) == ([], [])


def _line_of(source: str, marker: str) -> int:
    return next(number for number, text in enumerate(textwrap.dedent(source).splitlines(), 1) if marker in text)
