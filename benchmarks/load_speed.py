"""Load speed and memory: skalpel (load + all analyses) vs stdlib json.load vs HTA.

    .venv/bin/python benchmarks/load_speed.py            # df_index_resolver + a ~1 GB synthetic trace from it
    .venv/bin/python benchmarks/load_speed.py --quick    # synthetic trace of 200 MB
    .venv/bin/python benchmarks/load_speed.py --size-mb 512 --repeats 3 --no-hta

Two traces: HTA's df_index_resolver from ../shared/traces (--source another; the largest
corpus trace when it is missing) and a synthetic one built by replicating that trace's events with shifted timestamps, correlation ids,
external ids, flow ids and step numbers (written to a temporary folder, deleted after).

Every measurement runs in a fresh Python process that reports its own peak RSS
(``ru_maxrss``), so each figure is that measurement's alone; "baseline" is a process that
only imports the modules, and "net" figures subtract it. Medians over --repeats runs,
interleaved so that machine noise hits every tool alike. HTA (Holistic Trace Analysis) is
timed by tests/golden/hta_timing.py in /tmp/hta-venv when that venv exists. A tool whose
expected peak memory exceeds what the machine has available is skipped, and says so.

Targets (issue 3): skalpel's total no slower than json.load, at least 10x faster than HTA,
peak memory at most 2x the uncompressed file size. Issue 13: the whole ``skalpel analyze FILE
--json OUT`` process (``python -m skalpel``, interpreter start to exit, timed by the parent) at most 0.5x the time of
``json.loads`` of the same uncompressed file's bytes, and its peak RSS at most 1.5x the file's
size; the last line of each table prints both ratios. A .gz corpus trace is measured uncompressed.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TRACES = REPO.parent / "shared" / "traces"
DF_INDEX = TRACES / "hta" / "df_index_resolver" / "df_index_resolver.json.gz"
HTA_PYTHON = Path("/tmp/hta-venv/bin/python")
HTA_SCRIPT = REPO / "tests" / "golden" / "hta_timing.py"
HTA_SETUP = ("python3 -m venv /tmp/hta-venv && /tmp/hta-venv/bin/pip install traceinsight "
             "(see tests/golden/make_hta_golden.py)")  # fmt: skip
MEMORY_FACTOR = {"json.load": 9.0, "json.loads": 10.0, "hta": 8.0, "skalpel": 2.5, "analyze": 2.5}  # expected peak RSS / uncompressed size, to skip safely


# ---------------------------------------------------------------- children (one measurement each)


def _child(mode: str, path: str) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    started = time.perf_counter()
    result: dict = {}
    if mode == "python":
        pass
    elif mode == "imports":
        import skalpel.job.build  # noqa: F401
        import skalpel.trace  # noqa: F401
    elif mode == "json.loads":  # the parse alone, of bytes already read (issue 13's yardstick)
        data = Path(path).read_bytes()
        started = time.perf_counter()
        json.loads(data)
    elif mode == "json.load":
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rb") as handle:
            json.load(handle)
    elif mode == "skalpel":
        from skalpel.job.report_of import report_of_trace
        from skalpel.trace import load

        import_s = time.perf_counter() - started
        started = time.perf_counter()
        trace = load(path)
        result["load_s"] = time.perf_counter() - started
        report_of_trace(trace)
        result["import_s"] = import_s
        result["events"] = len(trace)
    elif mode == "generate":
        size = _generate(Path(path), Path(os.environ["LOAD_SPEED_TARGET"]), int(os.environ["LOAD_SPEED_BYTES"]))
        result["bytes"] = size
    result["seconds"] = time.perf_counter() - started
    result["rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("LOAD_SPEED " + json.dumps(result), flush=True)


def _generate(source: Path, target: Path, size_bytes: int) -> int:
    """Write ``target``: the events of ``source`` repeated (shifted in time and ids) up to ``size_bytes``."""
    import orjson

    raw = source.read_bytes()
    document = orjson.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    events = [event for event in document.pop("traceEvents") if isinstance(event, dict)]
    times = [(e["ts"], e.get("dur", 0)) for e in events if isinstance(e.get("ts"), (int, float))]
    span = max(ts + (dur if isinstance(dur, (int, float)) else 0) for ts, dur in times) - min(ts for ts, _ in times)
    id_step = 1 + max([_max_id(e) for e in events] + [0])
    steps = 1 + max([_step(e.get("name")) for e in events] + [0])
    header = b",\n".join(b"  %s: %s" % (orjson.dumps(key), orjson.dumps(value)) for key, value in document.items())
    written = 0
    with open(target, "wb") as out:
        out.write(b"{\n" + header + (b",\n" if header else b"") + b'  "traceEvents": [\n')
        copy = 0
        while written < size_bytes:
            chunk = b",\n".join(orjson.dumps(_shift(e, copy, span * 1.01 + 1000, id_step, steps)) for e in events)
            out.write((b",\n" if copy else b"") + chunk)
            written += len(chunk)
            copy += 1
        out.write(b'\n  ],\n  "traceName": "synthetic"\n}\n')
    return target.stat().st_size


def _max_id(event: dict) -> int:
    args = event.get("args") if isinstance(event.get("args"), dict) else {}
    values = [event.get("id"), args.get("correlation"), args.get("External id"), args.get("external id")]
    return max([v for v in values if isinstance(v, int) and not isinstance(v, bool)] + [0])


def _step(name: object) -> int:
    if isinstance(name, str) and name.startswith("ProfilerStep#") and name[13:].isdigit():
        return int(name[13:])
    return 0


def _shift(event: dict, copy: int, time_step: float, id_step: int, steps: int) -> dict:
    if copy == 0:
        return event
    event = dict(event)
    if isinstance(event.get("ts"), (int, float)):
        event["ts"] = event["ts"] + copy * time_step
    if isinstance(event.get("id"), int):
        event["id"] = event["id"] + copy * id_step
    step = _step(event.get("name"))
    if step:
        event["name"] = f"ProfilerStep#{step + copy * steps}"
    args = event.get("args")
    if isinstance(args, dict):
        args = event["args"] = dict(args)
        for key in ("correlation", "External id", "external id"):
            if isinstance(args.get(key), int) and args[key] > 0:
                args[key] += copy * id_step
    return event


# ---------------------------------------------------------------- parent


def _limit_memory() -> None:
    """In a child: cap its address space below the free memory, so that it fails alone instead of
    making the kernel kill other processes of a shared machine."""
    limit = int(max(2048, 0.8 * _available_mib()) * 2**20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _run_analyze(path: Path, env: dict | None = None) -> dict:
    """The whole `skalpel analyze FILE --json OUT` process as a user runs it (``python -m skalpel``), timed from
    its start to its exit; its peak RSS from wait4 (the larger of its own and its forked loaders')."""
    command = [sys.executable, "-m", "skalpel", "analyze", str(path), "--json", os.devnull]
    with tempfile.TemporaryFile() as errors_file:
        started = time.perf_counter()
        child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=errors_file,
                                 env={**_with_bytecode(), **(env or {})}, preexec_fn=_limit_memory)  # fmt: skip
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - started
        child.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
        errors_file.seek(0)
        errors = errors_file.read().decode(errors="replace").strip().splitlines()
    if child.returncode != 0:
        return {"error": (errors or [f"exit {child.returncode}"])[-1]}
    return {"seconds": seconds, "rss_mib": usage.ru_maxrss / 1024}


