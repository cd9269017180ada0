"""`skalpel watch` end to end: real scripts in subprocesses, planted problems found at their steps, captured and named."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from contextlib import closing
from pathlib import Path

import orjson
import pytest

from skalpel.diagnose.thresholds import WATCH_WINDOW_STEPS
from tests.conftest import skip

pytestmark = [pytest.mark.slow, pytest.mark.alone]  # real multi-rank jobs judged on the load they see: conftest

# Thousands of ms-scale steps over a DataLoader; planted at known steps (batch index = step):
# a loader that stalls (60 ms a batch for 40 batches), a leak of 1 MiB a step for 400 steps, and a
# slowdown that adds matmuls for as much CPU time as the step takes (2x). It never imports skalpel.
PLANTED = """
import argparse
import time

import torch
from torch.utils.data import DataLoader, Dataset

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=3000)
parser.add_argument("--step-ms", type=float, default=5.0)
parser.add_argument("--stall", type=int, default=-1)
parser.add_argument("--leak", type=int, default=-1)
parser.add_argument("--slow", type=int, default=-1)
parser.add_argument("--hang-after", type=int, default=-1)
args = parser.parse_args()
torch.set_num_threads(1)
a = torch.randn(64, 64)


class Batches(Dataset):
    def __len__(self):
        return args.steps

    def __getitem__(self, index):
        if 0 <= args.stall <= index < args.stall + 40:
            time.sleep(0.06)
        return torch.ones(8)


def slow_part():
    began = time.thread_time()  # CPU time: a busy machine does not shorten it
    while time.thread_time() - began < args.step_ms / 1e3:
        torch.mm(a, a)


model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
kept = []
for index, batch in enumerate(DataLoader(Batches(), batch_size=None)):
    loss = model(batch).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if 0 <= args.leak <= index < args.leak + 400:
        kept.append(torch.ones(2**18))
    if 0 <= args.slow <= index:
        slow_part()
    time.sleep(args.step_ms / 1e3)
    if index == args.hang_after:
        print("hanging", flush=True)
        time.sleep(600)
