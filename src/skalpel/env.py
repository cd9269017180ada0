"""Every ``SKALPEL_*`` environment variable skalpel reads: its name, default and meaning, once.

Modules read them through the accessors below, never through ``os.environ`` with a name of
their own; docs/environment.md shows this table to users (tests/test_env.py keeps the two equal).
The variables of skalpel's own test suite and example scripts are not here: the package never
reads them (docs/environment.md lists them in a section of their own).

Standard library only: the CLI imports this before anything else.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Variable:
    """One environment variable. ``default`` is the number used when it is unset, empty or not a
    number; None where there is no fixed value, and ``default_text`` says in words what happens."""

    name: str
    default: float | None
    doc: str  # one line, shown in docs/environment.md
    default_text: str = ""

    def shown_default(self) -> str:
        """The default as docs/environment.md writes it."""
        if self.default_text:
            return self.default_text
        return "unset" if self.default is None else f"{self.default:g}"


TRACEBACK = Variable(
    "SKALPEL_TRACEBACK", None, "Any value: an internal error shows its Python traceback instead of one line.",
)  # fmt: skip
LOAD_PROCESSES = Variable(
    "SKALPEL_LOAD_PROCESSES", None,
    "Processes that decode one large trace file (1: the process alone); `--workers` wins over it.",
    default_text="the usable cores that are idle",
)  # fmt: skip
STACKS_BUDGET_MB = Variable(
    "SKALPEL_STACKS_BUDGET_MB", 64.0,
    "Past this much profiler output (MiB), Python stacks are kept for the first recorded steps only.",
)  # fmt: skip
RECORD_BUDGET_MB = Variable(
    "SKALPEL_RECORD_BUDGET_MB", None,
    "Memory (MiB) the profiler's recording may hold (malloc's bytes in use above the warm-up's) before it stops "
    "early, at the end of the step under way (inside it past 1.5 times this), keeping the whole steps recorded.",
    default_text="1/40 of the memory available when recording begins, at least 64",
)  # fmt: skip
OUT = Variable(
    "SKALPEL_OUT", None, "The run folder of `skalpel run` when `--out` is not given; every rank of a job writes there.",
    default_text="a new folder per run",
)  # fmt: skip
RANK_WAIT_S = Variable(
    "SKALPEL_RANK_WAIT_S", 120.0, "Seconds rank 0 waits for the other ranks' traces before it reports without them.",
)  # fmt: skip
RUN_ID = Variable(
    "SKALPEL_RUN_ID", None, "The id every rank of a job writes in its trace header; `skalpel run --nproc` sets it.",
    default_text="torchrun's run id, else the run folder's name",
)  # fmt: skip
TRACE_ONLY = Variable(
    "SKALPEL_TRACE_ONLY", None,
    "1: this rank writes its trace only and leaves the report to the launcher; `skalpel run --nproc` sets it.",
)  # fmt: skip

VARIABLES: tuple[Variable, ...] = (
    TRACEBACK, LOAD_PROCESSES, STACKS_BUDGET_MB, RECORD_BUDGET_MB, OUT, RANK_WAIT_S, RUN_ID, TRACE_ONLY,
)  # fmt: skip
"""Every variable, in the order docs/environment.md lists them."""


def text(variable: Variable) -> str | None:
    """The value; None when the variable is unset or empty."""
    return os.environ.get(variable.name) or None


def number(variable: Variable) -> float | None:
    """The value as a number; the default when it is unset, empty or not a number."""
    try:
        return float(os.environ[variable.name])
    except (KeyError, ValueError):
        return variable.default


def count(variable: Variable) -> int | None:
    """The value as a whole number (digits, spaces around them allowed); the default otherwise."""
    value = os.environ.get(variable.name, "").strip()
    if value.isdigit():
        return int(value)
    return None if variable.default is None else int(variable.default)
