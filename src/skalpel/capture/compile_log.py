"""torch.compile events while a script runs: every compilation with its cause, every graph break.

Nobody has to set ``TORCH_LOGS``. Which of dynamo's hooks this reads (tested on torch 2.13;
the versions are when each appeared, from torch's history):

* ``torch._dynamo.callback`` start/end callbacks (torch 2.5; with a ``CallbackArgs`` carrying
  the compile id since 2.8, before that with no argument): when a compilation (or a lazy
  backward compilation) starts and ends. At the start, the user's line that called the
  compiled code and the profiler step are noted;
* ``torch._dynamo.utils.get_compilation_metrics()`` (a ``CompilationMetrics`` per compilation;
  fields come and go between versions and are read by name): the frame, its file and line,
  the duration, the guard that failed (``recompile_reason``), the graph-break reasons
  (``restart_reasons``), and a failure such as the recompile limit being reached;
* the ``graph_breaks`` log artifact (torch 2.1: a logger ``*.__graph_breaks`` per module):
  "Graph break in user code at FILE:LINE / Graph Break Reason: ...". A handler of ours is
  attached and the artifact enabled without propagation, so nothing is printed the user did
  not ask for (with TORCH_LOGS=graph_breaks the user's own output is left as it was);
* the ``torch._dynamo.convert_frame`` warning "hit config.recompile_limit" (``cache_size_limit``
  before torch 2.6): the function now runs eagerly.

Each hook is looked up and skipped where the running torch lacks it; ``sources`` says which
worked. The events go into the trace header under ``skalpel_compile`` (see ``header``), so
``skalpel analyze`` reads them back without torch (``analysis/compile.py``).

The same callbacks keep the capture cheap: Python stacks through dynamo and Inductor are
millions of frames (minutes and gigabytes when recorded), so a window whose script has
compiled before it starts records without stacks (``before_step``).
"""

from __future__ import annotations

import logging
import re
import sys
import time
from typing import Any

import torch
from torch.profiler import ProfilerAction

HEADER_KEY = "skalpel_compile"
FORMAT = "skalpel.compile/1"
_MAX_EVENTS = 500  # per kind: a script recompiling without end must not grow the trace header without end
_MAX_TEXT = 600  # characters kept of a guard or graph-break reason
_GRAPH_BREAK = re.compile(r"in user code at (?P<file>.+?):(?P<line>\d+)\s*\nGraph Break Reason: (?P<reason>.*)", re.S)
_LIMIT = re.compile(r"hit config\.(\w+) \((\d+)\)")

_active: CompileLog | None = None


