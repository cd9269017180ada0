"""Asking a running watch, from another terminal: its stacks now, or a profile of its next N steps.

``skalpel watch --ask RUN stacks`` / ``--ask RUN profile N`` writes a request file into the run
folder (the job's folder under torchrun: ``JOB/``): ``.watch-ask-<id>.json``, written aside and
renamed (whole), mode 0600. Only the same user may ask: the asker must own the run folder, and a
watch reads only regular files that its own user owns, created after it started. Each rank's
writer thread looks for new requests at each flush (every 0.5 s, also while the training thread
hangs) and answers:

- ``stacks``: every rank writes ``asked-<id>.json`` into its folder (every thread's stack, its
  last collectives: the form of a hang dump), and the asker prints where each main thread is;
- ``profile N``: one rank (rank 0 of a job) records an ``asked`` anomaly, which takes the way of
  every anomaly's capture: under torchrun with ``--out``, every rank's same steps and one report
  of the job (``JOB/capture-<step>-asked/``); in one process, ``capture-<step>-asked/``.

Nothing happens at the steps in between: the requests are read on the writer thread. No torch here.
"""

from __future__ import annotations

import os
import re
import stat
import time
import uuid
from pathlib import Path
from typing import Any

import orjson

from ..diagnose import thresholds
from ..errors import SkalpelError
from .hangs import alive, rank_folders, store_meta

PREFIX = ".watch-ask-"
WHATS = ("stacks", "profile")
MAX_STEPS = int(thresholds.ASKED.param("max_steps"))
_RANK = re.compile(r"rank\d+$")


def answer_name(ask_id: str) -> str:
    return f"asked-{ask_id}.json"


def meeting_folder(run: Path) -> Path:
    """Where the ranks of ``run`` read their requests: the job's folder under torchrun, else the run's own."""
    if _RANK.match(run.name) and len(rank_folders(run.parent)) > 1:
        return run.parent
    return run


def check_running(run: Path) -> dict[int, dict[str, str]]:
    """Each rank's store meta, when the run is watched and runs now; else a SkalpelError in one line."""
    if not run.is_dir():
        raise SkalpelError(f"{run}: no such run folder")
    folders = rank_folders(run)
    if not folders:
        raise SkalpelError(f"{run}: not a folder skalpel watch records into (no watch.sqlite in it or its rank<N>/)")
    owner = run.stat().st_uid
    if owner != os.getuid():
        raise SkalpelError(f"{run} belongs to uid {owner}: only the user who runs the watch may ask it")
    metas = {rank: store_meta(path) for rank, path in folders.items()}
    running = {rank: meta for rank, meta in metas.items() if meta.get("status") == "running"
               and alive(_int(meta.get("pid")), meta.get("host")) is not False}  # fmt: skip
    if not running:
        ended = next(iter(metas.values()), {})
        how = (f"ended {ended.get('ended', '')} with exit status {ended.get('exit_status')}".strip()
               if ended.get("status") == "ended" else "its process is gone")  # fmt: skip
        raise SkalpelError(f"{run}: the run is not running ({how}): nothing to ask; its records stay as they are")
    return running


def ask(run: Path, what: str, steps: int | None = None) -> tuple[str, Path, dict[int, dict[str, str]]]:
    """Write the request; its id, the folder it was written to, and the running ranks' meta."""
    if what not in WHATS:
        raise SkalpelError(f"ask for one of {', '.join(WHATS)} (got {what!r})")
    folder = meeting_folder(run)
    running = check_running(folder)
    if what == "profile":
        if steps is None or not 1 <= steps <= MAX_STEPS:
            raise SkalpelError(f"profile N: N steps, 1 to {MAX_STEPS} (got {steps})")
        if all(meta.get("capture") == "False" for meta in running.values()):
            raise SkalpelError(f"{folder}: this run takes no captures (--no-capture, or torchrun without --out): "
                               "ask for its stacks")  # fmt: skip
    ask_id = f"{time.strftime('%H%M%S')}-{uuid.uuid4().hex[:6]}"
    body = {"id": ask_id, "what": what, "steps": steps, "t": time.time(), "pid": os.getpid()}
    path = folder / f"{PREFIX}{ask_id}.json"
    aside = folder / f".{PREFIX}{ask_id}.tmp"
    try:
        descriptor = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "wb") as file:
            file.write(orjson.dumps(body))
        os.replace(aside, path)
    except OSError as error:
        raise SkalpelError(f"cannot write the request into {folder}: {error.strerror or error}") from None
    return ask_id, folder, running


def wait_for_answers(folder: Path, ask_id: str, ranks: list[int], timeout_s: float) -> dict[int, dict[str, Any]]:
    """The ranks' answers to a ``stacks`` request, as they come, until every rank answered or the time is up."""
    folders = rank_folders(folder)
    found: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    while True:
        for rank in ranks:
            path = folders.get(rank, folder) / answer_name(ask_id)
            if rank not in found and path.exists():
                try:
                    found[rank] = orjson.loads(path.read_bytes())
                except (OSError, orjson.JSONDecodeError):
                    continue  # being renamed into place: read at the next look
        if len(found) == len(ranks) or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


class Asks:
    """A watch's side: the new requests of its own user in its meeting folder (read on the writer thread)."""

    def __init__(self, folder: Path, started: float) -> None:
        self.folder = folder
        self.started = started  # time.time(): requests left from an earlier run in the folder are not this run's
        self.seen: set[str] = set()

    def take(self) -> list[dict[str, Any]]:
        new = []
        try:
            names = [name for name in os.listdir(self.folder) if name.startswith(PREFIX) and name.endswith(".json")]
        except OSError:
            return []
        for name in sorted(names):
            if name in self.seen:
                continue
            self.seen.add(name)
            path = self.folder / name
            try:
                info = os.lstat(path)
                if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
                    continue  # a link, or another user's file: not a request
                body = orjson.loads(path.read_bytes())
            except (OSError, orjson.JSONDecodeError):
                continue
            if isinstance(body, dict) and body.get("what") in WHATS and float(body.get("t", 0)) >= self.started:
                new.append(body)
        return new


def _int(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None
