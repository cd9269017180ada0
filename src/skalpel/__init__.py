"""skalpel: a profiler doctor for PyTorch.

``skalpel.analyze(paths)`` reads stored traces; ``skalpel.profile()`` captures one
(and is the only entry point that imports torch). ``skalpel.step()`` marks the end of
an iteration for ``skalpel run`` (elsewhere it does nothing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["Report", "analyze", "profile", "step", "watch", "__version__"]

if TYPE_CHECKING:
    from .api import analyze
    from .capture.profile import profile
    from .result.report import Report
    from .watching.recorder import watch


def __getattr__(name: str) -> Any:
    # Imported on first use: profile() needs torch, analyze() numpy and the analyses, and
    # `skalpel --help` or `skalpel explain` need neither.
    if name == "profile":
        from .capture.profile import profile

        return profile
    if name == "analyze":
        from .api import analyze

        return analyze
    if name == "Report":
        from .result.report import Report

        return Report
    if name == "watch":  # the context manager; the package is skalpel.watching (no module named watch)
        from .watching.recorder import watch

        return watch
    if name == "step":
        from .capture.steps import mark_step

        return mark_step
    raise AttributeError(f"module 'skalpel' has no attribute {name!r}")
