"""The format of ``collectives.ring``, skalpel's on-disk record of a rank's collectives, and its reader.

``capture/collectives.py`` writes it (``SLOTS`` slots of ``SLOT`` bytes, one JSON object each,
padded with spaces, overwritten in turn); ``watching/hangs.py`` reads it back for a stopped job's
verdict. Here, below both, so that ``skalpel analyze`` reads it without the capture layer. No torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

RING = "collectives.ring"
SLOT = 384  # bytes per entry
SLOTS = 256  # the last 256 collectives


def read_ring(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The entries of a ring file, oldest first, and how many slots were torn (written as the rank died)."""
    entries, torn = [], 0
    data = path.read_bytes()
    for offset in range(0, len(data) - SLOT + 1, SLOT):
        slot = data[offset:offset + SLOT]
        if not slot.strip(b"\x00"):
            continue  # never written
        try:
            entry = orjson.loads(slot.rstrip(b"\x00 \n"))
        except orjson.JSONDecodeError:
            torn += 1
            continue
        if isinstance(entry, dict) and isinstance(entry.get("n"), int):
            entries.append(entry)
        else:
            torn += 1
    entries.sort(key=lambda entry: entry["n"])
    return entries, torn
