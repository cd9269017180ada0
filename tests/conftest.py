"""Shared fixtures: the stored real traces in ../shared/traces, and what CI must not skip.

Locally a test whose prerequisite is missing (the shared corpus, Chromium, DESIGN.md)
is skipped with its reason (pytest prints reasons: ``-rs`` in pyproject.toml). Under CI
(``SKALPEL_CI=1``, set by ``.ci/run``) the same test fails instead: a green CI means
that everything ran.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
TRACES = SHARED / "traces"
DESIGN = SHARED / "DESIGN.md"
STRICT = os.environ.get("SKALPEL_CI") == "1"
"""Under CI a missing prerequisite fails the test instead of skipping it."""


def missing(reason: str) -> None:
    """Skip the test for a missing prerequisite, or fail it under CI."""
    if STRICT:
        pytest.fail(f"{reason} (CI runs every test: SKALPEL_CI=1)", pytrace=False)
    pytest.skip(reason)


def corpus(relative: str) -> Path:
    """Path of a stored trace; skips the test when the shared corpus is not beside the checkout (fails under CI)."""
    path = TRACES / relative
    if not path.exists():
        missing(f"shared trace corpus not found: {path}")
    return path


def uncompressed_copy(tmp_path: Path, name: str, keep: float = 1.0) -> Path:
    """The corpus trace ``name`` gunzipped into ``tmp_path`` (its first ``keep`` share only: a cut-off file)."""
    import gzip

    data = gzip.decompress(corpus(name).read_bytes())
    target = tmp_path / corpus(name).name.removesuffix(".gz")
    target.write_bytes(data[: int(len(data) * keep)])
    return target