class CompileLog:
    """Collects compile events between ``install()`` and ``uninstall()``."""

    def __init__(self) -> None:
        self.compilations: list[dict[str, Any]] = []
        self.graph_breaks: list[dict[str, Any]] = []
        self.limits: list[dict[str, Any]] = []
        self.sources: list[str] = []
        self.stacks_off = False
        self.prof: Any = None  # the profiler whose step number each event records
        self._seen_metrics: set[int] = set()
        self._starts: dict[str, tuple[str, int | None]] = {}  # compile id -> (user line that called it, profiler step)
        self._handler = _Handler(self)
        self._loggers: list[tuple[logging.Logger, int, bool]] = []
        self._callbacks: list[tuple[Any, Any]] = []
        self._hooked = False
        self._unwrap: Any = lambda: None  # puts torch.compile back when install() wrapped it

    # -- installing the hooks ------------------------------------------------------------------
    def install(self) -> None:
        """Hook dynamo now if it is loaded; else when the script calls torch.compile (importing dynamo
        costs seconds, which a script that never compiles should not pay)."""
        if "torch._dynamo" in sys.modules:
            self._hook(earlier_metrics=True)
            return
        original = torch.compile
        self._unwrap = lambda: setattr(torch, "compile", original)

        def compile(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)  # imports dynamo
            self.hook_if_loaded()
            return result

        compile.__wrapped__ = original  # type: ignore[attr-defined]
        torch.compile = compile

    def hook_if_loaded(self) -> None:
        """Hook dynamo once it is loaded (``torch._dynamo.optimize`` and friends import it without torch.compile)."""
        if not self._hooked and "torch._dynamo" in sys.modules:
            self._hook(earlier_metrics=False)

    def _hook(self, *, earlier_metrics: bool) -> None:
        self._hooked = True
        self._unwrap()
        callback = _module("torch._dynamo.callback")
        handler = getattr(callback, "callback_handler", None)
        if handler is not None and hasattr(handler, "register_start_callback"):
            handler.register_start_callback(self._on_start)
            handler.register_end_callback(self._on_end)
            self._callbacks = [(handler.remove_start_callback, self._on_start), (handler.remove_end_callback, self._on_end)]
            self.sources.append("torch._dynamo.callback")
        utils = _module("torch._dynamo.utils")
        if utils is not None and hasattr(utils, "get_compilation_metrics"):
            if earlier_metrics:  # compiled before we came: not this run's
                self._seen_metrics = {id(item) for item in utils.get_compilation_metrics()}
            self.sources.append("torch._dynamo.utils.get_compilation_metrics")
        if self._attach_artifact("graph_breaks"):
            self.sources.append("graph_breaks log artifact")
        dynamo_log = logging.getLogger("torch._dynamo.convert_frame")
        dynamo_log.addHandler(self._handler)
        self._loggers.append((dynamo_log, dynamo_log.level, dynamo_log.propagate))

    def uninstall(self) -> None:
        self.collect()
        self._unwrap()
        for remove, function in self._callbacks:
            try:
                remove(function)
            except ValueError:
                pass
        self._callbacks = []
        for logger, level, propagate in self._loggers:
            logger.removeHandler(self._handler)
            logger.setLevel(level)
            logger.propagate = propagate
        self._loggers = []

    def _attach_artifact(self, artifact: str) -> bool:
        """Our handler on every ``*.__<artifact>`` logger dynamo made; enabled quietly unless the user enabled it."""
        names = [name for name in list(logging.root.manager.loggerDict) if name.endswith(f".__{artifact}")]
        for name in names:
            logger = logging.getLogger(name)
            self._loggers.append((logger, logger.level, logger.propagate))
            if not logger.isEnabledFor(logging.DEBUG):  # not asked for by TORCH_LOGS: ours only, not printed
                logger.setLevel(logging.DEBUG)
                logger.propagate = False
            logger.addHandler(self._handler)
        return bool(names)

    # -- the hooks -----------------------------------------------------------------------------
    def _on_start(self, *args: Any) -> None:
        compile_id = str(getattr(args[0], "compile_id", "")) if args else _current_compile_id()
        if compile_id and compile_id not in self._starts:  # a lazy backward compilation keeps its forward's id
            self._starts[compile_id] = (_user_call_site(), self._step())

    def _on_end(self, *args: Any) -> None:
        self.collect()

    def on_log(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if ".__graph_breaks" in record.name:
            found = _GRAPH_BREAK.search(message)
            if found and len(self.graph_breaks) < _MAX_EVENTS:
                self.graph_breaks.append({
                    "file": found["file"], "line": int(found["line"]),
                    "reason": _break_reason(found["reason"]), "step": self._step(), "wall_us": _now_us(),
                })  # fmt: skip
        elif "hit config." in message:
            found = _LIMIT.search(message)
            function = message.split("function:", 1)[1].splitlines()[0].strip() if "function:" in message else ""
            reason = message.split("last reason:", 1)[1].splitlines()[0].strip() if "last reason:" in message else ""
            if len(self.limits) < _MAX_EVENTS:
                self.limits.append({
                    "limit": found[1] if found else "recompile_limit", "value": int(found[2]) if found else None,
                    "function": function, "last_reason": reason[:_MAX_TEXT], "step": self._step(), "wall_us": _now_us(),
                })  # fmt: skip

    def collect(self) -> None:
        """Take in the compilation metrics dynamo recorded since the last call."""
        self.hook_if_loaded()
        utils = sys.modules.get("torch._dynamo.utils") if self._hooked else None
        if utils is None or not hasattr(utils, "get_compilation_metrics"):
            return
        for metrics in utils.get_compilation_metrics():
            if id(metrics) in self._seen_metrics:
                continue
            self._seen_metrics.add(id(metrics))
            if len(self.compilations) < _MAX_EVENTS:
                self.compilations.append(self._compilation(metrics))

    def _compilation(self, metrics: Any) -> dict[str, Any]:
        value = lambda name: getattr(metrics, name, None)  # noqa: E731 - fields come and go between versions
        compile_id = str(value("compile_id") or "")
        duration_us = value("duration_us")
        if duration_us is None and value("entire_frame_compile_time_s") is not None:
            duration_us = value("entire_frame_compile_time_s") * 1e6
        restarts = value("restart_reasons") or ()
        call_site, step = self._starts.get(compile_id, (None, self._step()))
        return {
            "compile_id": compile_id,
            "frame": value("co_name"),
            "file": value("co_filename"),
            "line": value("co_firstlineno"),
            "backward": value("is_forward") is False,
            "start_us": value("start_time_us"),
            "duration_ms": round(duration_us / 1000.0, 3) if duration_us is not None else None,
            "recompile_reason": _clip(value("recompile_reason")),
            "graph_breaks": value("num_graph_breaks"),
            "break_reasons": sorted({_break_reason(str(reason)) for reason in restarts})[:10],
            "break_hints": sorted({hint for reason in restarts for hint in _hints(str(reason))})[:10],
            "fail_type": value("fail_type"),
            "fail_reason": _clip(_first_paragraph(value("fail_reason") or "")) or None,
            "call_site": call_site,
            "library": str(value("co_filename") or "").startswith(_LIBRARY_DIRS),  # torch's wrapper of a compiled module
            "step": step,
        }

    def _step(self) -> int | None:
        """The profiler step the script is in (N of ProfilerStep#N), None before profiling started."""
        prof = self.prof
        return int(prof.step_num) if prof is not None and hasattr(prof, "step_num") else None

    # -- the trace header ----------------------------------------------------------------------
    @property
    def compiled(self) -> bool:
        self.collect()
        return bool(self.compilations) or bool(self._starts)

    def header(self) -> dict[str, Any]:
        self.collect()
        return {
            "format": FORMAT,
            "torch": torch.__version__,
            "sources": self.sources,
            "stacks_off": self.stacks_off,
            "compilations": self.compilations,
            "graph_breaks": self.graph_breaks,
            "limits": self.limits,
        }


class _Handler(logging.Handler):
    def __init__(self, log: CompileLog) -> None:
        super().__init__(logging.DEBUG)
        self.log = log

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.log.on_log(record)
        except Exception:  # noqa: BLE001 - a log line we cannot read must never break the user's compile
            pass


# -- what the session calls ----------------------------------------------------------------------
def install() -> bool:
    """Start collecting; False when a log is already running (``skalpel run`` installs it first)."""
    global _active
    if _active is not None:
        return False
    _active = CompileLog()
    _active.install()
    return True


def uninstall() -> None:
    global _active
    if _active is not None:
        _active.uninstall()
        _active = None


def compilations() -> list[dict[str, Any]]:
    """Every compilation logged so far (its start in epoch microseconds, its duration), for the run's ledger."""
    if _active is None:
        return []
    _active.collect()
    return list(_active.compilations)


def before_step(prof: Any, *, starting: bool = False) -> None:
    """Called before ``prof.step()`` at a change of phase (and before ``prof.start()``).

    When this step ends a window, the events go into the trace header while the profiler still
    records. Before a window, Python stacks are dropped when the script has compiled:
    torch.profiler builds its recorder at warm-up, so ``with_stack`` set here holds for the window.
    """
    log = _active
    if log is None:
        return
    log.prof = prof
    action = getattr(prof, "current_action", None)
    if action == ProfilerAction.RECORD_AND_SAVE:
        _add_header(log, prof)
    elif (starting or action == ProfilerAction.NONE) and getattr(prof, "with_stack", False) and log.compiled:
        prof.with_stack = False
        log.stacks_off = True


def before_stop(prof: Any) -> None:
    """Called just before ``prof.stop()``: a window cut short is saved by the stop, with the events."""
    log = _active
    if log is not None and getattr(prof, "current_action", None) in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE):
        _add_header(log, prof)