def _run_child(mode: str, path: Path, env: dict | None = None) -> dict:
    if mode == "analyze":
        return _run_analyze(path, env)
    command = [sys.executable, str(Path(__file__).resolve()), "--child", mode, str(path)]
    done = subprocess.run(
        command, capture_output=True, text=True, env={**_with_bytecode(), **(env or {})}, preexec_fn=_limit_memory
    )
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("LOAD_SPEED ")), None)
    if done.returncode != 0 or line is None:
        return {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]}
    return json.loads(line.split(" ", 1)[1])


def _with_bytecode() -> dict[str, str]:
    """The environment less PYTHONDONTWRITEBYTECODE: an installed skalpel starts from cached bytecode,
    not by compiling its modules (a quarter of a second) in every process."""
    return {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}


def _run_hta(path: Path, repeats: int) -> dict:
    if not HTA_PYTHON.exists():
        return {"error": f"HTA not available: {HTA_SETUP}"}
    with tempfile.TemporaryDirectory(prefix="load_speed_hta_") as folder:
        os.symlink(path, Path(folder) / path.name)
        command = [str(HTA_PYTHON), str(HTA_SCRIPT), folder, "--runs", str(repeats)]
        done = subprocess.run(command, capture_output=True, text=True, preexec_fn=_limit_memory)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    result = json.loads(lines[-1]) if lines else {}
    if done.returncode != 0 or "seconds" not in result:
        return {"error": "HTA failed: " + ((done.stderr.strip().splitlines() or ["no output"])[-1])[:200]}
    return {"seconds": result["seconds"], "rss_mib": result["peak_rss_mib"], "load_s": result["load_seconds"]}


