"""Reading back what a stopped job left in its run folder: each rank's record, for ``diagnose/hang.py``'s verdict.

A run folder of ``skalpel watch`` (one process) or a job's (``JOB/rank<N>/`` under torchrun with
``--out JOB``): per rank, its store's end (``meta``: status, pid, host, exit status, error), its
collectives ring, its last hang dump not resolved, its fatal stacks. Also PyTorch's flight
recorder dumps of a job run without skalpel (``TORCH_FR_DUMP_TEMP_FILE``'s pickles or
``_dump_fr_trace_json``'s JSON, one file per rank, ``trace/flight_recorder.py``). What cannot be
read is one line in the record's notes, never a traceback: a dump cut short by a rank that died
while writing it, a rank with no folder, a torn ring slot. The verdict is also a report
(``verdict_report``: the hang findings as findings, for ``--json`` and the HTML page). No torch here.
"""

from __future__ import annotations

import os
import re
import socket
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import orjson

from ..diagnose.hang import RankRecord, judge, story
from ..errors import TraceError
from ..result.report import Finding, Report, Source, StepStats, sorted_findings
from ..trace.collective_ring import RING, read_ring
from ..trace.flight_recorder import load_flight_recorder, looks_like_flight_recorder
from .store import STORE, read_meta

FATAL = "fatal-stacks.txt"  # faulthandler's stacks at a fatal signal (hangwatch.py enables it)
_RANK_FOLDER = re.compile(r"rank(\d+)$")
_FRAME = re.compile(r'^\s*File "(.+)", line (\d+) in (.+)$')


def has_dumps(folder: Path) -> bool:
    """A run folder that ``read`` has something to judge in: a watched run's, or flight-recorder dumps."""
    return bool(rank_folders(folder)) or bool(_flight_recorder_files(folder))


def rank_folders(folder: Path) -> dict[int, Path]:
    if (folder / STORE).exists() or (folder / RING).exists():
        return {0: folder}
    found = {}
    for child in sorted(folder.iterdir()) if folder.is_dir() else []:
        match = _RANK_FOLDER.match(child.name)
        if match and child.is_dir() and ((child / STORE).exists() or (child / RING).exists()):
            found[int(match.group(1))] = child
    return found


def read(folder: Path) -> tuple[list[RankRecord], list[str]]:
    """Every rank's record, and the lines about the folder itself (a missing rank)."""
    folders = rank_folders(folder)
    if not folders:
        return _read_flight_recorder(folder)
    records = [_read_rank(rank, path) for rank, path in sorted(folders.items())]
    notes = []
    sizes = {int(record_size) for record_size in (_world_size(path) for path in folders.values()) if record_size}
    world = max(sizes) if sizes else len(folders)
    missing = sorted(set(range(world)) - set(folders))
    if missing:
        notes.append(f"no record of rank(s) {', '.join(map(str, missing))} (no rank<N>/ folder with a store): "
                     "judged without them")  # fmt: skip
        records.extend(RankRecord(rank=rank, notes=["no folder"]) for rank in missing)
    return records, notes


def _world_size(path: Path) -> str | None:
    return store_meta(path).get("world_size")


def store_meta(path: Path) -> dict[str, str]:
    store = path / STORE
    if not store.exists():
        return {}
    try:
        with closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True)) as db:
            return read_meta(db)
    except sqlite3.Error:
        return {}


def _read_rank(rank: int, path: Path) -> RankRecord:
    record = RankRecord(rank=rank)
    meta = store_meta(path)
    if meta:
        record.status = meta.get("status", "running")
        record.exit_status = _int(meta.get("exit_status"))
        record.error = meta.get("error") or None
        record.error_line = meta.get("error_line") or None
        record.steps = _int(meta.get("steps"))
        record.alive = alive(_int(meta.get("pid")), meta.get("host"))
    else:
        record.notes.append(f"no readable {STORE} in {path}")
    ring = path / RING
    if ring.exists():
        try:
            record.collectives, torn = read_ring(ring)
        except OSError as error:
            record.notes.append(f"{ring} cannot be read: {error}")
            torn = 0
        if torn:
            record.notes.append(f"{torn} slot(s) of {ring.name} torn (written as the rank died): left out")
    _read_hang(record, path)
    _read_fatal(record, path)
    if record.steps is None:  # never closed: its last step recorded, or the step of its last collective
        ring_step = _int(record.collectives[-1].get("step")) if record.collectives else None
        record.steps = max((step for step in (_last_step(path), ring_step) if step is not None), default=None)
    return record


