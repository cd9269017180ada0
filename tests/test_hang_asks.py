"""Asking a running watch from another terminal (`skalpel watch --ask RUN stacks | profile N`), for real.

A 4-rank torchrun job on gloo under `skalpel watch --out JOB` is asked for its stacks (every rank
answers with its main thread's place) and for a profile of its next 5 steps (every rank's same
steps, one report of the job, linked to an `asked` anomaly in rank 0's store). One process is asked
the same. Bad input: a run that has ended, a folder that is no run, a request of another user.
"""

from __future__ import annotations

import os
import sqlite3
import statistics
import subprocess
import sys
import textwrap
import time
from contextlib import closing
from pathlib import Path

import orjson
import pytest

from skalpel.watching.asks import PREFIX, Asks

pytestmark = [pytest.mark.slow, pytest.mark.alone]

JOB = """
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
torch.set_num_threads(1)
model = torch.nn.Linear(16, 16)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(int(sys.argv[1])):
    loss = model(torch.ones(16)).sum()
    loss.backward()
    for parameter in model.parameters():
        dist.all_reduce(parameter.grad)  # LINE-REDUCE
    optimizer.step()
    optimizer.zero_grad()
    time.sleep(0.02)
dist.destroy_process_group()
"""

ONE = """
import sys
import time

import torch

model = torch.nn.Linear(16, 16)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(int(sys.argv[1])):
    model(torch.ones(16)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    time.sleep(0.02)  # LINE-SLEEP
"""


def _skalpel(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "skalpel", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def _steps(store: Path) -> int:
    try:
        with closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True)) as db:
            return db.execute("SELECT COALESCE(MAX(step), 0) FROM steps").fetchone()[0]
    except sqlite3.Error:
        return 0


def _wait_for_steps(stores: list[Path], steps: int, job: subprocess.Popen) -> None:
    deadline = time.monotonic() + 90
    while min(_steps(store) for store in stores) < steps:
        assert job.poll() is None and time.monotonic() < deadline, "the job ended before it was asked"
        time.sleep(0.2)


