"""`skalpel analyze/diff FILE.pickle`: PyTorch memory snapshots read without torch, and bad pickles refused in one line.

The snapshots are built in the format ``torch.cuda.memory._snapshot()`` returns on torch 2.4 to 2.14 (the keys
its docstring documents and the C++ allocator writes: segments of blocks with frames innermost first,
``device_traces`` of allocator actions, ``allocator_settings``), in the pre-2.1 format (``history``), and by
torch's own ``_profile_to_snapshot`` from a real CPU profile.
"""

from __future__ import annotations

import collections
import json
import os
import pickle
import subprocess
import sys

import pytest

from skalpel.analysis.snapshot import NO_STACK, diff_snapshots, summarize_snapshot
from skalpel.cli import main
from skalpel.report.snapshot_render import render_text
from skalpel.trace.snapshot import load_snapshot

MIB = 2**20
TRAIN = "/home/user/proj/train.py"
LIB = "/usr/lib/python3.11/site-packages/torch/nn/modules/linear.py"


def frame(filename: str, line: int, name: str) -> dict:
    return {"filename": filename, "line": line, "name": name}


def stack(line: int, func: str = "train_step") -> list[dict]:
    """An allocation's frames as torch records them: C++ first, then Python, innermost first."""
    return [frame("??", 0, "c10::cuda::CUDACachingAllocator::malloc"), frame(LIB, 125, "forward"),
            frame(TRAIN, line, func), frame(TRAIN, 90, "<module>")]  # fmt: skip


def block(size: int, state: str = "active_allocated", line: int | None = None, requested: int | None = None) -> dict:
    return {"address": 0, "size": size, "requested_size": size if requested is None else requested, "state": state,
            "frames": stack(line) if line is not None else []}  # fmt: skip


def segment(blocks: list[dict], device: int = 0, address: int = 0x7F0000000000) -> dict:
    total = sum(b["size"] for b in blocks)
    allocated = sum(b["size"] for b in blocks if b["state"] != "inactive")
    return {"device": device, "address": address, "total_size": total, "allocated_size": allocated,
            "active_size": allocated, "requested_size": allocated, "stream": 0, "segment_type": "large",
            "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": blocks}  # fmt: skip


def action(kind: str, size: int, line: int | None = None) -> dict:
    return {"action": kind, "addr": 0x7F0000000000, "size": size, "stream": 0, "time_us": 1,
            "frames": stack(line) if line is not None else [], "compile_context": "", "user_metadata": ""}  # fmt: skip


def snapshot(segments: list[dict], traces: list[list[dict]] | None = None) -> dict:
    return {"segments": segments, "device_traces": traces if traces is not None else [[]],
            "allocator_settings": {"expandable_segments": False}, "external_annotations": []}  # fmt: skip


def dump(tmp_path, data, name: str = "snap.pickle") -> str:
    path = tmp_path / name
    path.write_bytes(pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL))
    return str(path)


def fragmented() -> dict:
    """A 20 MiB weight from line 41 and 6 MiB of activations from 55 held; a 64 MiB segment mostly free, in pieces."""
    weights = segment([block(20 * MIB, line=41, requested=20 * MIB - 512)])
    pieces = segment([block(3 * MIB, line=55), block(10 * MIB, "inactive"), block(3 * MIB, line=55),
                      block(48 * MIB, "inactive")], address=0x7F1000000000)  # fmt: skip
    # a 40 MiB temporary from line 60 came and went before the snapshot: the peak is above what is held now
    trace = [action("segment_alloc", 64 * MIB), action("alloc", 40 * MIB, 60),
             action("free_requested", 40 * MIB, 60), action("free_completed", 40 * MIB, 60),
             action("alloc", 3 * MIB, 55), action("alloc", 3 * MIB, 55)]  # fmt: skip
    return snapshot([weights, pieces], [trace])


