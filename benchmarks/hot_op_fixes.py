"""The gain of hot_op's fix on its two scenarios, against what the finding claims (issue 35).

Each scenario's training step runs planted and fixed, interleaved (A, B, A, B, ...), one intra-op thread,
without the profiler; prints the median step of each, the measured speed-up, and the share the finding gave
the op (the most its removal could save: 1 / (1 - share) if the fixed op cost nothing).

    .venv/bin/python benchmarks/hot_op_fixes.py [--repeats 15]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "scenarios"))
import float64_conv  # noqa: E402
import sort_for_topk  # noqa: E402

torch.set_num_threads(1)


def _sort_step(use_topk: bool):
    torch.manual_seed(0)
    model = sort_for_topk.RetrievalHead()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(256, 256)
    return lambda: sort_for_topk.train_step(model, optimizer, x, use_topk)


def _conv_step(dtype: torch.dtype):
    torch.manual_seed(0)
    model = float64_conv.make_model().to(dtype)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 4, 32, 32, dtype=dtype), torch.randn(16, 4, 32, 32, dtype=dtype)
    return lambda: float64_conv.train_step(model, optimizer, x, y)


def _timed(step) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def compare(name: str, planted, fixed, repeats: int) -> None:
    for step in (planted, fixed):  # warm-up
        step()
        step()
    times: dict[str, list[float]] = {"planted": [], "fixed": []}
    for _ in range(repeats):
        times["planted"].append(_timed(planted))
        times["fixed"].append(_timed(fixed))
    a, b = statistics.median(times["planted"]), statistics.median(times["fixed"])
    print(f"{name}: planted {1000 * a:.2f} ms, fixed {1000 * b:.2f} ms, speed-up {a / b:.2f}x (medians of {repeats})")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    compare("sort_for_topk (sort -> topk)", _sort_step(False), _sort_step(True), args.repeats)
    compare("float64_conv (float64 -> float32)", _conv_step(torch.float64), _conv_step(torch.float32), args.repeats)


if __name__ == "__main__":
    main()
