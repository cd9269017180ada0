"""Capture on every rank: one run folder per job, one trace per rank, one merged report.

Under ``torchrun`` each rank runs ``skalpel run`` (``torchrun ... -m skalpel run train.py``):

- the ranks agree on one run folder: ``--out`` or ``$SKALPEL_OUT`` when given (multi-node:
  a shared filesystem), else rank 0's default folder, published through torchrun's agent
  store (the TCPStore at MASTER_ADDR:MASTER_PORT, not the user's process group);
- every rank writes ``trace-rank{R}.json.gz`` (torch.profiler records ``distributedInfo``
  itself), tagged with one run id for the whole job, so files of different runs can be
  told apart later;
- rank 0 waits for the other ranks' traces (``$SKALPEL_RANK_WAIT_S``, 120 s) and writes the
  merged report; the other ranks write their trace only.

``skalpel run --nproc N`` launches the script through ``torch.distributed.run`` itself
(``launch``); its children write traces only (``$SKALPEL_TRACE_ONLY``) and the launcher
merges them after they exit (``command.launch_and_merge``), which survives a rank that dies.
Nodes without a shared folder: copy every node's ``trace-rank*.json.gz`` into one folder
and run ``skalpel analyze FOLDER``.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from .. import env
from ..errors import SkalpelError
from . import runfolder, signals

ENV_OUT = env.OUT.name
ENV_TRACE_ONLY = env.TRACE_ONLY.name
ENV_RUN_ID = env.RUN_ID.name
ENV_WAIT = env.RANK_WAIT_S.name
_STORE_KEY = "skalpel/run_folder"


@dataclass(frozen=True)
class Job:
    """This process's place in a multi-process job, from the launcher's environment."""

    rank: int
    world_size: int
    run_id: str | None  # shared by every rank of the job
    trace_only: bool  # write the trace, leave the report to the launcher


def job() -> Job | None:
    """The job this process belongs to; None for a single process."""
    group = process_group() if "RANK" not in os.environ else None
    try:
        world = group[0] if group else int(os.environ.get("WORLD_SIZE", "1"))
        rank = group[1] if group else int(os.environ.get("RANK", "0"))
    except ValueError:
        return None
    if world <= 1:
        return None
    elastic = os.environ.get("TORCHELASTIC_RUN_ID")
    run_id = env.text(env.RUN_ID) or (elastic if elastic and elastic != "none" else None)
    return Job(rank, world, run_id, env.text(env.TRACE_ONLY) == "1")


def process_group() -> tuple[int, int] | None:
    """(world size, rank) of torch.distributed's default group once the script started one; None before, or alone.

    For the launchers that set no ``RANK`` (Lightning's DDP, ``mp.spawn``); torch is not imported for it.
    """
    torch = sys.modules.get("torch")
    group = getattr(torch, "distributed", None) if torch is not None else None
    if group is None or not group.is_available() or not group.is_initialized():
        return None
    return int(group.get_world_size()), int(group.get_rank())


def folder_by_group(label: str) -> Path | None:
    """Rank 0's new default folder, sent to every rank over the script's process group: a collective, for callers
    that run on every rank at once (a framework's callback); None alone."""
    group = process_group()
    if group is None or group[0] <= 1:
        return None
    import torch.distributed

    sent = [str(runfolder.prepare_new(runfolder.default_folder(label))) if group[1] == 0 else None]
    torch.distributed.broadcast_object_list(sent, src=0)
    return Path(sent[0])


def run_folder(out: Path | None, label: str) -> Path:
    """The run folder of this process (absolute): the same for every rank of a job (see the module doc)."""
    if out is None and env.text(env.OUT):
        out = Path(env.text(env.OUT))
    current = job()
    if out is None and current is not None:
        out = _agreed_folder(current, label)
    return runfolder.prepare(out) if out is not None else runfolder.prepare_new(runfolder.default_folder(label))


def _agreed_folder(current: Job, label: str) -> Path | None:
    """Rank 0's new default folder, through torchrun's agent store; None (each rank its own) without one."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() != "true":
        return None
    mine = runfolder.prepare_new(runfolder.default_folder(label)) if current.rank == 0 else None
    try:
        from torch.distributed import TCPStore

        store = TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
            timeout=datetime.timedelta(seconds=_wait_s()),
        )  # fmt: skip
        key = f"{_STORE_KEY}/{current.run_id or ''}"
        if mine is not None:
            store.set(key, str(mine.resolve()))
            return mine
        return Path(store.get(key).decode())
    except (KeyError, ValueError, RuntimeError, OSError):
        return mine


def run_id(folder: Path) -> str:
    """The id written into every rank's trace header (``skalpel_run``)."""
    current = job()
    if current is not None and current.run_id:
        return current.run_id
    return folder.name


def writes_report() -> bool:
    """False on the ranks that only write their trace (all but rank 0; all under ``--nproc``)."""
    current = job()
    return current is None or (current.rank == 0 and not current.trace_only)


def rank_traces(folder: Path, own: list[Path]) -> tuple[list[Path], str | None]:
    """Every rank's trace in ``folder`` (waiting for late ranks), and a warning when some never came."""
    current = job()
    if current is None:
        return own, None
    expected = [folder / runfolder.trace_file_name(rank) for rank in range(current.world_size)]
    deadline = time.monotonic() + _wait_s()
    while not all(path.exists() for path in expected) and time.monotonic() < deadline:
        time.sleep(0.5)
    found = [path for path in expected if path.exists()]
    missing = [str(rank) for rank, path in enumerate(expected) if not path.exists()]
    warning = None
    if missing:
        warning = (
            f"no trace from rank(s) {', '.join(missing)} after {_wait_s():.0f} s (${ENV_WAIT}); "
            f"the report covers ranks with a trace in {folder}"
        )
    return found or own, warning


def _wait_s() -> float:
    return env.number(env.RANK_WAIT_S)


def launch_command(nproc: int, forwarded: list[str], folder: Path) -> list[str]:
    """``python -m torch.distributed.run --standalone --nproc-per-node N -m skalpel run --out DIR ...``."""
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
        "-m", "skalpel", "run", "--out", str(folder), *forwarded,
    ]  # fmt: skip


def launch(nproc: int, forwarded: list[str], folder: Path) -> int:
    """Run the ranks (traces only) and return torchrun's exit status; the caller merges the traces."""
    if nproc < 1:
        raise SkalpelError(f"--nproc must be at least 1 (got {nproc})")
    ranks_env = dict(os.environ, **{ENV_TRACE_ONLY: "1", ENV_RUN_ID: uuid.uuid4().hex, ENV_OUT: str(folder)})
    try:
        process = subprocess.Popen(launch_command(nproc, forwarded, folder), env=ranks_env)
    except OSError as error:
        raise SkalpelError(f"cannot start torch.distributed.run: {error.strerror or error}") from None
    # Never kill torchrun outright (subprocess.call would, on Ctrl-C): its ranks write their traces
    # when it stops them. A terminal's Ctrl-C reaches it directly; SIGTERM and SIGHUP are passed on.
    with signals.passed_on(process):
        return process.wait()


def save_capture(folder: Path | None, rank: int, capture) -> None:
    """A trace-only rank's CaptureInfo (overhead, noise), for the launcher's merged report."""
    if folder is None or job() is None or not job().trace_only:
        return
    import orjson

    try:
        (folder / _capture_file(rank)).write_bytes(orjson.dumps(dataclasses.asdict(capture)))
    except OSError:
        pass  # the report then lacks the overhead figure, nothing worse


def load_capture(folder: Path, rank: int = 0):
    """The CaptureInfo a rank saved (None when it saved none, or a damaged one)."""
    import orjson

    from ..result.checked import ReportFormatError
    from ..result.report import capture_from_dict

    path = folder / _capture_file(rank)
    try:
        return capture_from_dict(orjson.loads(path.read_bytes()))
    except (OSError, orjson.JSONDecodeError, ReportFormatError):
        return None


def _capture_file(rank: int) -> str:
    return f".capture-rank{rank}.skalpel"  # not *.json: the trace loader passes it over
