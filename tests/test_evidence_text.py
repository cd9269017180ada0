"""A finding's evidence keys read as words with their units (report/evidence.py)."""

from __future__ import annotations

import pytest

from skalpel.report.evidence import evidence_text


@pytest.mark.parametrize(("key", "value", "text"), [
    ("gb_per_s", 8.34, "8.34 GB/s"),  # printed "gb per 8.34 s" before
    ("ms_per_step", 59.3, "59.3 ms/step"),
    ("wait_ms_per_step", 12.5, "wait 12.5 ms/step"),
    ("growth_mib_per_step", 1.25, "growth 1.25 MiB/step"),
    ("min_bytes_per_step", 100000, "min 100,000 bytes/step"),
    ("launch_us_per_call", 4.5, "launch 4.5 µs/call"),
    ("syncs_per_step", 2.17, "syncs per step 2.17"),  # a count per step has no unit to carry
    ("gbps_per_step", 2.0, "gbps per step 2"),  # a rate per step is no unit anyone reads: words
    ("share_pct", 33.4, "share 33.4%"),
    ("tiny_us", 5.0, "tiny 5 µs"),
    ("wall_s", 3.2, "wall 3.2 s"),
    ("peak_mib", 2662.3, "peak 2,662 MiB"),
    ("alloc_gb", 1.5, "alloc 1.5 GB"),
    ("buffer_mb", 35.0, "buffer 35 MB"),
    ("transfer_busbw_gbps", 80.0, "transfer busbw 80 GB/s"),
    ("achieved_tflops", 407.5, "achieved 408 TFLOP/s"),
    ("steps", 6, "steps 6"),
    ("ms", 3.0, "ms 3"),  # a unit alone is the key's only word
    ("share_pct_by_rank", {0: 32.2, 1: 30.0}, "share by rank (0 32.2%, 1 30%)"),
    ("wait_ms_per_step_by_rank", {0: 1.5}, "wait by rank (0 1.5 ms/step)"),
    ("calls_by_type", {"all_reduce": 2}, "calls by type (all reduce 2)"),
    ("tiny_ops_by_source_pct", {"optimizer": 40.0}, "tiny ops by source (optimizer 40%)"),
])  # fmt: skip
def test_each_key_reads_with_its_unit(key: str, value: object, text: str) -> None:
    assert evidence_text({key: value}) == text


def test_a_mapping_under_a_rate_gives_its_unit_to_every_number() -> None:
    text = evidence_text({"blame_ms_per_step": {"data_loading": 58.7, "sync": 0.07}, "pageable_htod_count": 12})
    assert text == "blame (data loading 58.7 ms/step, sync 0.07 ms/step), pageable htod count 12"