"""


def _watch(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "skalpel", "watch", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def _script(tmp_path: Path, source: str = PLANTED, name: str = "train.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def _rows(db_path: Path, sql: str, parameters: tuple = ()) -> list[tuple]:
    with closing(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)) as db:  # closed: `with` alone only commits
        return db.execute(sql, parameters).fetchall()


def test_planted_stall_leak_and_slowdown_are_found_at_their_steps_each_with_a_capture_naming_it(tmp_path: Path) -> None:
    script = _script(tmp_path)
    out = tmp_path / "run"
    done = _watch("--out", str(out), str(script), "--stall", "1500", "--leak", "2000", "--slow", "2500", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    store = out / "watch.sqlite"
    steps = _rows(store, "SELECT step FROM steps ORDER BY step")
    assert [row[0] for row in steps] == list(range(1, len(steps) + 1)) and len(steps) >= 2990
    anomalies = _rows(store, "SELECT kind, step, capture FROM anomalies ORDER BY step")
    found = {kind: (step, capture) for kind, step, capture in anomalies if kind != "slow_drift"}
    assert set(found) == {"dataloader_stall", "memory_creep", "level_shift"}, done.stderr
    # The leak's page faults are CPU work in each step (1 MiB a step): on a busy machine the steps from
    # step 2000 on can be 20% slower, which slow_drift rightly says. Never before the leak.
    assert all(step >= 2000 for kind, step, _ in anomalies if kind == "slow_drift"), done.stderr
    for kind, planted in (("dataloader_stall", 1500), ("memory_creep", 2000), ("level_shift", 2500)):
        step, capture = found[kind]
        assert abs(step - planted) <= WATCH_WINDOW_STEPS, (kind, step)
        assert capture, f"{kind} has no capture: {done.stderr}"
        report = orjson.loads((out / capture / "report.json").read_bytes())
        findings = {finding["id"] for finding in report["findings"]}
        if kind == "dataloader_stall":
            assert "dataloader_bound" in findings, findings
        elif kind == "memory_creep":
            assert "memory_growth" in findings, findings
        else:  # the extra matmuls lead the capture's ops
            assert report["ranks"][0]["top_ops"][0]["name"] == "aten::mm", report["ranks"][0]["top_ops"][:3]
    assert _rows(store, "SELECT count(*) FROM steps WHERE profiled = 1")[0][0] > 0  # the captures' steps, flagged
    shown = subprocess.run([sys.executable, "-m", "skalpel", "watch", "--show", str(out)], capture_output=True,
                           text=True, timeout=120)  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "step time" in shown.stdout and "RSS" in shown.stdout and f"{len(anomalies)} anomalies" in shown.stdout
    assert f"capture: {out / found['level_shift'][1]}" in shown.stdout


def test_a_quiet_run_of_the_same_length_gives_no_anomaly_and_no_capture(tmp_path: Path) -> None:
    script = _script(tmp_path)
    out = tmp_path / "run"
    done = _watch("--out", str(out), str(script), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    store = out / "watch.sqlite"
    assert _rows(store, "SELECT count(*) FROM steps")[0][0] >= 2990
    assert _rows(store, "SELECT kind, step, message FROM anomalies") == []
    assert not list(out.glob("capture-*"))
    assert "0 anomalies" in done.stderr


def test_the_store_survives_sigkill_with_every_flushed_step(tmp_path: Path) -> None:
    script = _script(tmp_path)
    out = tmp_path / "run"
    command = [sys.executable, "-m", "skalpel", "watch", "--out", str(out), str(script), "--hang-after", "300"]
    process = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "hanging"
        store = out / "watch.sqlite"
        deadline = time.monotonic() + 60
        seen = 0
        while time.monotonic() < deadline:  # read while the run goes on (WAL): the flushed steps appear
            seen = _rows(store, "SELECT count(*) FROM steps")[0][0]
            if seen >= 299:
                break
            time.sleep(0.2)
        # step N is the iteration on batch N (batch 0 runs before the first boundary); step 300 never ends
        assert seen == 299
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert _rows(store, "SELECT step FROM steps ORDER BY step") == [(step,) for step in range(1, 300)]
    shown = subprocess.run([sys.executable, "-m", "skalpel", "watch", "--show", str(out)], capture_output=True,
                           text=True, timeout=120)  # fmt: skip
    assert shown.returncode == 0 and "299 steps" in shown.stdout and "(running)" in shown.stdout


NEVER_STEPS = """
import torch
print("no loop here", torch.ones(2).sum().item())
"""


def test_a_script_that_never_steps_is_said_in_one_line_and_runs(tmp_path: Path) -> None:
    done = _watch("--out", str(tmp_path / "run"), str(_script(tmp_path, NEVER_STEPS)), cwd=tmp_path)
    assert done.returncode == 0
    assert "no loop here 2.0" in done.stdout
    said = [line for line in done.stderr.splitlines() if "no step boundary found" in line]
    assert len(said) == 1 and "skalpel.step()" in said[0]
    assert "Traceback" not in done.stderr


def test_a_folder_that_cannot_be_written_is_one_line_and_the_script_runs_unwatched(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    script = _script(tmp_path)
    done = _watch("--out", str(blocker / "run"), str(script), "--steps", "100", cwd=tmp_path)
    assert done.returncode == 0
    lines = [line for line in done.stderr.splitlines() if line.startswith("skalpel")]
    assert len(lines) == 1 and "the script runs unwatched" in lines[0] and "cannot write" in lines[0], done.stderr
    assert "Traceback" not in done.stderr


def test_a_full_disk_is_one_line_the_script_runs_on_and_the_steps_before_it_stay_readable(tmp_path: Path) -> None:
    # a real full disk: a 128 KiB tmpfs, which the watch file outgrows in a few flushes. Steps of 2 ms keep each flush
    # small (at 0.2 ms a loaded machine's first flush held ~1,000 rows and did not fit, so nothing was recorded)
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128k", "tmpfs", str(disk)], capture_output=True, text=True)
    if mounted.returncode != 0:
        skip(f"a small tmpfs cannot be mounted here (needs root): {mounted.stderr.strip()}")
    try:
        script = _script(tmp_path)
        done = _watch("--out", str(disk / "run"), str(script), "--steps", "3000", "--step-ms", "2", cwd=tmp_path)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
        full = [line for line in done.stderr.splitlines() if "cannot write the watch file" in line]
        assert len(full) == 1 and "the script runs on" in full[0], done.stderr
        recorded = _rows(disk / "run" / "watch.sqlite", "SELECT step FROM steps ORDER BY step")
        assert recorded and [step for (step,) in recorded] == list(range(1, len(recorded) + 1))  # every step up to it
        (summary,) = [line for line in done.stderr.splitlines() if "watched" in line and "steps" in line]
        assert f"only the first {len(recorded)} recorded" in summary, summary  # not "watched 2999 steps" alone
        assert len(recorded) < 2900  # the disk did fill up
    finally:
        if subprocess.run(["umount", str(disk)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(disk)], capture_output=True)  # detached once nothing holds it


def test_two_runs_at_once_in_one_folder_the_second_says_so_and_runs_on(tmp_path: Path) -> None:
    script = _script(tmp_path)
    out = tmp_path / "run"
    first = subprocess.Popen([sys.executable, "-m", "skalpel", "watch", "--out", str(out), str(script),
                              "--hang-after", "50"], cwd=tmp_path, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    try:
        assert first.stdout is not None and first.stdout.readline().strip() == "hanging"
        second = _watch("--out", str(out), str(script), "--steps", "100", cwd=tmp_path)
    finally:
        first.kill()
        first.wait(timeout=30)
    assert second.returncode == 0
    lines = [line for line in second.stderr.splitlines() if line.startswith("skalpel")]
    assert len(lines) == 1 and f"another skalpel watch (pid {first.pid}) records into {out}" in lines[0], second.stderr
    assert _rows(out / "watch.sqlite", "SELECT count(*) FROM steps")[0][0] == 49  # the first run's store, untouched


IN_SCRIPT = """
import sys
import time

