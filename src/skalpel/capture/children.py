"""Training in processes the script starts (``multiprocessing``, hogwild): not profiled, but said.

skalpel profiles the process that runs the script. A child forked with
``multiprocessing`` inherits the step hooks: its step boundaries are counted in a file
of a folder the parent made (one file per child: its count and the signal), and the
parent reads them once the script ends. A child started another way (spawn,
forkserver) runs a fresh interpreter without the hooks: the parent knows only that it
started it, and which function it runs. DataLoader workers and torch's own pools are
left out: they serve the parent's steps.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.process
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import signals
from .boundaries import LABELS

_OWN_TARGETS = ("torch.", "concurrent.futures.", "multiprocessing.")  # loader workers, compile and pool workers
# torch.multiprocessing.spawn (and start_processes) runs the user's function in each process through its own
# wrapper: the process is the user's training, named by the function the wrapper is given
_SPAWN_MODULE = "torch.multiprocessing.spawn"


@dataclass(frozen=True)
class Child:
    """A process the script started: what it runs, how, and the steps it took (forked children only)."""

    pid: int
    target: str
    method: str
    steps: int = 0
    signal: str | None = None
    own_session: bool = False  # it opened skalpel.profile() itself: its run folder holds its steps


class Children:
    """Installed around the script in the parent; ``boundary`` is called in a forked child instead of a step."""

    def __init__(self) -> None:
        self.started: dict[int, tuple[str, str]] = {}  # pid -> (target, start method)
        self.children: list[Child] = []  # filled by ``uninstall``
        self._folder: Path | None = None
        self._original_start: Any = None
        self._file: int | None = None
        self._file_pid = 0
        self._count = 0
        self._own_session = False

    def install(self) -> None:
        self._folder = Path(tempfile.mkdtemp(prefix="skalpel-children-"))
        watch = self
        original = multiprocessing.process.BaseProcess.start
        self._original_start = original

        def start(process: Any) -> None:
            # start() deletes them
            target = _target_name(getattr(process, "_target", None), getattr(process, "_args", ()))
            original(process)
            if target is not None and process.pid is not None:
                method = getattr(process, "_start_method", None) or multiprocessing.get_start_method()
                watch.started[process.pid] = (target, method)

        start.__wrapped__ = original  # type: ignore[attr-defined]
        multiprocessing.process.BaseProcess.start = start  # type: ignore[method-assign]

    def uninstall(self) -> None:
        if not signals.is_owner():
            return  # a child the script forked ran back here: the folder is its parent's
        if self._original_start is not None:
            multiprocessing.process.BaseProcess.start = self._original_start  # type: ignore[method-assign]
        self._original_start = None
        if self._folder is None:
            return
        counted = _read_counts(self._folder)
        shutil.rmtree(self._folder, ignore_errors=True)
        self._folder = None
        self.children = [
            Child(pid, target, method, *counted.get(pid, (0, None, False))) for pid, (target, method) in self.started.items()
        ]

    def boundary(self, signal: str) -> None:
        """In a forked child: one more step boundary, written where the parent will read it."""
        if self._opened():
            self._count += 1
            self._write(signal)

    def own_session(self) -> None:
        """In a forked child: it opened skalpel.profile() itself."""
        if self._opened():
            self._own_session = True
            self._write("user")

    def _opened(self) -> bool:
        if self._folder is None:
            return False
        pid = os.getpid()
        if self._file is None or self._file_pid != pid:  # the first in this child (or a grandchild)
            self._file_pid, self._count, self._own_session = pid, 0, False
            try:
                self._file = os.open(self._folder / str(pid), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            except OSError:
                self._folder = None
                return False
        return True

    def _write(self, signal: str) -> None:
        assert self._file is not None
        line = f"{self._count} {signal} {'own' if self._own_session else '-'}\n"
        os.pwrite(self._file, line.encode(), 0)  # the line only grows (the count does): no stale tail

    def note(self, main_signal: str | None) -> str | None:
        """What the report should say about training the main process did not hold; None when there is none."""
        profiled = [child for child in self.children if child.own_session]
        trained = [child for child in self.children if child.steps > 0 and not child.own_session]
        unseen = [child for child in self.children if child.method != "fork"]
        main = f"this report holds the main process only ({main_signal})" if main_signal else (
            "the main process took no step of its own"
        )
        if profiled and not trained:
            return (
                f"{len(profiled)} child process(es) the script started ({_targets(profiled)}) profiled themselves "
                f"with skalpel.profile(): their run folders hold their steps; {main}"
            )
        if not trained and not unseen:
            return None
        how = (
            "to profile it, record it where it runs: `with skalpel.profile(out=f\"skalpel-runs/child{rank}\") as "
            "run:` around the child's loop and `run.step()` once per iteration, or launch the training as "
            "torch.distributed ranks (`skalpel run --nproc N`)"
        )
        if trained:
            steps = sum(child.steps for child in trained)
            signal = LABELS.get(trained[0].signal or "", "steps")
            return (
                f"training ran in {len(trained)} child process(es) the script started ({_targets(trained)}): "
                f"{steps} step(s) by {signal} there, which skalpel did not record; {main}; {how}"
            )
        return (
            f"the script started {len(unseen)} process(es) with the '{unseen[0].method}' method ({_targets(unseen)}), "
            f"which skalpel does not see into: if they train, {main}; {how}"
        )


def _targets(children: list[Child]) -> str:
    return "running " + ", ".join(sorted({child.target for child in children}))


def _target_name(target: Any, args: Any = ()) -> str | None:
    """The function a process runs, or None for torch's and the standard library's own workers."""
    if target is None:
        return "its run()"  # a Process subclass
    module = getattr(target, "__module__", "") or ""
    if module == _SPAWN_MODULE and getattr(target, "__name__", "") == "_wrap" and args:
        target, module = args[0], getattr(args[0], "__module__", "") or ""  # torch.multiprocessing.spawn(fn): fn
    if module.startswith(_OWN_TARGETS):
        return None
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    return f"{name}()" if name else repr(target)


def _read_counts(folder: Path) -> dict[int, tuple[int, str | None, bool]]:
    """pid -> (step boundaries, the signal, whether it opened skalpel.profile() itself)."""
    counts: dict[int, tuple[int, str | None, bool]] = {}
    for path in folder.iterdir():
        try:
            count, signal, own = path.read_text().split()[:3]
            counts[int(path.name)] = (int(count), signal, own == "own")
        except (OSError, ValueError):
            continue
    return counts
