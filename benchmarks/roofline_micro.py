"""The roofline's labels against a microbenchmark of the same ops on this machine (issue 37).

The script below runs, one thread, a 512x512 matmul, a 3x3 convolution (8x32x64x64 -> 64 channels, with its
backward so its output size is known), a 4M-element add, a 1024x4096 softmax and 2000 16-element adds a step,
each timed by hand (perf_counter, medians), under ``skalpel run``. For each op the hand time gives its FLOP/s
and bytes/s, judged against the same roofs (this CPU's measured matmul and copy rates, from the report) by the
same rule; the table prints both labels.

    PYTHONPATH=src .venv/bin/python benchmarks/roofline_micro.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = '''
import json, os, statistics, time, torch
torch.set_num_threads(1)
torch.manual_seed(0)
a, w = torch.randn(512, 512), torch.nn.Parameter(torch.randn(512, 512))
x, conv = torch.randn(8, 32, 64, 64), torch.nn.Conv2d(32, 64, 3, padding=1)
big, big2, sm = torch.randn(4 << 20), torch.randn(4 << 20), torch.randn(1024, 4096)
tiny, tiny2 = torch.randn(16), torch.randn(16)
opt = torch.optim.SGD([w, *conv.parameters()], lr=0.0)
hand = {"aten::mm": [], "aten::convolution": [], "aten::add": [], "aten::_softmax": [], "tiny": []}
def timed(key, fn):
    start = time.perf_counter(); out = fn(); hand[key].append(time.perf_counter() - start); return out
for step in range(12):
    opt.zero_grad()
    y = timed("aten::mm", lambda: torch.mm(a, w))
    c = timed("aten::convolution", lambda: conv(x))
    timed("aten::add", lambda: torch.add(big, big2))
    timed("aten::_softmax", lambda: torch.softmax(sm, dim=1))
    for _ in range(2000):
        timed("tiny", lambda: torch.add(tiny, tiny2))
    (y.sum() + c.sum()).backward()
    opt.step()
json.dump({key: statistics.median(values) for key, values in hand.items()}, open(os.environ["HAND_OUT"], "w"))
'''
OVERHEAD_BELOW = 0.10  # analysis/roofline.py's


def hand_label(row: dict, seconds: float) -> tuple[str, float]:
    """The label the same roofs give the hand-timed op: (label, % of its roof)."""
    ridge = row["peak_gflops"] / row["peak_gbps"]
    if row["intensity"] >= ridge:
        pct, bound = 100 * row["flops"] / seconds / 1e9 / row["peak_gflops"], "compute"
    else:
        pct, bound = 100 * row["bytes"] / seconds / 1e9 / row["peak_gbps"], "memory"
    return (f"{bound}-bound" if pct >= 100 * OVERHEAD_BELOW else "overhead-bound"), pct


def run(folder: Path) -> list[tuple[str, str, str, float, float]]:
    """(op, skalpel's label, the hand label, skalpel's % of roof, the hand's) for each op of the script."""
    script, hand_out = folder / "roofline_micro_ops.py", folder / "hand.json"
    script.write_text(SCRIPT)
    env = {**os.environ, "HAND_OUT": str(hand_out), "PYTHONPATH": str(ROOT / "src")}
    subprocess.run([sys.executable, "-m", "skalpel", "run", "--out", str(folder / "run"), str(script)], cwd=ROOT,
                   env=env, check=True, capture_output=True)  # fmt: skip
    report = json.loads((folder / "run" / "report.json").read_text())
    hand = json.loads(hand_out.read_text())
    rows = report["ranks"][0]["extra"]["roofline"]["ops"]
    found = []
    for row in rows:
        key = "tiny" if row["op"] == "aten::add" and row["shapes"].startswith("[[16]") else row["op"]
        if key in hand and row["label"] != "not judged":
            label, pct = hand_label(row, hand[key])
            found.append((key, row["label"], label, row["roof_pct"], pct))
    return found


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        rows = run(Path(folder))
    print(f"{'op':<20} {'skalpel':<16} {'hand':<16} {'sk % roof':>9} {'hand % roof':>11}")
    for op, label, hand, pct, hand_pct in rows:
        print(f"{op:<20} {label:<16} {hand:<16} {pct:>9.1f} {hand_pct:>11.1f}")


if __name__ == "__main__":
    main()