import torch

import skalpel

torch.set_num_threads(1)
model = torch.nn.Linear(4, 1)
with skalpel.watch(out=sys.argv[1], capture=False) as watched:
    for step in range(120):
        model(torch.ones(4)).sum().backward()  # no optimizer, no loader: the script marks its steps
        time.sleep(float(sys.argv[2]))
        watched.step()
print("folder", watched.folder)
"""


def test_skalpel_watch_in_a_script_and_history_lists_and_compares_the_runs(tmp_path: Path) -> None:
    script = _script(tmp_path, IN_SCRIPT)
    runs = tmp_path / "runs"
    for name, seconds in (("fast", "0.002"), ("slow", "0.006")):
        done = subprocess.run([sys.executable, str(script), str(runs / name), seconds], capture_output=True,
                              text=True, timeout=300, cwd=tmp_path)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert f"folder {runs / name}" in done.stdout
        assert "watched 120 steps: 0 anomalies" in done.stderr
        # the block starts the loop: step 1 runs from it to the first watched.step()
        assert len(_rows(runs / name / "watch.sqlite", "SELECT step FROM steps")) == 120
        # no CUDA here: no device time, and CUDA never touched (an Event cannot even be made on this machine)
        assert _rows(runs / name / "watch.sqlite", "SELECT count(*) FROM steps WHERE device_s IS NOT NULL") == [(0,)]
    listed = subprocess.run([sys.executable, "-m", "skalpel", "history", "--dir", str(runs)], capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[:2] for line in listed.stdout.splitlines()[1:]] == [["fast", "120"], ["slow", "120"]]
    compared = subprocess.run([sys.executable, "-m", "skalpel", "history", str(runs / "fast"), str(runs / "slow")],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
    assert compared.returncode == 0, compared.stderr
    p50 = next(line for line in compared.stdout.splitlines() if line.strip().startswith("p50"))
    assert float(p50.split()[-1].rstrip("%")) > 50  # 2 ms -> 6 ms a step: far slower, whatever the machine's load


def test_the_live_line_shows_on_a_terminal_only(tmp_path: Path) -> None:
    import pty

    script = _script(tmp_path)
    master, slave = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "skalpel", "watch", "--out", str(tmp_path / "run"), str(script),
                                "--steps", "400"], stdout=slave, stderr=slave, cwd=tmp_path)  # fmt: skip
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the terminal closed: the run ended
            break
        if not chunk:
            break
        seen += chunk
    assert process.wait(timeout=300) == 0
    text = seen.decode(errors="replace")
    assert "skalpel watch: step " in text and "anomalies" in text and "watched 399 steps" in text
    piped = _watch("--out", str(tmp_path / "piped"), str(script), "--steps", "400", cwd=tmp_path)
    assert "skalpel watch: step " not in piped.stderr and "watched 399 steps" in piped.stderr


# Two ranks of DDP on gloo; rank 1 does more CPU work a step (the first argument: its ms), and rank 0 waits for
# it in every all-reduce. The planted work (8 ms a step on rank 0) dwarfs a step's own, about 1 ms of DDP and gloo
# whose CPU time load inflates on either rank (at 2 ms, 0.75 ms of it made a balanced rank 1.25x under xdist).
# The second argument: the iterations (300).
SLOW_RANK = """
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.set_num_threads(1)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
a = torch.randn(64, 64)
for step in range(int(sys.argv[2]) if len(sys.argv) > 2 else 300):
    loss = model(torch.ones(8)).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    began = time.thread_time()
    while time.thread_time() - began < (float(sys.argv[1]) / 1e3 if rank == 1 else 0.008):
        torch.mm(a, a)
