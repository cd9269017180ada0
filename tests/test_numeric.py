"""analysis.numeric gives numpy's own values, bit for bit, and the analyses never import numpy.ma."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np

from skalpel.analysis import numeric
from skalpel.trace.model import isin_few

from .conftest import corpus


def _samples():
    rng = np.random.default_rng(3)
    for trial in range(2000):
        count = int(rng.integers(1, 50))
        yield (
            rng.random(count) * 1000,  # durations
            np.round(rng.random(count) * 10, 1),  # many ties
            rng.integers(-50, 50, count),  # int64, negative too
            rng.integers(0, 6, count).astype(np.int32),  # interned name ids
            rng.integers(10**12, 10**12 + 5, count),  # thread ids: large, few
        )[trial % 5]


def test_median_and_percentile_equal_numpys():
    for values in _samples():
        expected = float(np.median(values))
        assert numeric.median(values) == expected and numeric.median(list(values)) == expected
        qs = (50, 90, 99, 0, 100, 33.3)
        from_numpy = [float(value) for value in np.percentile(values, qs)]
        assert numeric.percentiles(values, qs) == from_numpy
        assert [numeric.percentile(values, q) for q in qs] == [float(np.percentile(values, q)) for q in qs]
    assert np.isnan(numeric.median([1.0, np.nan])) and np.isnan(numeric.percentile([np.nan, 2.0], 50))
    assert numeric.median(np.array([1.5, 2.5], dtype=np.float32)) == float(np.median(np.float32([1.5, 2.5])))


def test_unique_and_isin_equal_numpys():
    for values in _samples():
        found, expected = numeric.unique(values), np.unique(values)
        assert found.dtype == expected.dtype and np.array_equal(found, expected)
        ids = [int(v) for v in values[::3]]
        np.testing.assert_array_equal(numeric.isin(values, ids), np.isin(values, ids))
    assert numeric.unique(np.array([], dtype=np.int32)).dtype == np.int32
    kinds = np.random.default_rng(4).integers(0, 16, 500).astype(np.int8)  # a kind column
    for members in ([], [3], [1, 2, 9], np.array([0, 5, 7, 15], dtype=np.int8)):
        np.testing.assert_array_equal(isin_few(kinds, members), np.isin(kinds, members))
    assert not numeric.isin(np.arange(4), []).any()


_PROBE = """
import sys
from skalpel.job.report_of import report_of
from skalpel.trace import load
report = report_of([sys.argv[1]]).report  # the analyses, the findings (user-code locations too), the report
print(int(bool(report.ranks[0].top_ops)), int("numpy.ma" in sys.modules))
"""


def test_analyses_leave_numpy_ma_unimported():
    """np.median, np.percentile and a plain np.unique import numpy.ma on first use (8-15 ms of a 50 MB trace's
    analyses): the analyses use analysis.numeric instead, and so do the findings and the report."""
    trace = corpus("kineto/tb_plugin/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz")
    done = subprocess.run([sys.executable, "-c", _PROBE, str(trace)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "0"], json.dumps(done.stdout)


def test_rounded_gives_the_doubles_round_gives() -> None:
    rng = np.random.default_rng(7)
    values = np.concatenate([
        rng.uniform(-1e7, 1e7, 20_000), rng.uniform(-1, 1, 20_000),
        (rng.integers(-10**9, 10**9, 20_000) + 0.5) / 1e4,  # halves: ties, and doubles a hair either side of them
        (rng.integers(0, 10**10, 20_000) + 0.25) / 1e3,  # times of x.25 us in ms: a half at the 4th digit
        np.nextafter((rng.integers(-10**9, 10**9, 20_000) + 0.5) / 1e4, np.inf),
        np.nextafter((rng.integers(-10**9, 10**9, 20_000) + 0.5) / 1e4, -np.inf),
        np.array([0.0, -0.0, -0.00001, 0.00005, 0.00015, 1.00005, 123456.78905, 2.0**60, np.inf, -np.inf]),
    ])  # fmt: skip
    for digits in (0, 2, 4):
        got, want = numeric.rounded(values, digits), [round(float(value), digits) for value in values]
        assert [(value, math.copysign(1, value)) for value in got] == [(value, math.copysign(1, value)) for value in want]
