"""Each module's parameter count and forward output bytes, as skalpel's capture writes them into the trace header.

``capture/module_sizes.py`` records, at each module's first call in the profiled window, its parameters
(its own and its children's) and the bytes of the tensors its forward returned, by class in the order of
first calls: the order torch.profiler numbers the instances in (``nn.Module: Linear_2`` is the third
``Linear`` called). Written as ``{"version": 1, "by_class": {"Linear": [[params, bytes], ...], ...}}``;
-1 where a figure could not be read.
"""

from __future__ import annotations

HEADER_KEY = "skalpel_modules"


def parse(value: object) -> dict[str, tuple[int | None, int | None]] | None:
    """``{"Linear_0": (params, output bytes), ...}`` from the header's value (None in a figure: unknown); None where
    the header has no usable value."""
    if not isinstance(value, dict) or not isinstance(value.get("by_class"), dict):
        return None
    sizes: dict[str, tuple[int | None, int | None]] = {}
    for name, rows in value["by_class"].items():
        if not isinstance(name, str) or not isinstance(rows, list):
            continue
        for number, row in enumerate(rows):
            if isinstance(row, list) and len(row) == 2:
                sizes[f"{name}_{number}"] = (_count(row[0]), _count(row[1]))
    return sizes


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
