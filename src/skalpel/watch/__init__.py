"""``skalpel watch``: a flight recorder for a whole training run, which profiles the bad moment by itself.

``recorder.py`` (the hooks, the captures, ``skalpel.watch()``), ``probe.py`` (what a step cost),
``store.py`` (the SQLite file, written off the training thread), ``detect.py`` (anomalies
judged online), ``runner.py`` (``skalpel watch SCRIPT``), ``show.py`` (``--show`` and
``skalpel history``), ``timeline_html.py`` (``--show RUN --html FILE``: the run as a page),
``command.py`` (the CLI's options).
"""

from __future__ import annotations

import sys
import types
from typing import Any


class _CallablePackage(types.ModuleType):
    """``skalpel.watch`` is this package once any of it is imported (Python sets the attribute), and the
    context manager ``skalpel.watch()`` as well: calling the package calls ``recorder.watch``."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from .recorder import watch

        return watch(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