def _uncompressed_size(path: Path) -> int:
    if path.name.endswith(".gz"):
        with open(path, "rb") as handle:
            handle.seek(-4, os.SEEK_END)
            return int.from_bytes(handle.read(4), "little")  # ISIZE: exact below 4 GiB
    return path.stat().st_size


def _available_mib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return float("inf")


def _largest_corpus_trace() -> Path:
    candidates = [p for p in TRACES.rglob("*.json*") if p.name.endswith((".json", ".json.gz"))]
    if not candidates:
        sys.exit(f"no traces under {TRACES}")
    return max(candidates, key=_uncompressed_size)


def _measure(path: Path, repeats: int, hta_runs: int) -> dict[str, dict]:
    size_mib = _uncompressed_size(path) / 2**20
    runs: dict[str, list[dict]] = {"python": [], "imports": [], "skalpel": [], "json.load": [], "analyze": [], "json.loads": []}
    skipped: dict[str, dict] = {}
    for tool in ("skalpel", "json.load", "hta", "analyze", "json.loads"):
        need = MEMORY_FACTOR[tool] * size_mib + 300
        if need > _available_mib():
            skipped[tool] = {"error": f"skipped: needs ~{need / 1024:.1f} GiB, {_available_mib() / 1024:.1f} GiB available"}
    for _ in range(repeats):
        for tool in runs:
            if tool not in skipped:
                runs[tool].append(_run_child(tool, path))
                print(f"  {path.name} {tool}: {runs[tool][-1]}", file=sys.stderr, flush=True)
    results = {tool: skipped.get(tool) or _median(values) for tool, values in runs.items()}
    results["hta"] = skipped.get("hta") or (_run_hta(path, hta_runs) if hta_runs else {"error": "not run (--no-hta)"})
    return results


def _median(runs: list[dict]) -> dict:
    errors = [run["error"] for run in runs if "error" in run]
    if errors:
        return {"error": errors[0]}
    keys = [key for key in runs[0] if isinstance(runs[0][key], (int, float))]
    return {key: statistics.median(run[key] for run in runs) for key in keys}


_BASELINE = {"skalpel": "imports", "json.load": "python"}  # what each tool's "net" RSS subtracts


