"""Compiled regions in the user's terms: each ``Torch-Compiled Region: N/M`` with the function it compiles.

A region's host time, the device work launched inside it (Inductor's Triton kernels on a
GPU) and the generated graphs it calls (``## Call CompiledFxGraph <hash> ##``) are grouped
back to the region; the compile log of ``skalpel run`` names the user's function and line
for each frame N, so the tables read "forward (model.py:30)" instead of a hash.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..trace import opnames
from ..trace.kinds import Kind
from ..trace.model import Trace, isin_few
from . import numeric
from .compile import CompileLog
from .timeline import device_mask

_HOST = np.array([Kind.CPU_OP, Kind.USER_ANNOTATION], dtype=np.int8)


@dataclass(frozen=True)
class RegionRow:
    """One compiled region of one rank: its calls, host and device time."""

    region: str  # "N/M": frame N, compile id M
    function: str | None  # the compiled function, from the compile log ("forward")
    location: str | None  # "model.py:30 in forward"
    calls: int
    host_ms: float  # total host time inside the region
    device_ms: float  # device work launched from inside the region
    kernels: int  # device kernels launched from inside the region
    triton_kernels: int
    graphs: tuple[str, ...]  # hashes of the generated graphs it runs

    def to_dict(self) -> dict:
        return {
            "region": self.region, "function": self.function, "location": self.location, "calls": self.calls,
            "host_ms": round(self.host_ms, 4), "device_ms": round(self.device_ms, 4), "kernels": self.kernels,
            "triton_kernels": self.triton_kernels, "graphs": list(self.graphs),
        }  # fmt: skip


def compiled_regions(trace: Trace, rank: int, log: CompileLog | None = None) -> tuple[RegionRow, ...]:
    """One row per compiled region that ran on ``rank``, most host time first."""
    on_rank = (trace.rank == rank) & isin_few(trace.kind, _HOST)
    region_names = opnames.compiled_regions(trace, np.flatnonzero(on_rank))
    region_ids = list(region_names)
    if not region_ids:
        return ()
    graph_ids = opnames.compiled_graphs(trace, np.flatnonzero(on_rank))
    regions = np.flatnonzero(on_rank & numeric.isin(trace.name, region_ids))
    graphs = np.flatnonzero(on_rank & numeric.isin(trace.name, list(graph_ids)))
    launches, kernel_us, triton = _launched_kernels(trace, rank)  # sorted by launch time
    cum_us = np.concatenate([[0.0], np.cumsum(kernel_us)])
    cum_triton = np.concatenate([[0], np.cumsum(triton)])
    functions = _functions(log, rank)
    rows = []
    for name_id in region_ids:
        events = regions[trace.name[regions] == name_id]
        inside_graphs: set[str] = set()
        device_us = 0.0
        kernels = triton_count = 0
        for event in events:
            start, end, tid = trace.ts[event], trace.ts[event] + trace.dur[event], trace.tid[event]
            within = graphs[(trace.ts[graphs] >= start) & (trace.ts[graphs] < end) & (trace.tid[graphs] == tid)]
            inside_graphs.update(graph_ids[int(trace.name[g])] for g in within)
            first, last = np.searchsorted(launches, [start, end], side="left")
            device_us += float(cum_us[last] - cum_us[first])
            kernels += int(last - first)
            triton_count += int(cum_triton[last] - cum_triton[first])
        label = region_names[name_id]
        frame = int(label[0])
        function, location = functions.get(frame, (None, None))
        rows.append(RegionRow(
            region=f"{label[0]}/{label[1]}", function=function, location=location, calls=len(events),
            host_ms=float(trace.dur[events].sum()) / 1000.0, device_ms=device_us / 1000.0, kernels=kernels,
            triton_kernels=triton_count, graphs=tuple(sorted(inside_graphs)),
        ))  # fmt: skip
    return tuple(sorted(rows, key=lambda row: -row.host_ms))


def _launched_kernels(trace: Trace, rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Device events on the rank with a known launch call, by launch time: the launch's host time, duration, Triton or not."""
    device = np.flatnonzero((trace.rank == rank) & device_mask(trace))
    launcher = trace.launcher[device]
    device = device[launcher >= 0]
    launcher = launcher[launcher >= 0]
    triton_names = opnames.names_where(trace, opnames.is_triton_kernel, device)
    triton = numeric.isin(trace.name[device], triton_names)
    order = np.argsort(trace.ts[launcher], kind="stable")
    return trace.ts[launcher][order], trace.dur[device][order], triton[order].astype(np.int64)


def _functions(log: CompileLog | None, rank: int) -> dict[int, tuple[str, str]]:
    """Frame N -> (function, location) from the compile log's forward compilations."""
    found: dict[int, tuple[str, str]] = {}
    for item in log.compilations if log is not None else ():
        if item.rank == rank and not item.backward and "/" in item.compile_id and item.compile_id.split("/")[0].isdigit():
            found.setdefault(int(item.compile_id.split("/")[0]), (item.frame, item.location))
    return found
