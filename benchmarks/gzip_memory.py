"""Peak memory of loading a .json.gz trace: the columns plus a bounded window, whatever the document size.

    .venv/bin/python benchmarks/gzip_memory.py                     # 311 MB repetitive document (~1 MB gzip)
    .venv/bin/python benchmarks/gzip_memory.py --size-mb 2048      # a ~2 GB document (~8 MB gzip)
    .venv/bin/python benchmarks/gzip_memory.py --before /tmp/old/src   # the same figures for another source tree

The document repeats one Kineto-like CPU op (about 150 bytes of JSON) until it reaches the
size asked for, so it compresses some 300x: the case of issue 15 item 3, where a small file
inflated whole. Each figure comes from a fresh process that reports its own peak RSS
(``ru_maxrss``): "imports" is a process that only imports the loader and the report, "load"
runs ``skalpel.trace.load``, "analyze" is the whole ``skalpel analyze FILE --json OUT``
command. "columns" is the size of the loaded trace's arrays, measured in the load process:
the floor any loader needs. Ratios are printed against that floor and against the document.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

EVENT = (b'{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1669783687352244, '
         b'"dur": 20, "args": {"External id": 7, "Sequence number": 3, "Fwd thread id": 0}}')  # fmt: skip


def write_repetitive_gzip(target: Path, size_bytes: int) -> int:
    """A valid trace of ``size_bytes`` of JSON, written through a compressor (never whole in memory); returns events."""
    count = max(1, size_bytes // (len(EVENT) + 2))
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = b",\n".join([EVENT] * 10_000)
    with open(target, "wb") as out:
        out.write(compressor.compress(b'{"schemaVersion": 1, "traceEvents": [\n'))
        written = 0
        while written < count:
            take = min(10_000, count - written)
            piece = block if take == 10_000 else b",\n".join([EVENT] * take)
            out.write(compressor.compress((b",\n" if written else b"") + piece))
            written += take
        out.write(compressor.compress(b'\n], "traceName": "repetitive"}\n'))
        out.write(compressor.flush())
    return count


def _child(mode: str, path: str) -> None:
    result: dict = {}
    if mode == "imports":
        import skalpel.job.build  # noqa: F401
        import skalpel.trace  # noqa: F401
    elif mode == "load":
        import numpy as np

        from skalpel.trace import load

        trace = load(path)
        arrays = [value for value in [*vars(trace).values(), *vars(trace.memory).values()] if isinstance(value, np.ndarray)]
        result["columns_mib"] = sum(array.nbytes for array in arrays) / 2**20
        result["events"] = len(trace)
    elif mode == "analyze":
        from skalpel.cli import main

        with open(os.devnull, "w") as quiet:
            sys.stdout = quiet
            main(["analyze", path, "--json", os.devnull])
            sys.stdout = sys.__stdout__
    result["rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("GZIP_MEMORY " + json.dumps(result), flush=True)


def _run(mode: str, path: Path, tree: str | None) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if tree:
        env["PYTHONPATH"] = tree
    started = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "--child", mode, str(path)], capture_output=True, text=True, env=env)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("GZIP_MEMORY ")), None)
    if line is None:
        return {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]}
    return {**json.loads(line.split(" ", 1)[1]), "seconds": time.perf_counter() - started}


def _measure(label: str, path: Path, document_mib: float, tree: str | None) -> None:
    imports, load, analyze = (_run(mode, path, tree) for mode in ("imports", "load", "analyze"))
    for name, result in (("imports", imports), ("load", load), ("analyze", analyze)):
        if "error" in result:
            print(f"  {label:<8} {name:<8} failed: {result['error']}")
    if any("error" in result for result in (imports, load, analyze)):
        return
    columns = load["columns_mib"]
    print(f"  {label:<8} {load['events']:,} events, columns {columns:.0f} MiB, imports alone {imports['rss_mib']:.0f} MiB")
    for name, result in (("load", load), ("analyze", analyze)):
        net = result["rss_mib"] - imports["rss_mib"]
        print(f"  {label:<8} {name:<8} peak {result['rss_mib']:6.0f} MiB  net {net:6.0f} MiB  "
              f"net/columns {net / columns:4.2f}x  peak/document {result['rss_mib'] / document_mib:4.2f}x  "
              f"{result['seconds']:5.1f} s")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=311, help="size of the uncompressed document (default 311)")
    parser.add_argument("--before", help="another source tree (its src folder) to measure beside this one")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(*args.child)
        return
    with tempfile.TemporaryDirectory(prefix="gzip_memory_") as folder:
        path = Path(folder) / "repetitive.json.gz"
        events = write_repetitive_gzip(path, args.size_mb << 20)
        document_mib = events * (len(EVENT) + 2) / 2**20
        print(f"repetitive trace: {document_mib:.0f} MiB of JSON, {events:,} events, "
              f"{path.stat().st_size / 2**20:.1f} MiB gzip")  # fmt: skip
        if args.before:
            _measure("before", path, document_mib, args.before)
        _measure("this", path, document_mib, None)


if __name__ == "__main__":
    main()
