"""A stopped job's records on their own: the collectives ring, the verdict over ranks, and what cannot be read.

The real jobs (4 ranks of torchrun on gloo: a rank asleep in its loader, a skipped all_reduce,
sizes that differ, a SIGKILL, a straggler) are in test_hang_jobs.py; here the ring is written by
the real patches on torch.distributed (a one-rank gloo group in this process), and the verdict is
judged on records built by hand, as processors are tested on trees built by hand.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import orjson

from skalpel.capture.collectives import Recorder
from skalpel.diagnose.hang import RankRecord, judge, ranks_text, story, where
from skalpel.trace.collective_ring import RING, SLOT, read_ring
from skalpel.watching import hangs
from skalpel.watching.hangwatch import hang_bound
from skalpel.watching.live import line

RING_SCRIPT = """
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from skalpel.capture.collectives import Recorder

original = dist.all_reduce
recorder = Recorder(Path(sys.argv[1]), step=lambda: 7)
recorder.install()
assert dist.all_reduce is not original
dist.init_process_group("gloo", init_method=f"file://{sys.argv[1]}/store", rank=0, world_size=1)
dist.all_reduce(torch.ones(3, 4))  # LINE-A
dist.broadcast(torch.ones(5, dtype=torch.int64), 0)  # LINE-B
work = dist.all_reduce(torch.ones(2), async_op=True)
work.wait()
dist.barrier()
try:
    dist.all_reduce("not a tensor")
except Exception:
    pass
