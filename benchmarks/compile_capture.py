"""`skalpel run` on a compiled model against the plain script: wall time and peak memory, cold and warm cache.

The script is ``benchmarks/compiled/tiny_gpt.py``, a small nanoGPT-shaped model under
``torch.compile`` (Inductor on the CPU), run as ``python tiny_gpt.py`` and as
``skalpel run tiny_gpt.py`` for the same steps, each in its own process. The wall time
is the whole process (start to exit, compilation and skalpel's report included); the
peak memory is the process's peak RSS (``os.wait4``). With a cold cache each run gets a
fresh ``TORCHINDUCTOR_CACHE_DIR``; with a warm one they share a folder compiled once first.
``--recompile`` changes the sequence length inside the recorded steps, so dynamo
recompiles there. The runs alternate (plain, skalpel) so load on the machine hits both.

    .venv/bin/python benchmarks/compile_capture.py [--repeats 1] [--steps 20] [--recompile]

Target (issue 12): skalpel / plain <= 1.3 in wall time and < 1 GB more peak memory,
cold and warm, with recompiles in the window too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "compiled" / "tiny_gpt.py"
SKALPEL = Path(sys.executable).with_name("skalpel")


def run(command: list[str], cache: str) -> tuple[float, int]:
    """(wall seconds, peak RSS bytes) of one process."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    if status != 0:
        raise SystemExit(f"{' '.join(command)} failed (status {status})")
    return wall, usage.ru_maxrss * 1024


def measure(label: str, script_args: list[str], repeats: int, cold: bool, root: Path) -> None:
    plain_cmd = [sys.executable, str(SCRIPT), *script_args]
    skalpel_cmd = [str(SKALPEL), "run", "--out", str(root / "runs" / label), str(SCRIPT), *script_args]
    warm_cache = str(root / "warm-cache")
    if not cold:
        run(plain_cmd, warm_cache)  # fill the shared cache once
    plain, skalpel = [], []
    for repeat in range(repeats):
        for kind, command, into in (("plain", plain_cmd, plain), ("skalpel", skalpel_cmd, skalpel)):
            cache = tempfile.mkdtemp(prefix=f"cold-{kind}-{repeat}-", dir=root) if cold else warm_cache
            into.append(run(command, cache))
    plain_s, skalpel_s = statistics.median(w for w, _ in plain), statistics.median(w for w, _ in skalpel)
    plain_mb, skalpel_mb = max(m for _, m in plain) / 2**20, max(m for _, m in skalpel) / 2**20
    print(
        f"{label:<24} plain {plain_s:7.1f} s {plain_mb:7.0f} MiB | skalpel run {skalpel_s:7.1f} s {skalpel_mb:7.0f} MiB"
        f" | wall x{skalpel_s / plain_s:.2f} | peak memory {skalpel_mb - plain_mb:+.0f} MiB (x{skalpel_mb / plain_mb:.2f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--recompile", action="store_true", help="also measure with a recompilation in the window")
    args = parser.parse_args()
    base = ["--steps", str(args.steps)]
    cases = [("cold cache", base, True), ("warm cache", base, False)]
    if args.recompile:
        cases += [("cold, recompiling", [*base, "--recompile"], True), ("warm, recompiling", [*base, "--recompile"], False)]
    with tempfile.TemporaryDirectory(prefix="skalpel-compile-bench-") as folder:
        for label, script_args, cold in cases:
            measure(label, script_args, args.repeats, cold, Path(folder))
    print("target: wall x1.30 or less, peak memory under +1024 MiB (medians over repeats; a loaded machine adds noise)")


if __name__ == "__main__":
    main()