def _print_table(label: str, path: Path, results: dict[str, dict]) -> None:
    size_mib = _uncompressed_size(path) / 2**20
    json_s = results["json.load"].get("seconds")
    hta_s = results["hta"].get("seconds")
    print(f"\n{label}: {path.name} ({size_mib:,.0f} MiB uncompressed, {path.stat().st_size / 2**20:,.0f} MiB on disk)")
    print(f"{'tool':<10}{'seconds':>9}{'load s':>8}{'peak RSS MiB':>14}{'net MiB':>9}{'/json.load':>11}{'/HTA':>8}{'RSS/size':>10}{'net/size':>10}")
    for tool in ("skalpel", "json.load", "hta", "imports", "python"):
        result = results[tool]
        if "error" in result:
            print(f"{tool:<10}  {result['error']}")
            continue
        seconds, rss = result["seconds"], result["rss_mib"]
        base = results.get(_BASELINE.get(tool, ""), {}).get("rss_mib")
        compare = tool in ("skalpel", "json.load", "hta")
        cells = [
            f"{seconds:9.2f}", f"{result['load_s']:8.2f}" if "load_s" in result else f"{'':8}", f"{rss:14,.0f}",
            f"{rss - base:9,.0f}" if base else f"{'':9}",
            f"{seconds / json_s:11.2f}" if json_s and compare else f"{'':11}",
            f"{seconds / hta_s:8.3f}" if hta_s and compare else f"{'':8}",
            f"{rss / size_mib:10.2f}", f"{(rss - base) / size_mib:10.2f}" if base else f"{'':10}",
        ]  # fmt: skip
        print(f"{tool:<10}" + "".join(cells))
    print("(imports: a process that only imports skalpel; python: a bare interpreter. net = peak RSS minus that baseline)")
    analyze, loads = results["analyze"], results["json.loads"]
    if "error" in analyze or "error" in loads:
        print(f"issue 13 ratios: not measured ({analyze.get('error') or loads.get('error')})")
        return
    print(f"issue 13: whole `skalpel analyze FILE --json OUT` process {analyze['seconds']:.2f} s / json.loads "
          f"{loads['seconds']:.2f} s = {analyze['seconds'] / loads['seconds']:.2f} (target <= 0.5); its peak RSS "
          f"{analyze['rss_mib']:,.0f} MiB / file {size_mib:,.0f} MiB = {analyze['rss_mib'] / size_mib:.2f} (target <= 1.5), "
          f"net of the bare interpreter {(analyze['rss_mib'] - results['python']['rss_mib']) / size_mib:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="size of the synthetic trace (default 1024)")
    parser.add_argument("--quick", action="store_true", help="a 200 MB synthetic trace")
    parser.add_argument("--repeats", type=int, default=0, help="runs per tool (default 3 for the corpus trace, 1 for the synthetic one)")
    parser.add_argument("--no-hta", action="store_true", help="do not time HTA")
    parser.add_argument("--hta-runs", type=int, default=1, help="HTA runs per trace (default 1: HTA takes minutes)")
    parser.add_argument("--source", type=Path, help="trace to measure and replicate (default: HTA's df_index_resolver, "
                        "issue 13's yardstick, else the largest corpus trace)")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(*args.child)
        return
    source = args.source or (DF_INDEX if DF_INDEX.exists() else _largest_corpus_trace())
    size_mb = 200 if args.quick else args.size_mb
    hta_runs = 0 if args.no_hta else args.hta_runs
    folder = Path(tempfile.mkdtemp(prefix="skalpel_load_speed_"))
    try:
        if source.name.endswith(".gz"):  # measured uncompressed: json.loads reads no gzip
            plain = folder / source.name.removesuffix(".gz")
            plain.write_bytes(gzip.decompress(source.read_bytes()))
            source = plain
        corpus_results = _measure(source, args.repeats or 3, hta_runs)
        target = folder / "synthetic_rank0.json"
        made = _run_child("generate", source, {"LOAD_SPEED_TARGET": str(target), "LOAD_SPEED_BYTES": str(size_mb * 2**20)})
        if "error" in made:
            sys.exit(f"could not build the synthetic trace: {made['error']}")
        synthetic_results = _measure(target, args.repeats or 1, hta_runs)
        _print_table("corpus trace", source, corpus_results)
        _print_table(f"synthetic trace (replicated from {source.name})", target, synthetic_results)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