def test_summary_of_a_fragmented_cache(tmp_path):
    summary = summarize_snapshot(load_snapshot(dump(tmp_path, fragmented())))
    (device,) = summary.devices
    assert device.allocated_bytes == 26 * MIB and device.requested_bytes == 26 * MIB - 512
    assert device.reserved_bytes == 84 * MIB and device.segments == 2
    assert device.free_in_segments_bytes == 58 * MIB and device.largest_free_block_bytes == 48 * MIB
    # replayed backwards: 26 MiB now, 20 MiB before the two activations, 60 MiB while the temporary lived
    assert device.peak_allocated_bytes == 60 * MIB and device.trace_actions == 6
    assert device.peak_reserved_bytes == 84 * MIB
    biggest = summary.largest_blocks[0]
    assert biggest.size_bytes == 20 * MIB and biggest.location == f"{TRAIN}:41 in train_step"
    assert biggest.stack[0].startswith(LIB)  # the library frame stays in the stack, not in the location
    assert [(site.location, site.bytes, site.blocks) for site in summary.by_site] == [
        (f"{TRAIN}:41 in train_step", 20 * MIB, 1), (f"{TRAIN}:55 in train_step", 6 * MIB, 2)]
    assert summary.notes == ()
    text = render_text(summary)
    assert "largest free block 48.00 MiB" in text and "peak allocated 60.00 MiB" in text


def test_no_trace_and_no_stacks_are_said(tmp_path):
    data = snapshot([segment([block(MIB), block(MIB, "inactive")])])
    del data["device_traces"]
    summary = summarize_snapshot(load_snapshot(dump(tmp_path, data)))
    assert summary.devices[0].peak_allocated_bytes == MIB and summary.devices[0].trace_actions == 0
    assert summary.by_site[0].location == NO_STACK
    assert any("no device trace" in note for note in summary.notes)
    assert any("_record_memory_history" in note and "stacks" in note for note in summary.notes)


def test_out_of_memory_actions_are_counted(tmp_path):
    data = snapshot([segment([block(MIB, line=3)])], [[action("alloc", MIB, 3), action("oom", 80 * 2**30)]])
    summary = summarize_snapshot(load_snapshot(dump(tmp_path, data)))
    assert summary.devices[0].out_of_memory_events == 1
    assert "1 out-of-memory failures" in render_text(summary)


def test_pre_2_1_history_format(tmp_path):
    legacy = {"size": 4 * MIB, "state": "active_allocated",
              "history": [{"addr": 0, "real_size": 4 * MIB - 100, "frames": stack(12)}]}  # fmt: skip
    summary = summarize_snapshot(load_snapshot(dump(tmp_path, snapshot([segment([legacy])]))))
    assert summary.devices[0].requested_bytes == 4 * MIB - 100
    assert summary.by_site[0].location == f"{TRAIN}:12 in train_step"
    assert any("before 2.1" in note for note in summary.notes)


def test_two_devices_are_kept_apart(tmp_path):
    data = snapshot([segment([block(MIB, line=1)]), segment([block(3 * MIB, line=2)], device=1)], [[], []])
    devices = summarize_snapshot(load_snapshot(dump(tmp_path, data))).devices
    assert [(d.device, d.allocated_bytes) for d in devices] == [(0, MIB), (1, 3 * MIB)]


def test_diff_names_the_line_that_grew(tmp_path):
    before = dump(tmp_path, fragmented(), "a.pickle")
    grown = fragmented()
    grown["segments"].append(segment([block(32 * MIB, line=77), block(MIB, line=55)], address=0x7F2000000000))
    after = dump(tmp_path, grown, "b.pickle")
    diff = diff_snapshots(load_snapshot(before), load_snapshot(after))
    assert diff.allocated_delta_bytes == 33 * MIB and diff.reserved_delta_bytes == 33 * MIB
    assert [(c.location, c.delta_bytes) for c in diff.grew] == [
        (f"{TRAIN}:77 in train_step", 32 * MIB), (f"{TRAIN}:55 in train_step", MIB)]
    assert diff.shrank == ()
    reverse = diff_snapshots(load_snapshot(after), load_snapshot(before))
    assert reverse.grew == () and reverse.shrank[0].delta_bytes == -32 * MIB


