"""A rank's summary as it travels from its worker to the driver: its bulky lists as numpy columns.

A rank of 1 GB has some 50,000 collectives and as many collective-wait spans. Pickled as objects
(frozen, slotted ``Collective``s; tuples of tuples), each costs the driver microseconds to unpickle,
and the driver unpickles every rank's summary, one after another, while the workers go on: for
1,000 ranks that is minutes. As columns (a few arrays) they travel in fewer bytes, and the driver keeps
them so: the join moves and compares them as columns; what arrives is equal to what was sent. (The
collective-wait spans are columns from the start, ``WaitSpans``, and travel as themselves.)
"""

from __future__ import annotations

import dataclasses
import functools
from collections import deque

import numpy as np

from ..analysis.collectives import Collective
from ..analysis.comm import CommAnalysis
from ..analysis.memory import DeviceMemory

_FIELDS = ("rank", "event", "start_us", "end_us", "nbytes", "group_size", "on_device", "tid")
_DTYPES = (np.int64, np.int64, np.float64, np.float64, np.int64, np.int64, np.bool_, np.int64)
_SLOTS = {field.name: getattr(Collective, field.name).__set__ for field in dataclasses.fields(Collective)}
_new = object.__new__


@dataclasses.dataclass(frozen=True, eq=False)
class PackedCollectives:
    """A rank's collectives as columns: the types as codes into ``types``, every other field as an array.

    In the driver it stands for the tuple of ``Collective``s it packs: the join moves it onto the job's clock and
    the rank comparison reads its columns (``column``), so no object is made per collective (a microsecond each,
    50,000 a rank); anything that iterates or indexes it gets the objects, made once."""

    types: tuple[str, ...]
    type_codes: np.ndarray
    columns: tuple[np.ndarray, ...]  # in the order of _FIELDS

    @classmethod
    def of(cls, calls: tuple[Collective, ...]) -> PackedCollectives:
        types = sorted({call.type for call in calls})
        code_of = {kind: code for code, kind in enumerate(types)}
        codes = np.fromiter([code_of[call.type] for call in calls], np.int32, len(calls))
        columns = tuple(np.fromiter([getattr(call, name) for call in calls], dtype, len(calls))
                        for name, dtype in zip(_FIELDS, _DTYPES))  # fmt: skip
        return cls(tuple(types), codes, columns)

    def column(self, name: str) -> np.ndarray:
        return self.columns[_FIELDS.index(name)]

    def shifted(self, shift_us: float, event_offset: int) -> PackedCollectives:
        """Moved onto the job's clock and event numbering: the doubles ``shifted_collectives`` adds up."""
        moved = {"start_us": shift_us, "end_us": shift_us, "event": event_offset}
        return PackedCollectives(self.types, self.type_codes,
                                 tuple(column + moved[name] if name in moved else column
                                       for name, column in zip(_FIELDS, self.columns)))  # fmt: skip

    @functools.cached_property
    def _objects(self) -> tuple[Collective, ...]:
        return self.unpacked()

    def unpacked(self) -> tuple[Collective, ...]:
        """The collectives, filled field by field through their slots: a frozen dataclass's constructor sets each
        field with ``object.__setattr__``, twice this cost for 50,000 of them."""
        values = dict(zip(_FIELDS, (column.tolist() for column in self.columns)))
        values["type"] = [self.types[code] for code in self.type_codes.tolist()]
        return _filled(values, len(self.type_codes))

    def __len__(self) -> int:
        return len(self.type_codes)

    def __iter__(self):
        return iter(self._objects)

    def __getitem__(self, index):
        return self._objects[index]

    def __eq__(self, other) -> bool:
        if isinstance(other, (PackedCollectives, tuple, list)):
            return tuple(self) == tuple(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment] - equal to a tuple of its collectives, so not hashable apart


def shifted_collectives(calls: tuple[Collective, ...] | PackedCollectives, shift_us: float,
                        event_offset: int) -> tuple[Collective, ...] | PackedCollectives:  # fmt: skip
    """``calls`` moved onto the job's clock and event numbering (``job.join``): columns as columns, objects built as
    ``unpacked`` builds them."""
    if isinstance(calls, PackedCollectives):
        return calls.shifted(shift_us, event_offset)
    values = {name: [getattr(call, name) for call in calls] for name in _SLOTS}
    values["start_us"] = [start + shift_us for start in values["start_us"]]  # Python floats: the sums the join made
    values["end_us"] = [end + shift_us for end in values["end_us"]]
    values["event"] = [event + event_offset for event in values["event"]]
    return _filled(values, len(calls))


def _filled(values: dict[str, list], count: int) -> tuple[Collective, ...]:
    calls = [_new(Collective) for _ in range(count)]
    for name, column in values.items():
        deque(map(_SLOTS[name], calls, column), maxlen=0)
    return tuple(calls)


def packed_comm(comm: CommAnalysis | None) -> CommAnalysis | None:
    """``comm`` with each rank's collectives as ``PackedCollectives`` (for pickling only: unpack before use)."""
    if comm is None:
        return None
    return CommAnalysis(tuple(rank if isinstance(rank.collectives, PackedCollectives)
                              else dataclasses.replace(rank, collectives=PackedCollectives.of(rank.collectives))
                              for rank in comm.ranks))  # fmt: skip


@dataclasses.dataclass(frozen=True, eq=False)
class PackedCurve:
    """A memory curve (``DeviceMemory.curve``: 2,000 (us, bytes) pairs a rank) as two columns: it travels and
    stays in the driver so, and the join moves its times onto the job's clock as a column (``build.memory_summary``);
    anything that iterates or indexes it gets the pairs."""

    times: np.ndarray  # float64
    values: np.ndarray  # int64

    @classmethod
    def of(cls, curve: tuple[tuple[float, int], ...]) -> PackedCurve:
        return cls(np.fromiter((ts for ts, _ in curve), np.float64, len(curve)),
                   np.fromiter((value for _, value in curve), np.int64, len(curve)))  # fmt: skip

    def __len__(self) -> int:
        return len(self.times)

    def __iter__(self):
        return zip(self.times.tolist(), self.values.tolist())

    def __getitem__(self, index):
        return tuple(self)[index]

    def __eq__(self, other) -> bool:
        if isinstance(other, (PackedCurve, tuple, list)):
            return tuple(self) == tuple(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment] - equal to the tuple of its pairs


def packed_memory(memory: DeviceMemory | None) -> DeviceMemory | None:
    """``memory`` with its curve as a ``PackedCurve`` (to the driver)."""
    if memory is None or isinstance(memory.curve, PackedCurve) or any(abs(value) >= 2**63 for _, value in memory.curve):
        return memory
    return dataclasses.replace(memory, curve=PackedCurve.of(memory.curve))