dist.destroy_process_group()
"""


def _torchrun_job(tmp_path: Path, slow_ms: str, *script_args: str) -> tuple[Path, subprocess.CompletedProcess]:
    script = _script(tmp_path, SLOW_RANK)
    out = tmp_path / "job"
    # --standalone: torchrun's rendezvous on a free port of its own
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "skalpel",
                "watch", "--out", str(out), str(script), slow_ms, *script_args]  # fmt: skip
    done = subprocess.run(torchrun, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return out, done


def test_under_torchrun_the_slow_rank_is_named_online_captured_on_every_rank_and_by_show(tmp_path: Path) -> None:
    out, done = _torchrun_job(tmp_path, "24", "1000")
    for rank in (0, 1):  # 1000 iterations: boundaries at the zero_grad of iterations 1-999, so 998 whole steps
        assert _rows(out / f"rank{rank}" / "watch.sqlite", "SELECT count(*) FROM steps")[0][0] == 998
    # judged while the job ran, by the slow rank reading the other's store: in its own store, naming it
    slow = _rows(out / "rank1" / "watch.sqlite",
                 "SELECT kind, message, capture, summary FROM anomalies WHERE kind = 'slow_rank'")  # fmt: skip
    assert len(slow) == 1 and slow[0][1].startswith("rank1 falls behind: "), (slow, done.stderr)
    assert _rows(out / "rank0" / "watch.sqlite", "SELECT count(*) FROM anomalies WHERE kind = 'slow_rank'")[0][0] == 0
    assert "slow_rank: rank1 falls behind" in done.stderr
    # one capture of the job: both ranks profiled the same steps, each wrote its trace, one report covers both
    (capture,) = [folder for folder in out.glob("capture-*") if folder.name.endswith("-slow_rank")]
    assert sorted(path.name for path in capture.glob("trace-rank*.json.gz")) == ["trace-rank0.json.gz",
                                                                                 "trace-rank1.json.gz"]  # fmt: skip
    # the steps of that capture's request (another capture, of a spike the load made on one rank, may have been
    # read too late by the other rank, which then skips it and says why in its marker)
    (request,) = [orjson.loads(path.read_bytes()) for path in out.glob(".watch-capture-*.json")
                  if orjson.loads(path.read_bytes())["kind"] == "slow_rank"]  # fmt: skip
    profiled = [[step for (step,) in _rows(out / f"rank{rank}" / "watch.sqlite",
                                           "SELECT step FROM steps WHERE profiled = 1 AND step BETWEEN ? AND ? "
                                           "ORDER BY step", (request["first_step"], request["last_step"]))]
                for rank in (0, 1)]  # fmt: skip
    assert profiled[0] and profiled[0] == profiled[1], profiled
    assert profiled[0][0] > int(capture.name.split("-")[1])  # after the anomaly, from a step both ranks knew of
    report = orjson.loads((capture / "report.json").read_bytes())
    assert [rank["rank"] for rank in report["ranks"]] == [0, 1]
    loaded = any(finding["id"] == "cpu_contention" for finding in report["findings"])
    # Rank 1 spends 3x the thread time a step in aten::mm: a straggler from extra work, whatever the machine's load.
    # The loops are timed, not counted, so the call ratio is 3x only where one mm costs the same on both ranks; under
    # CI load it was 1.95x (an mm is slower on the rank that profiles more of them): well above the even 1x it is.
    stragglers = [finding for finding in report["findings"] if finding["id"] == "straggler_rank"]
    # under measured contention (CI beside busy loops: 78% of the wanted time waiting for a core, load 3.1) the ranks'
    # 2 threads each shared 2 cores and the 5 captured steps took alike (rank 0 38 ms, rank 1 34 ms): the slow rank is
    # named online above; the capture's own verdict needs cores to compare on
    assert stragglers or loaded, [finding["id"] for finding in report["findings"]]
    for straggler in stragglers:
        assert straggler["rank"] == 1 and straggler["severity"] != "info", straggler
        evidence = straggler["evidence"]
        assert evidence["extra_work_op"] == "aten::mm" and evidence["call_ratio"] >= 1.5, straggler
        assert re.search(r"rank 1 runs \d+\.\dx the aten::mm calls a step: [\d.]+ vs [\d.]+;", straggler["title"])
    assert len(stragglers) <= 1, stragglers
    # linked to the anomaly, with the report's findings, most severe first (unloaded: the straggler)
    assert slow[0][2] == f"../{capture.name}" and slow[0][3].startswith(f"{report['findings'][0]['id']}: "), slow
    assert loaded or slow[0][3].startswith("straggler_rank: Rank 1"), slow
    assert [line for line in done.stderr.splitlines() if "every rank captures steps" in line], done.stderr
    shown = subprocess.run([sys.executable, "-m", "skalpel", "watch", "--show", str(out)], capture_output=True,
                           text=True, timeout=120)  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "ranks: rank1 falls behind" in shown.stdout, shown.stdout
    assert "slow_rank: rank1 falls behind" in shown.stdout, shown.stdout  # rank1's anomaly, under its timeline
    assert f"capture: {capture} ({slow[0][3][:40]}" in shown.stdout, shown.stdout  # the job's, not rank1's


def test_a_balanced_torchrun_job_names_no_slow_rank(tmp_path: Path) -> None:
    out, done = _torchrun_job(tmp_path, "8")
    for rank in (0, 1):
        store = out / f"rank{rank}" / "watch.sqlite"
        assert _rows(store, "SELECT count(*) FROM steps")[0][0] == 298
        assert _rows(store, "SELECT count(*) FROM anomalies WHERE kind = 'slow_rank'")[0][0] == 0, done.stderr
    assert "slow_rank" not in done.stderr
    assert not [folder for folder in out.glob("capture-*") if folder.name.endswith("-slow_rank")]


# Planted CPU work in each phase of a step: 2 ms in the forward, 5 ms in backward (a custom autograd Function),
# 3 ms in optimizer.step() (an SGD that does more); then 40 inference steps with neither backward nor optimizer.
PHASES = """
import time