def _add_header(log: CompileLog, prof: Any) -> None:
    if not (log.compilations or log.graph_breaks or log.limits or log.compiled):
        return  # no torch.compile in this script: the header stays as torch writes it
    import json

    text = json.dumps(_plain(log.header()))
    if "\\" in text:
        return  # never: Kineto writes header values verbatim but turns backslashes into slashes
    try:
        prof.add_metadata_json(HEADER_KEY, text)
    except (RuntimeError, AttributeError):
        pass  # a profiler that takes no metadata: the report then lacks the causes, nothing worse


def _plain(value: Any) -> Any:
    """JSON values without anything JSON would escape: Kineto copies the text into the trace verbatim,
    except that it replaces every backslash with a slash, which would break the trace file."""
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if value is None or isinstance(value, (bool, int, float)):
        return value
    text = str(value).replace("\n", " | ").replace('"', "'").replace("\\", "/")
    return "".join(char if " " <= char <= "~" else "?" for char in text)


# -- helpers -------------------------------------------------------------------------------------
def _module(name: str) -> Any:
    """A dynamo module (imported: only called once dynamo is loaded), None on a torch without it."""
    return sys.modules.get(name) or _import(name)


def _import(name: str) -> Any:
    try:
        import importlib

        return importlib.import_module(name)
    except Exception:  # noqa: BLE001 - an older torch without this hook
        return None


