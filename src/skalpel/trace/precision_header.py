"""The precision facts skalpel's capture writes into a CPU trace's header (``skalpel_precision``).

``capture/precision.py`` measures, once per machine (cached), how long one matrix multiply of a
fixed shape takes in float32 and in bfloat16 on this CPU at the script's thread count, and reads
the CPU's flags. The analysis reads the ratio: a bf16 run on a CPU where bf16 is slower than fp32.
Written as::

    {"shape": [256, 256, 256], "threads": 1, "ms": {"fp32": 0.61, "bf16": 2.2}, "copy_gbps": 14.2, "repeats": 7,
     "native_bf16": false, "flags": ["avx512f"], "isa": "AVX512", "cpu": "Intel(R) Xeon(R) ...",
     "onednn_max_isa": "AVX512_CORE", "cached": true}
"""

from __future__ import annotations

HEADER_KEY = "skalpel_precision"
BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # the CPU flags of a native bf16 matmul path (oneDNN uses them)


def parse(value: object) -> dict | None:
    """The header's value when it has the figures the analysis reads (both times positive numbers), else None."""
    if not isinstance(value, dict) or not isinstance(value.get("ms"), dict):
        return None
    times = value["ms"]
    if not all(isinstance(times.get(key), (int, float)) and not isinstance(times.get(key), bool) and times[key] > 0
               for key in ("fp32", "bf16")):  # fmt: skip
        return None
    return value
