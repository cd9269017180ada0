"""How fast this CPU runs a matrix multiply in bfloat16 against float32, measured once per machine.

A CPU with AMX or AVX-512 BF16 runs a bf16 matmul several times faster than an fp32 one; a CPU
without them (or oneDNN held below them, ``ONEDNN_MAX_CPU_ISA``) converts and runs it several
times slower. The flags say which path exists; the measurement says what it costs, so the finding
quotes a measured ratio, never a guess. One ``SHAPE`` matmul, fp32 and bf16 interleaved,
``REPEATS`` times each, at the script's thread count; the medians are cached per machine (CPU model,
its flags, torch's version, the oneDNN ISA limit, the thread count) under the user's cache folder,
so a second run costs nothing. It runs before the first recorded step (its ops are not in the
trace) and only where no GPU is in use.

The same measurement gives the CPU's roofs for ``analysis/roofline.py``: the matmul's FLOP/s in each
dtype and a large copy's bytes/s (``copy_gbps``).
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from pathlib import Path

import torch

from ..trace.precision_header import BF16_FLAGS

SHAPE = (256, 256, 256)  # M, K, N: about a millisecond in fp32 on one core, a fraction of a second at worst in bf16
REPEATS = 7
COPY_BYTES = 64 << 20  # one copy's size: far beyond the caches, so it measures the memory's bandwidth
VERSION = 2  # of the cached figures: 2 added the copy bandwidth
_ISA_VARIABLES = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")


def cpu_facts() -> dict:
    """The CPU's model name and the flags that decide its matmul paths (Linux /proc/cpuinfo; empty elsewhere)."""
    model, flags = "", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and not model:
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    wanted = {"avx2", "avx512f", "avx512_fp16", "amx_tile", *BF16_FLAGS}
    return {"cpu": model, "flags": sorted(flags & wanted)}


def _isa_limit() -> str | None:
    return next((os.environ[name] for name in _ISA_VARIABLES if os.environ.get(name)), None)


def measure(threads: int) -> dict:
    """Median ms of one SHAPE matmul in fp32 and bf16, interleaved."""
    m, k, n = SHAPE
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(m, k, generator=generator), torch.randn(k, n, generator=generator)
    pairs = {"fp32": (a, b), "bf16": (a.bfloat16(), b.bfloat16())}
    times: dict[str, list[float]] = {key: [] for key in pairs}
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.no_grad(), torch.autocast("cpu", enabled=False):
            for left, right in pairs.values():  # first calls pick their kernels: not timed
                torch.mm(left, right)
            for _ in range(REPEATS):
                for key, (left, right) in pairs.items():
                    start = time.perf_counter()
                    torch.mm(left, right)
                    times[key].append((time.perf_counter() - start) * 1000.0)
    finally:
        torch.set_num_threads(previous)
    return {key: round(statistics.median(values), 4) for key, values in times.items()}


def copy_gbps(threads: int) -> float:
    """The median rate of a COPY_BYTES tensor copy, reading and writing: bytes moved (2x its size) per second."""
    source = torch.ones(COPY_BYTES // 4, dtype=torch.float32)
    target = torch.empty_like(source)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        target.copy_(source)  # the pages are touched once before timing
        rates = []
        for _ in range(REPEATS):
            start = time.perf_counter()
            target.copy_(source)
            rates.append(2 * COPY_BYTES / (time.perf_counter() - start) / 1e9)
    finally:
        torch.set_num_threads(previous)
    return round(statistics.median(rates), 3)


def _cache_file(facts: dict, threads: int) -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "skalpel" / "precision"
    key = json.dumps([VERSION, facts, torch.__version__, _isa_limit(), threads, list(SHAPE)], sort_keys=True)
    return root / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"


def header_value(threads: int | None = None) -> dict:
    """The header's ``skalpel_precision``: cached when this machine measured it before, else measured now."""
    threads = threads or torch.get_num_threads()
    facts = cpu_facts()
    cache = _cache_file(facts, threads)
    try:
        stored = json.loads(cache.read_text())
        times, bandwidth, cached = stored["ms"], float(stored["copy_gbps"]), True
        if not all(isinstance(times.get(key), (int, float)) for key in ("fp32", "bf16")):
            raise ValueError("incomplete")
    except (OSError, ValueError, KeyError, TypeError):
        times, bandwidth, cached = measure(threads), copy_gbps(threads), False
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps({"ms": times, "copy_gbps": bandwidth}))
        except OSError:
            pass  # a read-only home: measured again next time
    return {"shape": list(SHAPE), "threads": threads, "ms": times, "copy_gbps": bandwidth, "repeats": REPEATS,
            "native_bf16": any(flag in facts["flags"] for flag in BF16_FLAGS) and _isa_limit() is None,
            "flags": facts["flags"], "isa": torch.backends.cpu.get_cpu_capability(), "cpu": facts["cpu"],
            "onednn_max_isa": _isa_limit(), "cached": cached}  # fmt: skip