def _current_compile_id() -> str:
    """The compile id dynamo is working on, for callbacks that are not told it (torch before 2.8)."""
    guards = _module("torch._guards")
    context = getattr(guards, "CompileContext", None)
    try:
        return str(context.current_compile_id() or "") if context is not None else ""
    except Exception:  # noqa: BLE001 - no compile context at this point
        return ""


def _user_call_site() -> str:
    """The innermost frame outside torch, skalpel and the standard library: the user's line that called the compiled code."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(_LIBRARY_DIRS) and not filename.startswith("<"):
            return f"{filename}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back
    return ""


def _library_dirs() -> tuple[str, ...]:
    import os
    import sysconfig

    package = os.path.dirname(os.path.dirname(__file__))  # skalpel's own folder, above capture/
    dirs = [os.path.dirname(torch.__file__), package, sysconfig.get_paths()["stdlib"]]
    return tuple(os.path.join(path, "") for path in dirs)


_LIBRARY_DIRS = _library_dirs()


def _break_reason(text: str) -> str:
    """The line that says why: dynamo's reason opens with a generic "Encountered graph break when ..." line."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    useful = [line for line in lines if not line.startswith("Encountered graph break")]
    return _clip((useful or lines or [""])[0]) or ""


def _hints(text: str) -> list[str]:
    return [_clip(line.strip()[len("Hint:"):].strip()) or "" for line in text.splitlines() if line.strip().startswith("Hint:")]


def _first_paragraph(text: str) -> str:
    return _clip(text.strip().split("\n\n", 1)[0].strip()) or ""


def _clip(text: str | None) -> str | None:
    if text is None:
        return None
    return text if len(text) <= _MAX_TEXT else text[: _MAX_TEXT - 3] + "..."


def _now_us() -> int:
    return time.time_ns() // 1000
