"""Join the columns of several loaded files into one ``Trace``, with one shared table of names.

Times are put on a grid of 2^-16 us (15 ps, far finer than torch.profiler's ns) before anything adds them:
sums and differences of times on it are exact below 2^37 us (38 hours), so a time or a duration computed
from a rank's own origin (a job reduced rank by rank) is the double computed from the job's origin (the
whole trace), and the two reports agree to the last digit. Off the grid, ``ts + dur`` rounded by the
magnitude of ``ts``: a 4-decimal figure of the two then differed at a rounding boundary (5 of 19 copies of a
real 2-rank trace with shifted clocks).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .model import MemoryEvents, RankInfo, Trace


@dataclass
class FileColumns:
    """One loaded file's columns, before files are joined."""

    path: Path
    info: RankInfo
    names: list[str]
    columns: dict[str, np.ndarray]
    memory: dict[str, np.ndarray]
    extra: dict[int, dict]
    warnings: list[str]


def _intern(text: str, names: list[str], ids: dict[str, int]) -> int:
    index = ids.get(text)
    if index is None:
        index = ids[text] = len(names)
        names.append(text)
    return index


def assemble(parsed: list[FileColumns]) -> Trace:
    """Concatenate per-file columns, remapping each file's name ids into one shared table."""
    names: list[str] = []
    ids: dict[str, int] = {}
    pieces: dict[str, list[np.ndarray]] = {key: [] for key in parsed[0].columns}
    memory_pieces: dict[str, list[np.ndarray]] = {key: [] for key in parsed[0].memory}
    memory_ranks: list[np.ndarray] = []
    ranks: list[np.ndarray] = []
    extra: dict[int, dict] = {}
    warnings: list[str] = []
    offset = 0
    for item in parsed:
        remap = np.array([_intern(text, names, ids) for text in item.names], dtype=np.int32)
        unchanged = bool((remap == np.arange(len(remap))).all())  # the first file's ids stay as they are
        for key, column in item.columns.items():
            if key in ("name", "stack", "shapes") and len(remap) and not unchanged:
                column = np.where(column >= 0, remap[np.maximum(column, 0)], -1).astype(np.int32)
            pieces[key].append(column)
        for key, column in item.memory.items():
            memory_pieces[key].append(column)
        memory_ranks.append(np.full(len(item.memory["ts"]), item.info.rank, dtype=np.int32))
        ranks.append(np.full(len(item.columns["ts"]), item.info.rank, dtype=np.int32))
        extra.update({index + offset: args for index, args in item.extra.items()})
        warnings.extend(item.warnings)
        offset += len(item.columns["ts"])
    columns = {key: _join(values) for key, values in pieces.items()}
    memory_columns = {key: _join(values) for key, values in memory_pieces.items()}
    for times in (columns["ts"], columns["dur"], memory_columns["ts"]):
        _on_grid(times)
    origin = float(columns["ts"].min()) if len(columns["ts"]) else 0.0
    columns["ts"] -= origin
    memory_columns["ts"] = memory_columns["ts"] - origin
    memory = MemoryEvents(rank=np.concatenate(memory_ranks), **memory_columns)
    return Trace(
        names=names,
        rank=np.concatenate(ranks),
        memory=memory,
        ranks=tuple(item.info for item in parsed),
        origin_us=origin,
        extra=extra,
        warnings=warnings,
        **columns,
    )


TICKS_PER_US = 65536.0  # a power of two: scaling by it is exact


def _on_grid(times: np.ndarray) -> None:
    """Round absolute times (us) to the nearest 2^-16 us, in place (a time already coarser stays as it is)."""
    np.multiply(times, TICKS_PER_US, out=times)
    np.round(times, out=times)
    np.divide(times, TICKS_PER_US, out=times)


def _join(parts: list[np.ndarray]) -> np.ndarray:
    return parts[0] if len(parts) == 1 else np.concatenate(parts)