def _read_hang(record: RankRecord, path: Path) -> None:
    dumps = sorted(path.glob("hang-*.json"), key=lambda item: _int(item.stem.split("-")[-1]) or 0)
    for cut in sorted(path.glob("hang-*.json.tmp")):
        record.notes.append(f"{cut.name}: a dump cut short (the rank died while writing it): left out")
    if not dumps:
        return
    last = dumps[-1]
    try:
        body = orjson.loads(last.read_bytes())
    except (OSError, orjson.JSONDecodeError) as error:
        record.notes.append(f"{last.name} cannot be read ({error}): left out")
        return
    main = next((stack for stack in body.get("stacks", []) if stack.get("main")), None)
    if main is not None:
        record.stack, record.stack_from = main.get("frames", []), last.name
    if record.steps is None:
        record.steps = body.get("step")
    if body.get("resolved_after_s") is None:
        record.hang = {key: body.get(key) for key in ("step", "stalled_s", "bound_s")}
        record.recorder = _recorder_entries(record, path / str(body.get("flight_recorder") or ""))
        if body.get("collectives"):  # the state at the hang (a job ended later marks the call under way failed)
            record.collectives = body["collectives"]
    if not record.collectives:
        record.collectives = body.get("collectives", [])


def _recorder_entries(record: RankRecord, path: Path) -> list[dict[str, Any]]:
    """The flight recorder's entries dumped with a hang (none when it recorded nothing)."""
    if not path.is_file():
        return []
    try:
        body = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as error:
        record.notes.append(f"{path.name} cannot be read ({error}): left out")
        return []
    entries = body.get("entries") if isinstance(body, dict) else None
    return [_from_recorder(entry) for entry in entries or [] if isinstance(entry, dict) and not entry.get("is_p2p")]


def _read_fatal(record: RankRecord, path: Path) -> None:
    fatal = path / FATAL
    try:
        text = fatal.read_text(errors="replace")
    except OSError:
        return
    if not text.strip():
        return
    first = text.strip().splitlines()[0]
    record.fatal = first.removeprefix("Fatal Python error: ").strip() or "a fatal signal"
    # faulthandler writes each thread innermost frame first; the main thread's is the one not started by threading
    # (the signal's own thread, "Current thread", when gloo's C++ thread aborted, is none of Python's)
    blocks = []
    for block in text.split("\n\n"):
        frames = [[match.group(1), int(match.group(2)), match.group(3).strip()]
                  for match in map(_FRAME.match, block.splitlines()) if match]  # fmt: skip
        if frames:
            blocks.append((block.lstrip().startswith("Current thread"), frames[::-1]))
    main = [frames for _, frames in blocks if not frames[0][0].endswith("threading.py")]
    current = [frames for is_current, frames in blocks if is_current]
    chosen = current or main or [frames for _, frames in blocks]
    if chosen:
        record.stack, record.stack_from = chosen[0], FATAL


def _last_step(path: Path) -> int | None:
    try:
        with closing(sqlite3.connect(f"file:{path / STORE}?mode=ro", uri=True)) as db:
            row = db.execute("SELECT MAX(step) FROM steps").fetchone()
    except sqlite3.Error:
        return None
    return _int(row[0]) if row else None


