"""A finding's evidence (and a rank's MFU) in words and numbers, for the terminal and the HTML page.

``{"median_step_ms": 0.379, "breakdown_pct": {"cpu_exec": 48.3, "other": 51.7}}`` reads
``median step 0.379 ms, breakdown (cpu exec 48.3%, other 51.7%)``: the unit suffix of a
key becomes the unit of its number (and of the numbers inside it), underscores become
spaces, and nothing prints as a Python dict or list. A rate keeps its unit whole:
``wait_ms_per_step`` reads ``wait 12.5 ms/step``, ``gb_per_s`` reads ``10.1 GB/s``; a count
per step (``syncs_per_step``) reads ``syncs per step 2.17``.
"""

from __future__ import annotations

from typing import Any

from ..result.report import MfuSummary

# a key's last word -> the unit its numbers are printed with
_UNITS = {"pct": "%", "ms": " ms", "us": " µs", "s": " s", "kib": " KiB", "mib": " MiB", "gib": " GiB", "kb": " kB",
          "mb": " MB", "gb": " GB", "bytes": " bytes", "gbps": " GB/s", "tflops": " TFLOP/s", "flops": " FLOP"}  # fmt: skip
_PER = {"s": "s", "step": "step", "call": "call", "iteration": "iteration"}  # a rate's denominator: <unit>_per_<this>
_NOT_PER = {"pct", "gbps", "tflops"}  # shares and rates already: "<rate>_per_step" reads as words
MAX_ITEMS = 6


def evidence_text(evidence: dict[str, Any]) -> str:
    return ", ".join(_item(str(key), value) for key, value in evidence.items())


def _item(key: str, value: Any, unit: str = "") -> str:
    words, own_unit = _words(key)
    unit = own_unit or unit
    if isinstance(value, dict):
        return f"{words} ({_mapping(value, unit)})" if words else f"({_mapping(value, unit)})"
    return f"{words} {value_text(value, unit)}" if words else value_text(value, unit)


def _words(key: str) -> tuple[str, str]:
    """A key's words and the unit of its numbers: ``wait_ms_per_step`` -> ("wait", " ms/step")."""
    parts = key.split("_")
    lowered = [part.lower() for part in parts]
    if len(parts) >= 3 and lowered[-2] == "per" and lowered[-1] in _PER and lowered[-3] in _UNITS.keys() - _NOT_PER:
        return " ".join(parts[:-3]), f"{_UNITS[lowered[-3]]}/{_PER[lowered[-1]]}"
    if len(parts) >= 2 and lowered[-1] in _UNITS:
        return " ".join(parts[:-1]), _UNITS[lowered[-1]]
    if "by" in lowered[1:-1]:  # share_pct_by_rank: "share by rank", its numbers in %
        at = len(lowered) - 1 - lowered[::-1].index("by")
        words, unit = _words("_".join(parts[:at]))
        if unit:
            return " ".join([words, *parts[at:]]).strip(), unit
    return " ".join(parts), ""


def _mapping(value: dict, unit: str) -> str:
    items = list(value.items())
    shown = ", ".join(_item(str(key), inner, unit) for key, inner in items[:MAX_ITEMS])
    return shown + (f", {len(items) - MAX_ITEMS} more" if len(items) > MAX_ITEMS else "")


def value_text(value: Any, unit: str = "") -> str:
    """One value: a number with its unit, yes/no, a short list, or nested words."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "none"
    if isinstance(value, float):
        number = f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
        return number + unit
    if isinstance(value, int):
        return f"{value:,}{unit}" if abs(value) >= 10_000 else f"{value}{unit}"
    if isinstance(value, dict):
        return f"({_mapping(value, unit)})"
    if isinstance(value, (list, tuple)):
        items = list(value)
        shown = ", ".join(value_text(item, unit) for item in items[:MAX_ITEMS])
        more = f", {len(items) - MAX_ITEMS} more" if len(items) > MAX_ITEMS else ""
        return f"({shown}{more})" if items else "none"
    return str(value)


def mfu_text(mfu: MfuSummary) -> str:
    """'41.2% of the NVIDIA H100 bf16 peak (407.5 of 989.4 TFLOP/s)', or the achieved rate and why there is no MFU."""
    if mfu.mfu_pct is not None:
        return (f"MFU {mfu.mfu_pct:.1f}% of the {mfu.device} {mfu.dtype} peak "
                f"({mfu.achieved_tflops:.1f} of {mfu.peak_tflops:g} TFLOP/s, {mfu.flops_per_step / 1e12:.3g} TFLOP/step)")  # fmt: skip
    return f"{mfu.achieved_tflops * 1000:.3g} GFLOP/s achieved, no MFU: {mfu.note}"
