"""PyTorch's flight-recorder dumps in their default pickled form, read by ``skalpel analyze`` (issue 38).

The dumps are torch's own: a 2-rank gloo job under torchrun with ``TORCH_FR_BUFFER_SIZE`` set asks
each rank's recorder for the pickle ``_dump_fr_trace()`` returns (the bytes a timeout writes to
``TORCH_FR_DUMP_TEMP_FILE`` + rank, under that name) while rank 0 waits in an all_reduce rank 1 has
not called yet; the JSON form of the same moment beside it. The verdict goes into the report as a
finding (JSON against the shipped schema, the HTML page). Bad input: a dump cut short, a pickle that
names a function, a folder of nothing readable: one line each, nothing run, nothing changed.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from importlib import resources
from pathlib import Path

import jsonschema
import pytest

from skalpel.watching import hangs

JOB = """\
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

out = Path(sys.argv[1])
dist.init_process_group("gloo")
rank = dist.get_rank()
grads = torch.ones(16)
for _ in range(3):
    dist.all_reduce(grads)  # LINE-LOOP


def dump(rank):
    c10d = torch._C._distributed_c10d
    (out / "json" / f"fr_trace_rank_{rank}.json").write_bytes(c10d._dump_fr_trace_json(True, True))
    part = out / "pickled" / f"nccl_trace_rank_{rank}.part"
    part.write_bytes(c10d._dump_fr_trace())  # the pickle a timeout writes to TORCH_FR_DUMP_TEMP_FILE + rank
    part.rename(out / "pickled" / f"nccl_trace_rank_{rank}")


if rank == 0:
    work = dist.all_reduce(torch.ones(16), async_op=True)  # LINE-WAITS
    dump(rank)
    work.wait()
else:
    deadline = time.monotonic() + 60  # rank 0 failed: end, do not hang the test
    while not (out / "pickled" / "nccl_trace_rank_0").exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # elsewhere while rank 0 waits
    dump(rank)
    dist.all_reduce(torch.ones(16))  # LINE-LATE