def alive(pid: int | None, host: str | None) -> bool | None:
    """Whether the process is still there (a zombie is not); None when it cannot be told from here."""
    if pid is None or (host is not None and host != socket.gethostname()):
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _int(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


# -- PyTorch's flight recorder, from a job run without skalpel --------------------------------------------------
def _flight_recorder_files(folder: Path) -> list[Path]:
    if folder.is_file():
        return [folder] if looks_like_flight_recorder(folder) else []
    if not folder.is_dir():
        return []
    return [path for path in sorted(folder.iterdir()) if path.is_file() and looks_like_flight_recorder(path)]


def _read_flight_recorder(folder: Path) -> tuple[list[RankRecord], list[str]]:
    """Each rank's dump (JSON or pickled, ``trace/flight_recorder.py``) as a record stopped where it was dumped."""
    records, notes = [], []
    named: set[int] = set()  # the ranks the dumps' process groups name
    for index, path in enumerate(_flight_recorder_files(folder)):
        try:
            body = load_flight_recorder(path)
        except TraceError as error:
            notes.append(f"{error}: left out")
            continue
        named |= _group_ranks(body)
        rank = _int(body.get("rank"))
        rank = rank if rank is not None else index
        # dumped at a collective's timeout (or asked for while it hung): where each rank stood then
        stopped = {"step": None, "stalled_s": None, "bound_s": None}
        record = RankRecord(rank=rank, status="flight recorder", hang=stopped)
        record.collectives = [_from_recorder(entry) for entry in body.get("entries") or []
                              if isinstance(entry, dict) and not entry.get("is_p2p")]  # fmt: skip
        records.append(record)
    missing = sorted(named - {record.rank for record in records})
    if records and missing:
        notes.append(f"no readable dump of rank(s) {', '.join(map(str, missing))} (their process groups name them): "
                     "judged without them")  # fmt: skip
    return records, notes


def _group_ranks(body: dict[str, Any]) -> set[int]:
    """The ranks of every process group a dump names (``pg_config``'s ``ranks``, a JSON list in a string)."""
    ranks: set[int] = set()
    groups = body.get("pg_config")
    for group in groups.values() if isinstance(groups, dict) else ():
        value = group.get("ranks") if isinstance(group, dict) else None
        try:
            listed = orjson.loads(value) if isinstance(value, str) else value
        except orjson.JSONDecodeError:
            continue
        if isinstance(listed, list):
            ranks.update(rank for rank in listed if isinstance(rank, int) and not isinstance(rank, bool))
    return ranks


def _from_recorder(entry: dict[str, Any]) -> dict[str, Any]:
    """A flight-recorder entry in the ring's form (its line: the innermost user frame, when it kept frames)."""
    name = str(entry.get("profiling_name", "?"))
    group = entry.get("process_group") or ["?", "?"]
    if entry.get("retired") or entry.get("state") == "completed":
        state = "completed"
    else:
        state = "issued"
    frames = entry.get("frames") or []
    line = next((f"{frame.get('filename')}:{frame.get('line')} in {frame.get('name')}" for frame in frames
                 if isinstance(frame, dict) and "site-packages" not in str(frame.get("filename"))), None)  # fmt: skip
    return {"n": entry.get("record_id"), "seq": entry.get("collective_seq_id"), "op": name.split(":", 1)[-1],
            "group": str(group[1] if len(group) > 1 else group[0]), "sizes": entry.get("input_sizes"),
            "dtype": None, "state": state, "line": line}  # fmt: skip


def verdict(folder: Path) -> tuple[list[Finding], list[str]]:
    """The findings of a stopped job's records, and the lines about what could not be read. A TraceError (one
    line) when there were only flight-recorder dumps and none could be read."""
    _, findings, notes = _judged(folder)
    return findings, notes


def _judged(folder: Path) -> tuple[list[RankRecord], list[Finding], list[str]]:
    records, notes = read(folder)
    if not records and notes:
        more = f" (and {len(notes) - 1} more dump(s) unreadable)" if len(notes) > 1 else ""
        raise TraceError(notes[0].removesuffix(": left out") + more)
    notes += [f"rank {record.rank}: {note}" for record in records for note in record.notes if note != "no folder"]
    return records, judge(records), notes


def verdict_text(folder: Path, *, say_clean: bool = True) -> str:
    """The verdict for the terminal: each finding's story, then the notes; one line when there is nothing (or
    nothing at all unless ``say_clean``)."""
    findings, notes = verdict(folder)
    if not findings and not notes and not say_clean:
        return ""
    lines = [f"skalpel: the records of {folder}:"]
    for finding in findings:
        lines.extend(story(finding))
    if not findings:
        lines.append("  no hang, no mismatch, no dead rank in them")
    lines.extend(f"  note: {note}" for note in notes)
    return "\n".join(lines) + "\n"


def verdict_report(folders: list[Path]) -> Report:
    """The verdicts of stopped jobs as a report (``skalpel analyze RUN --json/--html``): the hang findings as any
    report's findings, what could not be read as its warnings; no steps or ranks analysed (there is no trace)."""
    findings: list[Finding] = []
    warnings: list[str] = []
    worlds: list[int] = []
    for folder in folders:
        records, found, notes = _judged(folder)
        findings.extend(found)
        warnings.extend(f"{folder}: {note}" for note in notes)
        worlds.append(len(records))
    source = Source(paths=tuple(map(str, folders)), world_size=max(worlds) if worlds and max(worlds) else None)
    return Report(source=source, steps=StepStats(count=0, median_ms=0.0, p90_ms=0.0, cv=0.0, marked=False), ranks=(),
                  findings=tuple(sorted_findings(findings)), warnings=tuple(warnings))  # fmt: skip