import torch


def burn(ms):
    began = time.thread_time()
    while time.thread_time() - began < ms / 1e3:
        pass


class SlowBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        burn(2)
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        burn(5)
        return grad * 2


class SlowSGD(torch.optim.SGD):
    def step(self, closure=None):
        burn(3)
        return super().step(closure)


import skalpel

model = torch.nn.Linear(8, 1)
optimizer = SlowSGD(model.parameters(), lr=0.01)
with skalpel.watch(out="train", capture=False):
    for _ in range(40):
        optimizer.zero_grad()
        SlowBackward.apply(model(torch.ones(8))).sum().backward()
        optimizer.step()
with skalpel.watch(out="infer", capture=False) as watched:
    for _ in range(40):
        with torch.no_grad():
            SlowBackward.apply(model(torch.ones(8)))
        watched.step()
"""


def test_each_step_is_split_into_forward_backward_and_optimizer_time_and_show_prints_the_split(tmp_path: Path) -> None:
    script = _script(tmp_path, PHASES)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = _rows(tmp_path / "train" / "watch.sqlite", "SELECT forward_s, backward_s, optimizer_s, wall_s FROM steps")
    assert len(rows) == 39
    # each phase lasted at least the CPU time burnt in it (a busy machine only makes it longer)
    for forward, backward, optimizer, wall in rows:
        assert forward >= 0.002 and backward >= 0.005 and optimizer >= 0.003, (forward, backward, optimizer)
        assert abs(forward + backward + optimizer - wall) < 1e-6  # no DataLoader here: the step, whole
    inference = _rows(tmp_path / "infer" / "watch.sqlite", "SELECT forward_s, backward_s, optimizer_s FROM steps")
    assert len(inference) == 40 and all(row[1] == 0 and row[2] == 0 and row[0] >= 0.002 for row in inference)
    shown = subprocess.run([sys.executable, "-m", "skalpel", "watch", "--show", str(tmp_path / "train")],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert shown.returncode == 0 and "time split: forward " in shown.stdout and " backward " in shown.stdout, shown


def test_show_reads_a_store_written_before_the_phase_columns(tmp_path: Path) -> None:
    columns = ("step", "end_s", "wall_s", "loader_s", "cpu_s", "runq_s", "rss", "cuda_allocated", "cuda_reserved",
               "profiled")  # fmt: skip
    with sqlite3.connect(tmp_path / "watch.sqlite") as db:
        db.executescript(f"""CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);
            CREATE TABLE steps (step INTEGER PRIMARY KEY, {", ".join(f"{name} REAL" for name in columns[1:])});
            CREATE TABLE anomalies (id INTEGER PRIMARY KEY, step INTEGER, kind TEXT, message TEXT, value REAL,
                baseline REAL, at_s REAL, capture TEXT, summary TEXT);""")
        db.executemany("INSERT INTO steps VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       [(step, step * 0.01, 0.01, 0.0, 0.01, 0.0, 2**28, None, None, 0) for step in range(1, 101)])
    shown = subprocess.run([sys.executable, "-m", "skalpel", "watch", "--show", str(tmp_path)], capture_output=True,
                           text=True, timeout=120)  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "100 steps" in shown.stdout and "time split" not in shown.stdout
