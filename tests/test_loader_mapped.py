"""Large uncompressed traces are mapped, not read, and the parsed pages given back: same result as reading."""

from __future__ import annotations

import mmap
from pathlib import Path

import pytest

from skalpel.job.report_of import report_of
from skalpel.trace import load, source

from .conftest import uncompressed_copy


@pytest.fixture
def mapped_always(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(source, "MAP_FROM_BYTES", 1)


def test_mapped_file_gives_the_report_of_the_read_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = uncompressed_copy(tmp_path, "hta/trace_filter/sampled_rank-0.json.gz")
    read = report_of(plain).report.to_json()
    monkeypatch.setattr(source, "MAP_FROM_BYTES", 1)
    data, _ = source.read_source(plain)
    assert isinstance(data, mmap.mmap)
    data.close()
    assert report_of(plain).report.to_json() == read


def test_mapped_cut_off_file_loads_as_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = uncompressed_copy(tmp_path, "hta/trace_filter/sampled_rank-0.json.gz", keep=0.6)
    read = load(plain)
    monkeypatch.setattr(source, "MAP_FROM_BYTES", 1)
    mapped = load(plain)
    assert len(mapped) == len(read) > 0
    assert mapped.warnings == read.warnings and any("cut off" in w for w in mapped.warnings)


def test_empty_file_is_still_one_error(tmp_path: Path, mapped_always) -> None:
    from skalpel.errors import TraceError

    empty = tmp_path / "empty.json"
    empty.write_bytes(b"")
    with pytest.raises(TraceError, match="empty"):
        load(empty)