dist.destroy_process_group()
"""


def _line(marker: str) -> int:
    return next(number for number, text in enumerate(JOB.splitlines(), 1) if marker in text)


def _analyze(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "skalpel", "analyze", *args], capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def _report_schema() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json.loads(resources.files("skalpel.result").joinpath(
        "report.schema.json").read_text()))  # fmt: skip


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("fr")
    (folder / "json").mkdir()
    (folder / "pickled").mkdir()
    (folder / "train.py").write_text(JOB)
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "64", "OMP_NUM_THREADS": "1"}
    for attempt in range(2):
        job = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                              str(folder / "train.py"), str(folder)], capture_output=True, text=True, timeout=150,
                             env=env)  # fmt: skip
        # the job is torch's alone (no skalpel): in a CI beside busy loops a rank of it once aborted in torch's own
        # teardown ("terminate called without an active exception", SIGABRT); the dumps it makes are the test's
        # input, so such a crash of torch's is run again, once, from empty folders
        if job.returncode == 0 or "SIGABRT" not in job.stderr or attempt:
            break
        for kind in ("json", "pickled"):
            for path in (folder / kind).iterdir():
                path.unlink()
    assert job.returncode == 0, job.stderr[-3000:]
    return folder


@pytest.mark.slow
def test_pickled_dumps_torch_wrote_on_gloo_name_the_rank_that_never_came(dumps: Path) -> None:
    pickled = dumps / "pickled"
    assert sorted(path.name for path in pickled.iterdir()) == ["nccl_trace_rank_0", "nccl_trace_rank_1"]
    assert (pickled / "nccl_trace_rank_0").read_bytes()[:2] == b"\x80\x02"  # a pickle, as torch writes it
    (finding,), notes = hangs.verdict(pickled)
    assert notes == []
    assert finding.id == "collective_hang" and finding.evidence["record"] == "the flight recorder's dumps"
    assert finding.evidence["waiting"] == "rank 0" and finding.evidence["missing"] == "rank 1"
    assert finding.evidence["seq"] == 4 and finding.evidence["op"] == "all_reduce"
    assert finding.evidence["sizes"] == [[16]] and finding.title.endswith(": rank 0 waits, rank 1 never came")
    waits = f"{dumps / 'train.py'}:{_line('LINE-WAITS')} in <module>"
    assert finding.evidence["waiting_lines"] == [waits] and list(finding.locations) == [waits]
    (missing,) = finding.evidence["missing_ranks"]
    assert missing["last_collective"] == (f"#3 all_reduce [[16]] (default_pg) at {dumps / 'train.py'}:"
                                          f"{_line('LINE-LOOP')} in <module>: completed")  # fmt: skip
    (same,), _ = hangs.verdict(dumps / "json")  # the JSON form of the same moment: the same verdict, no lines
    for key in ("seq", "op", "sizes", "waiting", "missing", "group"):
        assert same.evidence[key] == finding.evidence[key], key
    assert same.evidence["waiting_lines"] == [] and same.locations == ()  # torch's JSON dump keeps no frames


@pytest.mark.slow
def test_the_verdict_is_a_finding_in_the_json_report_and_the_html_page(dumps: Path, tmp_path: Path) -> None:
    shown = _analyze(str(dumps / "pickled"))
    assert shown.returncode == 0, shown.stderr
    assert "rank 0 waits in all_reduce #4 (default_pg) at " in shown.stdout
    assert "rank 1 never came: it is in no stack dumped; its last collective #3" in shown.stdout
    printed = _analyze(str(dumps / "pickled"), "--json", "-")
    assert printed.returncode == 0, printed.stderr
    report = json.loads(printed.stdout)  # the JSON alone on stdout: no verdict text before it
    _report_schema().validate(report)
    (finding,) = report["findings"]
    assert finding["id"] == "collective_hang" and finding["severity"] == "critical"
    assert finding["evidence"]["missing"] == "rank 1" and finding["evidence"]["seq"] == 4
    assert finding["locations"] == [f"{dumps / 'train.py'}:{_line('LINE-WAITS')} in <module>"]
    assert report["source"]["world_size"] == 2 and report["ranks"] == [] and report["steps"]["count"] == 0
    page = tmp_path / "report.html"
    written = _analyze(str(dumps / "pickled"), "--html", str(page), "--json", str(tmp_path / "report.json"))
    assert written.returncode == 0, written.stderr
    html = page.read_text()
    assert "[collective_hang]" in html and "The job stopped in collective #4 (all_reduce)" in html
    assert f"train.py:{_line('LINE-WAITS')} in &lt;module&gt;" in html
    assert json.loads((tmp_path / "report.json").read_text())["findings"] == report["findings"]
    one = _analyze(str(dumps / "pickled" / "nccl_trace_rank_0"), "--json", "-")  # one dump named alone: read
    assert one.returncode == 0 and json.loads(one.stdout)["source"]["world_size"] == 1, one.stderr


@pytest.mark.slow
def test_a_dump_cut_short_is_one_line_and_the_others_are_judged(dumps: Path, tmp_path: Path) -> None:
    whole = (dumps / "pickled" / "nccl_trace_rank_1").read_bytes()
    (tmp_path / "nccl_trace_rank_0").write_bytes((dumps / "pickled" / "nccl_trace_rank_0").read_bytes())
    (tmp_path / "nccl_trace_rank_1").write_bytes(whole[: len(whole) // 2])  # the rank died while writing it
    before = {path.name: path.read_bytes() for path in tmp_path.iterdir()}
    shown = _analyze(str(tmp_path))
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
    assert (f"note: {tmp_path / 'nccl_trace_rank_1'}: not a readable pickle (it ends early (truncated)); expected a "
            "PyTorch flight-recorder dump") in shown.stdout  # fmt: skip
    assert "note: no readable dump of rank(s) 1 (their process groups name them): judged without them" in shown.stdout
    assert ": rank 0 waits, no record of a rank that did not" in shown.stdout  # not "every rank came"
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir()} == before
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "nccl_trace_rank_1").write_bytes(whole[: len(whole) // 2])
    cut = _analyze(str(alone))
    assert cut.returncode != 0 and "Traceback" not in cut.stderr and cut.stdout == ""
    (line,) = cut.stderr.strip().splitlines()
    assert "nccl_trace_rank_1: not a readable pickle (it ends early (truncated))" in line


class _RunsACommand:
    """What a hostile pickle holds: unpickling it would run ``touch MARKER``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_foreign_pickle_runs_nothing_and_is_one_line(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    body = {"version": "2.10", "pg_config": {}, "entries": [_RunsACommand(marker)]}
    (tmp_path / "nccl_trace_rank_0").write_bytes(pickle.dumps(body, protocol=2))
    shown = _analyze(str(tmp_path))
    assert shown.returncode != 0 and "Traceback" not in shown.stderr
    (line,) = shown.stderr.strip().splitlines()
    assert "the pickle asks for posix.system; skalpel reads only pickles of plain values" in line, line
    assert "expected a PyTorch flight-recorder dump" in line
    assert not marker.exists()
    named = _analyze(str(tmp_path / "nccl_trace_rank_0"))  # the file named alone: the same line, not a snapshot's
    assert named.returncode != 0 and "the pickle asks for posix.system" in named.stderr
    assert "flight-recorder dump" in named.stderr and not marker.exists()


def test_a_memory_snapshot_is_still_a_snapshot_not_a_dump(tmp_path: Path) -> None:
    snapshot = tmp_path / "snap.pickle"
    snapshot.write_bytes(pickle.dumps({"segments": [], "device_traces": []}, protocol=2))
    shown = _analyze(str(snapshot), "--json", "-")
    assert shown.returncode == 0, shown.stderr
    summary = json.loads(shown.stdout)
    assert "findings" not in summary, summary  # a snapshot's summary, not a report


def test_a_dump_with_every_collective_completed_names_no_hang(tmp_path: Path) -> None:
    """The shape of the dump torch's flight-recorder tutorial shows (NCCL, version 2.5, one rank, all completed): no
    stop to name, and no step_hang made of a dump that keeps no steps."""
    entry = {"frames": [{"name": "test_short_pickle", "filename": "test/distributed/test_c10d_nccl.py", "line": 3647}],
             "record_id": 0, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": 1,
             "profiling_name": "nccl:all_reduce", "input_sizes": [[3, 4]], "state": "completed", "retired": True,
             "time_discovered_started_ns": None, "is_p2p": False}  # fmt: skip
    body = {"version": "2.5", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
            "pg_status": {"0": {"last_completed_collective": 1}}, "entries": [entry]}  # fmt: skip
    (tmp_path / "trace_0").write_bytes(pickle.dumps(body, protocol=2))
    assert hangs.verdict(tmp_path) == ([], ["no readable dump of rank(s) 1 (their process groups name them): judged "
                                           "without them"])  # fmt: skip
    shown = _analyze(str(tmp_path / "trace_0"))
    assert shown.returncode == 0 and "no hang, no mismatch, no dead rank in them" in shown.stdout, shown.stderr
    body["entries"] = [entry, {**entry, "collective_seq_id": 2, "state": "scheduled", "retired": False}]
    (tmp_path / "trace_0").write_bytes(pickle.dumps(body, protocol=2))  # one in flight: rank 0 waits in #2
    (finding,), _ = hangs.verdict(tmp_path)
    assert finding.id == "collective_hang" and finding.evidence["seq"] == 2 and finding.evidence["waiting"] == "rank 0"
