"""The script's own exception as the user sees it: its traceback from the script's frames on, skalpel's left out."""

from __future__ import annotations

import traceback

OWN_FRAMES = ("runpy.py", "<frozen runpy>", "skalpel/capture/runner.py", "skalpel\\capture\\runner.py")


def script_traceback(error: BaseException) -> str:
    """The formatted traceback of ``error``, starting at the first frame that is not runpy's or skalpel's runner."""
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename.endswith(OWN_FRAMES):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(error), error, tb))


def let_go(error: BaseException) -> None:
    """Drop the frames ``error`` (and the errors chained to it) holds, and with them the script's objects: the
    tensors of a script that ran out of memory, which skalpel needs the room of to write and analyse its trace."""
    import gc

    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        error.__traceback__ = None
        error = error.__cause__ or error.__context__
    gc.collect()
