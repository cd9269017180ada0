"""Property-based tests of the loader: any input loads into sane columns or raises TraceError, nothing else."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skalpel.errors import TraceError
from skalpel.trace import Kind, load
from skalpel.trace.events import decode_events
from skalpel.trace.fastsplit import guess_layout, next_cut
from skalpel.trace.jsonscan import split_document

FUZZ = settings(max_examples=int(os.environ.get("SKALPEL_FUZZ_EXAMPLES", "120")), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

tricky_text = st.text(alphabet=st.sampled_from('ab{}[]",:\\/ \t\u00e9\u4e2d\U0001f600') | st.characters(exclude_categories=("Cs",)), max_size=12)
number = st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False) | st.integers(-5, 10**6)
scalar = st.none() | st.booleans() | number | tricky_text
value = st.recursive(scalar, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(tricky_text, inner, max_size=3), max_leaves=6)
ARG_KEYS = ["correlation", "External id", "external id", "device", "stream", "Call stack", "Input Dims", "bytes",
            "Bytes", "Total Allocated", "Total Reserved", "Device Type", "Device Id", "cid"]  # fmt: skip
CATEGORIES = ["cpu_op", "Operator", "cuda_runtime", "kernel", "Kernel", "gpu_memcpy", "gpu_memset", "cuda_sync",
              "gpu_user_annotation", "ac2g", "async", "Trace", "python_function", "user_annotation"]  # fmt: skip
args = st.dictionaries(st.sampled_from(ARG_KEYS) | tricky_text, value | number, max_size=5)
event = st.fixed_dictionaries(
    {},
    optional={
        "ph": st.sampled_from(["X", "X", "X", "i", "f", "s", "M"]) | value,
        "cat": st.sampled_from(CATEGORIES) | value,
        "name": st.sampled_from(["aten::mm", "ProfilerStep#3", "[memory]", "ncclKernel_AllReduce", "cudaLaunchKernel"]) | value,
        "ts": st.integers(0, 10**9) | number | value,
        "dur": st.integers(0, 10**6) | number | value,
        "pid": st.integers(0, 5) | st.sampled_from(["Spans", "stream 7", "12"]) | value,
        "tid": st.integers(0, 5) | value,
        "id": st.integers(0, 50) | value,
        "args": args | value,
    },
)
events = st.lists(event | value, max_size=25)
layout = st.sampled_from([None, 1, 2])


def _document(generated: list, indent: int | None, bare: bool) -> bytes:
    body = generated if bare else {"schemaVersion": 1, "traceEvents": generated, "traceName": "a]b}"}
    return json.dumps(body, indent=indent, ensure_ascii=False).encode()


def _is_number(item: object) -> bool:
    return isinstance(item, (int, float)) and not isinstance(item, bool) and math.isfinite(float(item))


def _expected_ranges(generated: list) -> int:
    """How many complete ('X') events a correct loader keeps."""
    return sum(
        1
        for item in generated
        if isinstance(item, dict)
        and item.get("ph") == "X"
        and item.get("cat") != "Trace"
        and isinstance(item.get("name"), str)
        and _is_number(item.get("ts"))
        and _is_number(item.get("dur", 0))
        and item.get("dur", 0) >= 0
    )


def _load_or_trace_error(path: Path):
    try:
        trace = load(path)
    except TraceError as error:
        assert "\n" not in str(error)
        return None
    _check_sane(trace)
    return trace


def _check_sane(trace) -> None:
    count = len(trace)
    assert count > 0
    for column in ("dur", "kind", "name", "rank", "pid", "tid", "device", "stream", "correlation", "stack", "shapes", "nbytes"):
        assert len(getattr(trace, column)) == count
    assert np.all(trace.dur >= 0) and np.all(np.isfinite(trace.ts)) and np.all(np.isfinite(trace.dur))
    assert trace.ts.min() == 0.0
    assert np.all((trace.name >= 0) & (trace.name < len(trace.names)))
    for column in (trace.stack, trace.shapes):
        assert np.all((column >= -1) & (column < len(trace.names)))
    assert set(np.unique(trace.kind).tolist()) <= {int(kind) for kind in Kind}
    assert all(isinstance(name, str) for name in trace.names)
    assert all(0 <= index < count for index in trace.extra)


@FUZZ
@given(generated=events, indent=layout, bare=st.booleans())
def test_generated_documents_load_exactly_their_valid_events(tmp_path: Path, generated, indent, bare) -> None:
    path = tmp_path / "fuzz.json"
    path.write_bytes(_document(generated, indent, bare))
    trace = _load_or_trace_error(path)
    expected = _expected_ranges(generated)
    assert (len(trace) if trace is not None else 0) == expected


@FUZZ
@given(generated=events, indent=layout, cut=st.floats(0, 1))
def test_truncated_documents(tmp_path: Path, generated, indent, cut) -> None:
    document = _document(generated, indent, bare=False)
    path = tmp_path / "cut.json"
    path.write_bytes(document[: int(len(document) * cut)])
    trace = _load_or_trace_error(path)
    if trace is not None:
        assert len(trace) <= _expected_ranges(generated)


@FUZZ
@given(generated=events, indent=layout, edits=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)), min_size=1, max_size=6))
def test_corrupted_bytes(tmp_path: Path, generated, indent, edits) -> None:
    document = bytearray(_document(generated, indent, bare=False))
    for where, byte in edits:
        document[min(int(len(document) * where), len(document) - 1)] = byte
    path = tmp_path / "corrupt.json"
    path.write_bytes(bytes(document))
    _load_or_trace_error(path)


@FUZZ
@given(generated=events, indent=layout, batch=st.integers(1, 400))
def test_scanner_and_guessed_cuts_find_the_events_orjson_finds(generated, indent, batch) -> None:
    document = _document(generated, indent, bare=False)
    expected = orjson.loads(document)["traceEvents"]
    objects = [item for item in expected if isinstance(item, dict)]
    # the exact scanner: one span per event object
    split = split_document(document)
    assert not split.truncated
    assert [orjson.loads(document[start:end]) for start, end in split.event_spans.tolist()] == objects
    # the guessed cuts: a batch that parses ends at a true boundary, so together they hold every event, in order
    guessed = guess_layout(document)
    assert guessed is not None
    found, start = [], guessed.start
    while start < guessed.stop:
        end, start_next = next_cut(document, start, guessed.stop, at_least=batch)
        while True:  # as the loader does: a cut inside a string or an event fails to parse; go further
            try:
                found.extend(orjson.loads(b"[" + document[start:end] + b"]"))
                break
            except orjson.JSONDecodeError:
                assert end < guessed.stop
                end, start_next = next_cut(document, end, guessed.stop, at_least=1)
        start = start_next
    assert found == expected
    decoded, not_events = decode_events(b"[" + document[guessed.start : guessed.stop] + b"]")
    assert len(decoded) + not_events == len(expected)
