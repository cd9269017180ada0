"""A forked child that computes one thing and sends it back pickled through a pipe.

Fork, not spawn: the child inherits what this process has loaded (modules, a mapped trace
file, the trace's columns) for free. It leaves with ``os._exit``, so nothing of the parent
(atexit handlers, buffered output) runs twice. Objects both processes hold can go as
references to the parent's own (``shared``: pickle persistent ids) instead of copies. What to
do when the child dies (the OOM killer) is the caller's: ``result`` then says None.
"""

from __future__ import annotations

import io
import os
import pickle
import signal
from typing import Any, Callable


class Child:
    """``work()`` running in a forked process; ``result()`` waits for what it returns."""

    def __init__(self, work: Callable[[], Any], shared: tuple[object, ...] = ()) -> None:
        self.shared = shared
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
            pickler = _Pickler(buffer, shared) if shared else pickle.Pickler(buffer, pickle.HIGHEST_PROTOCOL)
            pickler.dump(work())
            with os.fdopen(writer, "wb") as pipe:
                pipe.write(buffer.getbuffer())
            code = 0
        finally:
            os._exit(code)  # never return into the parent's code, whatever happened

    def result(self) -> Any | None:
        """What ``work()`` returned, or None when the child died before sending all of it; the child is reaped."""
        reader, self.reader = self.reader, -1
        try:
            with os.fdopen(reader, "rb") as pipe:
                blob = pipe.read()
            return _Unpickler(io.BytesIO(blob), self.shared).load() if self.shared else pickle.loads(blob)
        except Exception:  # noqa: BLE001 - a cut or empty message: the child died
            return None
        finally:
            self._reap()

    def end(self) -> None:
        """Stop and reap the child when its result is not wanted (or was read: then only reap)."""
        if self.reader >= 0:
            os.close(self.reader)
            self.reader = -1
            self._reap()

    def _reap(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)  # a no-op on a child that has exited
        except ProcessLookupError:
            pass
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


class _Pickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO, shared: tuple[object, ...]) -> None:
        super().__init__(file, pickle.HIGHEST_PROTOCOL)
        self.shared_ids = {id(item): index for index, item in enumerate(shared)}

    def persistent_id(self, obj: object) -> int | None:  # called for every object: only when there are shared ones
        return self.shared_ids.get(id(obj))


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, shared: tuple[object, ...]) -> None:
        super().__init__(file)
        self.shared = shared

    def persistent_load(self, pid: Any) -> object:
        return self.shared[pid]