def test_cli_analyze_and_diff(tmp_path, capsys):
    before = dump(tmp_path, fragmented(), "a.pickle")
    grown = fragmented()
    grown["segments"].append(segment([block(32 * MIB, line=77)], address=0x7F2000000000))
    after = dump(tmp_path, grown, "b.pickle")
    assert main(["analyze", before, "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["schema"] == "skalpel.snapshot/1" and data["devices"][0]["peak_allocated_bytes"] == 60 * MIB
    assert main(["diff", before, after, "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["grew"][0]["location"].endswith("train.py:77 in train_step")
    assert main(["diff", before, after]) == 0
    assert "train.py:77 in train_step" in capsys.readouterr().out


def test_a_real_cpu_profile_snapshot(tmp_path):
    """torch's own ``_profile_to_snapshot`` of a real CPU profile: the big tensor is found at its line."""
    import torch
    from torch.cuda._memory_viz import _profile_to_snapshot

    with torch.profiler.profile(profile_memory=True, record_shapes=True, with_stack=True) as prof:
        held = allocate_big(torch)
    path = dump(tmp_path, _profile_to_snapshot(prof))
    summary = summarize_snapshot(load_snapshot(path))
    here = os.path.basename(__file__)
    top = summary.by_site[0]
    assert top.bytes >= held.numel() * 4 and here in top.location and "allocate_big" in top.location
    assert summary.devices[0].peak_allocated_bytes >= held.numel() * 4


def allocate_big(torch):
    return torch.zeros(1024, 1024)  # 4 MiB, the largest allocation of the profile


class _Evil:
    def __reduce__(self):
        return (os.system, (f"touch {os.environ.get('SNAPSHOT_TEST_MARKER', '/nonexistent/x')}",))


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda: pickle.dumps(fragmented())[:-40], "truncated"),
        (lambda: pickle.dumps([1, 2, 3]), "a pickle of a list, not a PyTorch memory snapshot"),
        (lambda: pickle.dumps({"traceEvents": []}), "without 'segments' (keys: traceEvents)"),
        (lambda: pickle.dumps({"segments": [{"total_size": 1, "blocks": [{"size": 1, "state": "held"}]}]}),
         "format skalpel does not know (segment 0 block 0: state 'held')"),
        (lambda: pickle.dumps({"segments": [{"size": 1}]}), "format skalpel does not know (segment 0 has no"),
        (lambda: pickle.dumps({"segments": {}}), "format skalpel does not know (segments is a dict"),
        (lambda: pickle.dumps(snapshot([], [[{"addr": 1}]])), "device_traces[0][0] has no 'action'"),
        (lambda: b'{"traceEvents": []}', "not a readable pickle"),
        (lambda: pickle.dumps(_Evil()), "the pickle asks for posix.system"),
        (lambda: pickle.dumps(collections.OrderedDict(segments=[])), "the pickle asks for collections.OrderedDict"),
    ],
    ids=["truncated", "list", "foreign-dict", "unknown-state", "no-blocks", "segments-dict", "trace-entry",
         "json-named-pickle", "os-system", "foreign-class"],
)  # fmt: skip
def test_bad_pickles_are_one_line(tmp_path, capsys, monkeypatch, make, says):
    marker = tmp_path / "ran"
    monkeypatch.setenv("SNAPSHOT_TEST_MARKER", str(marker))
    path = tmp_path / "bad.pickle"
    path.write_bytes(make())
    assert main(["analyze", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("skalpel: error: ") and says in err and err.count("\n") == 1, err
    assert not marker.exists()  # nothing in the pickle ran


def test_snapshot_and_trace_together_is_an_error(tmp_path, capsys):
    trace = tmp_path / "t.json"
    trace.write_text('{"traceEvents": []}')
    assert main(["analyze", dump(tmp_path, fragmented()), str(trace)]) == 2
    assert "cannot be analysed together" in capsys.readouterr().err


@pytest.mark.slow
def test_analyze_snapshot_imports_no_torch(tmp_path):
    path = dump(tmp_path, fragmented())
    probe = "import sys; from skalpel.cli import main; main(['analyze', sys.argv[1]]); print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe, path], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False"
