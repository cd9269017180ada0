"""Some analyses in a forked process while this process runs the others: about half the time on two idle cores.

The child inherits the loaded trace (fork: nothing copied, nothing loaded again), computes, and
sends its results back pickled through a pipe. Objects both processes hold (the Trace, the step
segmentation) go as references to this process's own (pickle persistent ids), never as copies.
The results are small (tables, not columns). Without fork, or when the child dies or its results
do not arrive whole, the work runs here instead: the results are the same either way.
"""

from __future__ import annotations

import io
import os
import pickle
import signal
from typing import Any, Callable


class Forked:
    """``work()`` started in a forked child; ``result()`` waits for it (or runs it here)."""

    def __init__(self, work: Callable[[], Any], shared: tuple[object, ...]) -> None:
        self.work, self.shared = work, shared
        self.pid, self.reader = -1, -1
        if hasattr(os, "fork"):
            self._start()

    def _start(self) -> None:
        reader, writer = os.pipe()
        pid = os.fork()
        if pid:
            os.close(writer)
            self.pid, self.reader = pid, reader
            return
        os.close(reader)
        code = 1
        try:
            signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C ends the child; the parent reaps it
            buffer = io.BytesIO()
            _Pickler(buffer, self.shared).dump(self.work())
            with os.fdopen(writer, "wb") as pipe:
                pipe.write(buffer.getbuffer())
            code = 0
        finally:
            os._exit(code)  # never return into the parent's code, whatever happened

    def result(self) -> Any:
        if self.reader < 0:
            return self.work()
        reader, self.reader = self.reader, -1
        try:
            with os.fdopen(reader, "rb") as pipe:
                blob = pipe.read()
            return _Unpickler(io.BytesIO(blob), self.shared).load()
        except Exception:  # noqa: BLE001 - a cut or empty message: the child died (killed for memory?)
            pass
        finally:
            _end(self.pid)
        return self.work()


    def cancel(self) -> None:
        """Stop the child when its result is no longer wanted (this process failed or was interrupted)."""
        if self.reader >= 0:
            os.close(self.reader)
            self.reader = -1
            _end(self.pid)


def _end(pid: int) -> None:
    """Reap the child; killed first, in case this process was interrupted before the child was done."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


class _Pickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO, shared: tuple[object, ...]) -> None:
        super().__init__(file, pickle.HIGHEST_PROTOCOL)
        self.shared_ids = {id(item): index for index, item in enumerate(shared)}

    def persistent_id(self, obj: object) -> int | None:
        return self.shared_ids.get(id(obj))


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, shared: tuple[object, ...]) -> None:
        super().__init__(file)
        self.shared = shared

    def persistent_load(self, pid: Any) -> object:
        return self.shared[pid]