def test_a_running_4_rank_job_answers_with_its_stacks_and_a_profile_of_5_steps_of_every_rank(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(JOB))
    out = tmp_path / "job"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4", "-m", "skalpel",
               "watch", "--out", str(out), str(script), "600"]  # fmt: skip
    with open(tmp_path / "stderr.txt", "w+") as log:
        job = subprocess.Popen(command, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_for_steps([out / f"rank{rank}" / "watch.sqlite" for rank in range(4)], 60, job)
            stacks = _skalpel("watch", "--ask", str(out), "stacks", cwd=tmp_path)
            assert stacks.returncode == 0, stacks.stdout + stacks.stderr
            lines = stacks.stdout.splitlines()
            assert [line.split(" after step ")[0] for line in lines] == [f"rank {rank}" for rank in range(4)], lines
            assert all("train.py:" in line for line in lines), lines  # each rank's main thread, in the script
            assert len(list(out.glob("rank*/asked-*.json"))) == 4
            asked = _skalpel("watch", "--ask", str(out), "profile", "5", cwd=tmp_path)
            assert asked.returncode == 0 and "a profile of the next 5 steps" in asked.stdout, asked.stderr
            assert job.wait(timeout=240) == 0
        finally:
            if job.poll() is None:
                job.kill()
                job.wait()
        log.seek(0)
        text = log.read()
    (capture,) = out.glob("capture-*-asked")
    report = orjson.loads((capture / "report.json").read_bytes())
    assert [rank["rank"] for rank in report["ranks"]] == [0, 1, 2, 3], text[-3000:]  # one report of the job
    assert report["capture"]["active_steps"] == 5
    with closing(sqlite3.connect(f"file:{out / 'rank0' / 'watch.sqlite'}?mode=ro", uri=True)) as db:
        (row,) = db.execute("SELECT message, capture FROM anomalies WHERE kind = 'asked'").fetchall()
        walls = db.execute("SELECT wall_s, profiled FROM steps ORDER BY step").fetchall()
    assert row[0].startswith("a profile of 5 steps asked for from another terminal") and row[1] == f"../{capture.name}"
    # the steps around it: no cost of the request beyond the capture's own steps (figure in docs/watch.md)
    profiled = [index for index, (_, flag) in enumerate(walls) if flag]
    before = [wall for wall, flag in walls[max(profiled[0] - 50, 0):profiled[0]] if not flag]
    after = [wall for wall, flag in walls[profiled[-1] + 1:profiled[-1] + 51] if not flag]
    ratio = statistics.median(after) / statistics.median(before)
    print(f"rank 0 median step: {statistics.median(before) * 1e3:.1f} ms before the capture, "
          f"{statistics.median(after) * 1e3:.1f} ms after ({ratio:.2f}x)")
    assert 0.5 < ratio < 2.0  # generous: a loaded 2-core machine under 4 ranks


def test_one_process_is_asked_the_same_and_bad_requests_are_one_line_each(tmp_path: Path) -> None:
    script = tmp_path / "one.py"
    script.write_text(textwrap.dedent(ONE))
    out = tmp_path / "run"
    job = subprocess.Popen([sys.executable, "-m", "skalpel", "watch", "--out", str(out), str(script), "700"],
                           cwd=tmp_path, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        _wait_for_steps([out / "watch.sqlite"], 30, job)
        stacks = _skalpel("watch", "--ask", str(out), "stacks", cwd=tmp_path)
        assert stacks.returncode == 0 and stacks.stdout.startswith("the run after step "), stacks
        assert "one.py:" in stacks.stdout
        for bad, said in ((["profile", "0"], "profile N: N steps, 1 to 50 (got 0)"),
                          (["profile"], "ask for `stacks` or `profile N`"),
                          (["dump"], "ask for `stacks` or `profile N`")):  # fmt: skip
            refused = _skalpel("watch", "--ask", str(out), *bad, cwd=tmp_path)
            assert refused.returncode != 0 and said in refused.stderr and "Traceback" not in refused.stderr, refused
        asked = _skalpel("watch", "--ask", str(out), "profile", "3", cwd=tmp_path)
        assert asked.returncode == 0, asked.stderr
        _, stderr = job.communicate(timeout=180)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert job.returncode == 0, stderr[-3000:]
    (capture,) = out.glob("capture-*-asked")
    assert orjson.loads((capture / "report.json").read_bytes())["capture"]["active_steps"] == 3
    assert "captured 3 steps after step " in stderr and "captured 5 steps" not in stderr, stderr[-3000:]
    # the run has ended: asking it is one line, and its folder is left as it was
    def files() -> list[str]:  # (sqlite's -shm/-wal come and go with any reader)
        return sorted(path.name for path in out.rglob("*") if not path.name.endswith(("-shm", "-wal")))

    before = files()
    ended = _skalpel("watch", "--ask", str(out), "stacks", cwd=tmp_path)
    assert ended.returncode != 0 and "Traceback" not in ended.stderr
    assert f"{out}: the run is not running (ended " in ended.stderr and "nothing to ask" in ended.stderr, ended.stderr
    assert files() == before  # no request written
    nothing = _skalpel("watch", "--ask", str(tmp_path), "stacks", cwd=tmp_path)
    assert "not a folder skalpel watch records into" in nothing.stderr and nothing.returncode != 0


def test_a_request_that_is_no_request_of_this_user_is_passed_over(tmp_path: Path) -> None:
    asks = Asks(tmp_path, started=time.time() - 1)
    good = {"id": "a", "what": "stacks", "t": time.time()}
    (tmp_path / f"{PREFIX}a.json").write_bytes(orjson.dumps(good))
    (tmp_path / f"{PREFIX}old.json").write_bytes(orjson.dumps({**good, "id": "old", "t": 0}))  # an earlier run's
    (tmp_path / f"{PREFIX}bad.json").write_bytes(b"{cut")
    (tmp_path / f"{PREFIX}what.json").write_bytes(orjson.dumps({**good, "what": "rm -rf"}))
    os.symlink(tmp_path / f"{PREFIX}a.json", tmp_path / f"{PREFIX}link.json")
    if os.getuid() == 0:  # as root, a file of another user can be made: it is no request
        (tmp_path / f"{PREFIX}other.json").write_bytes(orjson.dumps({**good, "id": "other"}))
        os.chown(tmp_path / f"{PREFIX}other.json", 4242, 4242)
    assert [body["id"] for body in asks.take()] == ["a"]
    assert asks.take() == []  # each is read once
