"""Shared fixtures: the stored real traces in ../shared/traces."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TRACES = REPO.parent / "shared" / "traces"


def corpus(relative: str) -> Path:
    """Path of a stored trace; skips the test when the shared corpus is not beside the checkout."""
    path = TRACES / relative
    if not path.exists():
        pytest.skip(f"shared trace corpus not found: {path}")
    return path
