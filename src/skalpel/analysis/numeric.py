"""numpy's median, percentile and unique, with the same results, minus the import of numpy.ma.

On first use ``np.median``, ``np.percentile`` and a plain ``np.unique`` import numpy.ma (for a
masked-array check: 8-15 ms, a tenth of all analyses on a 50 MB trace). These give the values
numpy gives, bit for bit, on the plain float and integer arrays the analyses pass them.
"""

from __future__ import annotations

import math

import numpy as np


def median(values) -> float:
    """``float(np.median(values))``: the middle value, or the mean of the two middle ones."""
    data = np.asarray(values)
    if data.dtype.kind not in "iuf" or data.dtype.itemsize < 8:
        return float(np.median(data))  # float32 and the like average in their own precision: numpy's own way
    data = data.ravel()
    count = len(data)
    if count == 0 or (data.dtype.kind == "f" and np.isnan(data).any()):
        return math.nan
    half = count // 2
    if count % 2:
        return float(np.partition(data, half)[half])
    part = np.partition(data, (half - 1, half))
    return (float(part[half - 1]) + float(part[half])) / 2.0


def percentile(values, q: float) -> float:
    """``float(np.percentile(values, q))`` with numpy's default (linear) interpolation; values not empty."""
    return percentiles(values, (q,))[0]


def percentiles(values, qs) -> list[float]:
    """``np.percentile(values, qs)`` as floats, from one partition of the values; values not empty."""
    data = np.asarray(values, dtype=np.float64).ravel()
    if np.isnan(data).any():
        return [math.nan for _ in qs]
    last = len(data) - 1
    positions = [last * (q / 100) for q in qs]
    below = [min(math.floor(position), last) for position in positions]
    part = np.partition(data, sorted({index for low in below for index in (low, min(low + 1, last))}))
    result = []
    for position, low in zip(positions, below):
        if position >= last:
            result.append(float(part[last]))
            continue
        weight, step = position - low, part[low + 1] - part[low]
        # numpy's _lerp: from the nearer end, so that the weights 0 and 1 give the values themselves
        result.append(float(part[low + 1] - step * (1 - weight)) if weight >= 0.5 else float(part[low] + step * weight))
    return result


def unique(values) -> np.ndarray:
    """``np.unique(values)`` of integers or floats: the distinct values, sorted, in the values' dtype."""
    data = np.asarray(values).ravel()
    if data.dtype.kind not in "iuf" or (data.dtype.kind == "f" and np.isnan(data).any()):
        return np.unique(data)
    if len(data) == 0:
        return data.copy()
    low, high = data.min(), data.max()
    if data.dtype.kind in "iu" and low >= 0 and high <= 4 * len(data) + 4096:  # ids (interned names, event indices): a count per id, no sort
        return np.flatnonzero(np.bincount(data)).astype(data.dtype)
    ordered = np.sort(data)
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))]


def isin(values: np.ndarray, ids) -> np.ndarray:
    """``np.isin(values, ids)`` for integer ids given as a list: typed as integers, an empty list too
    (numpy takes ``[]`` for floats and falls back to its sorting method, through a plain np.unique)."""
    return np.isin(values, np.asarray(ids, dtype=np.int64))


def rounded(values: np.ndarray, digits: int) -> list[float]:
    """``[round(value, digits) for value in values]``, the same doubles, at numpy's speed (a job's memory curves
    are 2,000 points a rank, 1,000 ranks).

    ``round`` gives the double nearest the decimal that rounds the value's exact binary value half to even;
    ``rint(value * 10**digits) / 10**digits`` gives the same double (a quotient of exact integers, correctly
    rounded) unless the product's own rounding moved it onto or across a half. Products within a few ulps of a
    half (a time of 1868036.25 us is 1868.03625 ms) are decided on the product's exact value: the product plus
    its rounding error (Dekker's split), which side of the half, and half to even on the half itself. Values
    too large or not finite go to ``round`` itself."""
    assert 0 <= digits <= 8  # 10**digits splits exactly (Dekker's product below)
    values = np.asarray(values, np.float64)
    scale = 10.0**digits
    scaled = values * scale
    usable = np.isfinite(scaled) & (np.abs(scaled) < 2.0**52)
    plain = np.where(usable, scaled, 0.0)
    whole, below = np.rint(plain), np.floor(plain)
    near = np.flatnonzero(np.abs(plain - below - 0.5) <= 4 * np.spacing(np.abs(plain)))
    if len(near):
        value, product, floor = np.where(usable, values, 0.0)[near], plain[near], below[near]
        split = 134217729.0 * value  # 2**27 + 1: value = high + low, each of 26 bits at most
        high = split - (split - value)
        error = (high * scale - product) + (value - high) * scale  # product + error is value * scale exactly
        side = (product - (floor + 0.5)) + error  # the sign of (exact product - the half): exact enough
        whole[near] = floor + np.where(side > 0, 1.0, np.where(side < 0, 0.0, np.mod(floor, 2.0)))
    out = (np.copysign(whole, plain) / scale).tolist()  # the value's sign on a zero, as round keeps it
    for index in np.flatnonzero(~usable).tolist():
        out[index] = round(float(values[index]), digits)
    return out