recorder.uninstall()
assert dist.all_reduce is original  # uninstalled: torch's own again
dist.destroy_process_group()
"""


def _line(source: str, marker: str) -> int:
    return next(number for number, text in enumerate(source.splitlines(), 1) if marker in text)


def test_the_ring_holds_each_collective_with_its_sequence_sizes_state_and_line(tmp_path: Path) -> None:
    script = tmp_path / "ring.py"
    script.write_text(textwrap.dedent(RING_SCRIPT))
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    entries, torn = read_ring(tmp_path / RING)
    assert torn == 0
    assert [(entry["seq"], entry["op"], entry["state"]) for entry in entries] == [
        (1, "all_reduce", "completed"), (2, "broadcast", "completed"), (3, "all_reduce", "async"),
        (4, "barrier", "completed"), (5, "all_reduce", "failed"),
    ]  # fmt: skip
    first, second = entries[0], entries[1]
    assert first["sizes"] == [[3, 4]] and first["dtype"] == "float32" and first["step"] == 7
    assert second["sizes"] == [[5]] and second["dtype"] == "int64"
    assert first["line"] == f"{script}:{_line(RING_SCRIPT, 'LINE-A')} in <module>"
    assert second["line"] == f"{script}:{_line(RING_SCRIPT, 'LINE-B')} in <module>"
    assert first["done"] >= first["t"]


def test_a_torn_slot_is_counted_and_left_out_and_the_ring_wraps(tmp_path: Path) -> None:
    recorder = Recorder(tmp_path)
    ring = recorder.ring
    for index in range(300):  # more than the slots: the oldest are overwritten
        ring.end(ring.issue("all_reduce", "default", [[index]], "float32", "train.py:9 in step"), "completed")
    recorder.uninstall()
    data = bytearray((tmp_path / RING).read_bytes())
    data[SLOT * 10 + 20:SLOT * 11] = b"\x00" * (SLOT - 20)  # a slot cut off mid-write
    (tmp_path / RING).write_bytes(bytes(data))
    entries, torn = read_ring(tmp_path / RING)
    assert torn == 1 and len(entries) == 255
    assert entries[-1]["seq"] == 300 and entries[0]["seq"] == 45  # 300 - 256 + 1, less the torn one


def _record(rank: int, entries: list[tuple[int, str, list, str, str]], **fields) -> RankRecord:
    collectives = [{"seq": seq, "op": op, "sizes": sizes, "line": line, "state": state, "group": "default"}
                   for seq, op, sizes, line, state in entries]  # fmt: skip
    return RankRecord(rank=rank, collectives=collectives, **fields)


LOOP = [["train.py", 30, "<module>"]]


def test_waiting_ranks_and_the_one_that_never_came_are_named_with_their_lines() -> None:
    done = [(seq, "all_reduce", [[64]], "train.py:61 in step", "completed") for seq in range(1, 41)]
    hang = {"step": 20, "stalled_s": 2.1, "bound_s": 2.0}
    waiting = [_record(rank, done + [(41, "all_reduce", [[64]], "train.py:61 in step", "issued")], status="running",
                       hang=hang, stack=LOOP + [["train.py", 61, "step"]]) for rank in (0, 1, 2, 4)]  # fmt: skip
    loader = LOOP + [["/x/site-packages/torch/utils/data/dataloader.py", 725, "__next__"],
                     ["train.py", 88, "__getitem__"]]  # fmt: skip
    late = _record(3, done, status="running", hang=hang, stack=loader)
    (finding,) = judge(waiting + [late])
    assert finding.id == "collective_hang"
    assert finding.evidence["seq"] == 41 and finding.evidence["waiting"] == "ranks 0-2, 4"
    assert finding.evidence["missing"] == "rank 3" and finding.evidence["waiting_lines"] == ["train.py:61 in step"]
    (missing,) = finding.evidence["missing_ranks"]
    assert missing["where"] == "train.py:30 <module> → dataloader.py:725 __next__ → train.py:88 __getitem__"
    assert finding.locations[0] == "train.py:88 in __getitem__"
    assert finding.title.endswith("#41 (all_reduce): ranks 0-2, 4 wait, rank 3 never came")
    # every rank waits in #41, each in its own call: the hang names no missing rank and points at the mismatch
    apart = [_record(rank, done + [(41, "all_reduce", [[64 + rank]], "train.py:61 in step", "issued")], hang=hang)
             for rank in range(2)]  # fmt: skip
    mismatch, stop = judge(apart)
    assert mismatch.id == "collective_mismatch" and stop.evidence["missing"] == "none"
    assert stop.title.endswith("ranks 0-1 wait, every rank came (they disagree on it: see collective_mismatch)")
    # a hang that resolved (slow, not stuck) leaves no hang to judge: nothing
    assert judge([_record(rank, done) for rank in range(4)]) == []


def test_a_skipped_collective_and_sizes_that_differ_are_mismatches_at_their_sequence_number() -> None:
    common = [(seq, "all_reduce", [[64]], "t.py:28 in average", "completed") for seq in range(1, 11)]
    others = [_record(rank, common + [(11, "all_reduce", [[64]], "t.py:28 in average", "issued")]) for rank in (0, 1)]
    skipper = _record(2, common + [(11, "all_reduce", [[1]], "t.py:37 in <module>", "issued")])
    (finding,) = judge(others + [skipper])
    assert finding.id == "collective_mismatch" and finding.evidence["seq"] == 11
    assert finding.evidence["difference"].startswith(
        "rank 2 calls all_reduce [[1]] at t.py:37 in <module> where ranks 0-1 call all_reduce [[64]] at t.py:28 in "
        "average"
    )
    sizes = [_record(rank, common + [(11, "all_reduce", [[64 + (rank >= 2)]], "t.py:28 in average", "issued")])
             for rank in range(4)]  # fmt: skip
    (finding,) = judge(sizes)
    assert finding.evidence["difference"] == ("all_reduce of [[65]] on ranks 2-3, of [[64]] on ranks 0-1 at "
                                              "t.py:28 in average")  # fmt: skip


def test_collectives_without_a_line_are_told_without_one() -> None:
    # the flight recorder's entries (DDP's gradient buckets) carry no line: the verdict never says "at None"
    hang = {"step": 29, "stalled_s": 3.1, "bound_s": 3.0}
    done = [(seq, "all_reduce", [[33]], None, "completed") for seq in range(1, 36)]
    waiting = _record(0, done + [(36, "all_reduce", [[33]], None, "issued")], status="running", hang=hang,
                      stack=LOOP + [["train.py", 17, "<module>"]])  # fmt: skip
    loader = LOOP + [["/x/site-packages/torch/utils/data/dataloader.py", 725, "__next__"],
                     ["train.py", 10, "__getitem__"]]  # fmt: skip
    late = _record(1, done, status="running", hang=hang, stack=loader)
    (finding,) = judge([waiting, late])
    told = "\n".join(story(finding))
    assert finding.id == "collective_hang" and "#35 all_reduce [[33]] (default): completed" in told, told
    assert "None" not in told, told
    sizes = [_record(rank, done + [(36, "all_reduce", [[33 + rank]], None, "issued")]) for rank in range(2)]
    mismatch = judge(sizes)[0]
    assert mismatch.id == "collective_mismatch" and "None" not in "\n".join(story(mismatch)), story(mismatch)
    assert mismatch.evidence["difference"] == "all_reduce of [[34]] on rank 1, of [[33]] on rank 0"


def test_a_dead_rank_is_named_with_how_it_ended_and_a_live_unclosed_one_is_not() -> None:
    common = [(seq, "all_reduce", [[8]], "t.py:5 in f", "completed") for seq in range(1, 4)]
    killed = _record(1, common, status="running", alive=False, steps=12)
    failed = _record(0, common, status="ended", exit_status=1, error="RuntimeError: Connection reset by peer")
    (finding,) = judge([failed, killed])
    assert finding.id == "rank_died" and finding.rank == 1 and "killed without a word" in finding.title
    assert finding.evidence["then_failed"] == [{"rank": 0, "exit_status": 1,
                                                "error": "RuntimeError: Connection reset by peer"}]  # fmt: skip
    assert judge([failed, _record(1, common, status="running", alive=True)]) == []  # still running: not dead
    raised = _record(2, common, status="ended", exit_status=1, error="ValueError: bad sample",
                     error_line="t.py:9 in load")  # fmt: skip
    (first,) = judge([failed, raised])  # its own error; rank 0's reset connection is its consequence
    assert first.rank == 2 and first.locations == ("t.py:9 in load",) and "ValueError: bad sample" in first.title
    assert [other["rank"] for other in first.evidence["then_failed"]] == [0]
    assert judge([failed, _record(1, common, status="running", alive=None)]) == []  # another host: cannot tell


def test_clocks_that_disagree_change_nothing_the_verdict_goes_by_sequence_numbers() -> None:
    done = [(seq, "all_reduce", [[64]], "t.py:6 in f", "completed") for seq in range(1, 6)]
    hang = {"step": 3, "stalled_s": 2.5, "bound_s": 2.0}
    records = [_record(0, done + [(6, "all_reduce", [[64]], "t.py:6 in f", "issued")], hang=hang),
               _record(1, done, hang=hang, stack=LOOP)]  # fmt: skip
    verdict = judge(records)
    for offset, record in zip((0.0, 3600.0), records):  # rank 1's clock an hour ahead, and its times out of order
        for index, entry in enumerate(record.collectives):
            entry["t"], entry["done"] = 1e9 + offset - index, 1e9 + offset - index + 0.01
    assert judge(records) == verdict and verdict[0].evidence["missing"] == "rank 1"


def test_helpers_say_ranges_stacks_the_bound_and_the_live_line_shows_it() -> None:
    assert ranks_text([0, 1, 2, 4, 6, 7]) == "ranks 0-2, 4, 6-7" and ranks_text([3]) == "rank 3"
    assert where([]) is None
    assert hang_bound(None, 60.0) == 60.0 and hang_bound(0.1, 60.0) == 60.0 and hang_bound(10.0, 60.0) == 200.0
    assert "· hang after 200 s ·" in line(120, 10.0, None, "RSS", 0, False, hang_bound(10.0, 60.0)) + " ·"
    assert "hang after" not in line(120, 10.0, None, "RSS", 0, False)


def test_bad_input_is_one_line_each_and_nothing_is_lost(tmp_path: Path) -> None:
    job = tmp_path / "job"
    for rank in (0, 1, 3):  # rank 2 left no folder
        folder = job / f"rank{rank}"
        folder.mkdir(parents=True)
        recorder = Recorder(folder)
        recorder.ring.end(recorder.ring.issue("all_reduce", "default", [[4]], None, "t.py:3 in f"), "completed")
        recorder.uninstall()
    (job / "rank1" / "hang-1.json.tmp").write_bytes(b'{"rank": 1, "stac')  # died while writing its dump
    (job / "rank3" / "hang-1.json").write_bytes(b"{not json")
    (job / "rank3" / "fatal-stacks.txt").write_text("")  # enabled, never written: no fatal signal
    before = sorted(path.name for path in job.rglob("*"))
    findings, notes = hangs.verdict(job)
    assert findings == []
    assert "no record of rank(s) 2 (no rank<N>/ folder with a store): judged without them" in notes
    assert "rank 1: hang-1.json.tmp: a dump cut short (the rank died while writing it): left out" in notes
    assert any(note.startswith("rank 3: hang-1.json cannot be read (") for note in notes), notes
    assert sorted(path.name for path in job.rglob("*")) == before  # reading changes nothing in the folder
    shown = subprocess.run([sys.executable, "-m", "skalpel", "analyze", str(job)], capture_output=True, text=True,
                           timeout=120)  # fmt: skip
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
    assert "no hang, no mismatch, no dead rank in them" in shown.stdout
    assert "note: rank 1: hang-1.json.tmp: a dump cut short" in shown.stdout


def test_flight_recorder_dumps_of_a_job_run_without_skalpel_are_read(tmp_path: Path) -> None:
    def entry(seq: int, sizes: list, retired: bool) -> dict:
        return {"collective_seq_id": seq, "profiling_name": "gloo:all_reduce", "input_sizes": sizes,
                "retired": retired, "state": "scheduled", "is_p2p": False, "process_group": ["0", "default_pg"],
                "record_id": seq}  # fmt: skip

    body = {"version": "2.10", "pg_config": {}, "comm_lib_version": ""}
    for rank in range(3):
        entries = [entry(seq, [[64]], True) for seq in range(1, 6)]
        if rank != 2:  # rank 2 never issued #6
            entries.append(entry(6, [[64]], False))
        (tmp_path / f"fr_trace_rank_{rank}.json").write_bytes(orjson.dumps({**body, "entries": entries}))
    (tmp_path / "fr_trace_rank_3.json").write_bytes(b'{"version": "2.10", "entries": [{"collective_seq_id": 1, "pr')
    records, notes = hangs.read(tmp_path)
    assert [record.rank for record in records] == [0, 1, 2]
    (note,) = notes
    assert note.startswith(f"{tmp_path / 'fr_trace_rank_3.json'}: not whole JSON (") and note.endswith(": left out")
    assert records[0].collectives[-1] == {"n": 6, "seq": 6, "op": "all_reduce", "group": "default_pg",
                                          "sizes": [[64]], "dtype": None, "state": "issued", "line": None}  # fmt: skip
    (finding,) = judge(records)  # a recorder's dump is taken when the job stopped (its watchdog's timeout)
    assert finding.id == "collective_hang" and finding.evidence["waiting"] == "ranks 0-1"
    assert finding.evidence["missing"] == "rank 2" and finding.evidence["seq"] == 6
    assert finding.evidence["record"] == "the flight recorder's dumps"


def test_the_dumps_beside_a_runs_traces_are_no_traces_to_the_loader(tmp_path: Path) -> None:
    from skalpel.trace.loader import find_trace_files
    from tests.tracebuilder import TraceBuilder

    builder = TraceBuilder()
    builder.step(1, 1_000.0, 9_000.0)
    (tmp_path / "capture-9-asked").mkdir()
    trace = builder.write(tmp_path / "capture-9-asked" / "trace-rank0.json")
    for name in ("hang-1.json", "fr-trace-1.json", "asked-124743-6e3301.json"):
        (tmp_path / "rank0").mkdir(exist_ok=True)
        (tmp_path / "rank0" / name).write_bytes(b'{"stacks": []}')
    (tmp_path / "hang-notes.json").write_bytes(b"{}")  # a name of the user's own: still looked at
    assert find_trace_files([tmp_path]) == sorted([trace, tmp_path / "hang-notes.json"])


def test_the_verdict_beside_a_runs_traces_is_among_the_reports_findings(tmp_path: Path) -> None:
    """A watched job's folder with a capture's trace and hang dumps: one report, the hang among its findings."""
    from importlib import resources

    import jsonschema

    from tests.tracebuilder import TraceBuilder

    job = tmp_path / "job"
    for rank in range(3):
        folder = job / f"rank{rank}"
        folder.mkdir(parents=True)
        recorder = Recorder(folder)
        recorder.ring.end(recorder.ring.issue("all_reduce", "default", [[4]], None, "t.py:3 in f"), "completed")
        if rank != 2:  # rank 2 never called #2
            recorder.ring.issue("all_reduce", "default", [[4]], None, "t.py:3 in f")
        recorder.uninstall()
        stack = [["t.py", 9 if rank == 2 else 3, "load" if rank == 2 else "f"]]
        dump = {"step": 5, "stalled_s": 3.0, "bound_s": 2.0, "stacks": [{"main": True, "frames": stack}]}
        (folder / "hang-1.json").write_bytes(orjson.dumps(dump))
    builder = TraceBuilder()
    builder.step(1, 1_000.0, 9_000.0)
    (job / "capture-1").mkdir()
    builder.write(job / "capture-1" / "trace-rank0.json")
    shown = subprocess.run([sys.executable, "-m", "skalpel", "analyze", str(job), "--json", "-"], capture_output=True,
                           text=True, timeout=120)  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    report = orjson.loads(shown.stdout)
    schema = orjson.loads(resources.files("skalpel.result").joinpath("report.schema.json").read_bytes())
    jsonschema.Draft202012Validator(schema).validate(report)
    assert len(report["ranks"]) == 1 and "too_few_steps" in {f["id"] for f in report["findings"]}  # the trace too
    (hang,) = [finding for finding in report["findings"] if finding["id"] == "collective_hang"]
    assert hang["evidence"]["waiting"] == "ranks 0-1" and hang["evidence"]["missing"] == "rank 2"
    assert hang["evidence"]["seq"] == 2 and hang["locations"] == ["t.py:9 in load", "t.py:3 in f"]
    assert report["findings"][0]["severity"] == "critical"  # most severe first, as every report
    quiet = subprocess.run([sys.executable, "-m", "skalpel", "analyze", str(job / "capture-1"), "--json", "-"],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert quiet.returncode == 0 and "collective_hang" not in quiet.stdout  # the capture alone: no dumps, no verdict


def test_explain_knows_the_asked_kind_and_the_docs_list_the_four_hang_findings(capsys) -> None:
    from skalpel.cli import main

    assert main(["explain", "asked"]) == 0
    out = capsys.readouterr().out
    assert "asked  (watch, info)" in out and "skalpel watch --ask RUN profile N" in out and "max_steps=50" in out
    assert main(["explain", "asked", "--json"]) == 0
    assert orjson.loads(capsys.readouterr().out)["id"] == "asked"
    assert main(["explain"]) == 0
    assert "slow_rank, asked" in " ".join(capsys.readouterr().out.split())  # listed with the other kinds
    docs = Path(__file__).resolve().parents[1] / "docs"
    findings, watch = (docs / "findings.md").read_text(), (docs / "watch.md").read_text()
    for finding_id in ("collective_hang", "step_hang", "collective_mismatch", "rank_died"):
        assert main(["explain", finding_id]) == 0 and f"`{finding_id}`" in findings
    assert "| `asked` |" in watch and "skalpel explain asked" in findings
