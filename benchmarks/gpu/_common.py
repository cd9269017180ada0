"""What the GPU scenarios share: the device, the sizes (small on a CPU, so the scripts also run here), the timing.

Each scenario times itself after its steps (``timed``): warm-up steps, then the device synchronised
once before and once after a block of steps, never inside one; it prints ``STEP_MS <ms per step>``.
Under ``skalpel run --stop-after-capture`` the script ends before that block, so the profile never
sees the timing's own synchronisations.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
ON_GPU = DEVICE.type == "cuda"


def size(gpu: int, cpu: int) -> int:
    return gpu if ON_GPU else cpu


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fix", action="store_true", help="apply the fix the finding names")
    parser.add_argument("--steps", type=int, default=40)
    return parser.parse_args()


def sync() -> None:
    if ON_GPU:
        torch.cuda.synchronize()


def timed(step, steps: int, warmup: int = 10) -> None:
    """Run ``step(i)`` ``steps`` times; print the mean time a step over the steps after ``warmup`` and, on a GPU,
    the device memory the timed steps kept (``GROWTH_MIB_PER_STEP``: allocated after them less before, a step)."""
    for i in range(min(warmup, steps)):
        step(i)
    sync()
    before = torch.cuda.memory_allocated() if ON_GPU else 0
    started = time.perf_counter()
    for i in range(warmup, steps):
        step(i)
    sync()
    if steps > warmup:
        print(f"STEP_MS {(time.perf_counter() - started) * 1e3 / (steps - warmup):.3f}")
        if ON_GPU:
            print(f"GROWTH_MIB_PER_STEP {(torch.cuda.memory_allocated() - before) / 2**20 / (steps - warmup):.3f}")
    sys.stdout.flush()
