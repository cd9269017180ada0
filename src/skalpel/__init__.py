"""skalpel: a profiler doctor for PyTorch.

``skalpel.analyze(paths)`` reads stored traces; ``skalpel.profile()`` captures one
(and is the only entry point that imports torch).
"""

from __future__ import annotations

from typing import Any

from .api import analyze
from .report.model import Report

__version__ = "0.1.0"
__all__ = ["Report", "analyze", "profile", "__version__"]


def __getattr__(name: str) -> Any:
    # profile() needs torch; importing it lazily keeps `skalpel analyze` fast and torch-free.
    if name == "profile":
        from .capture.session import profile

        return profile
    raise AttributeError(f"module 'skalpel' has no attribute {name!r}")
