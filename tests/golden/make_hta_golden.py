"""Generate golden reference numbers from Holistic Trace Analysis (HTA).

HTA is NOT a dependency of skalpel. Run this with a throwaway virtualenv that has
PyPI's ``traceinsight`` (HTA) installed, from the repository root:

    python3 -m venv /tmp/hta-venv
    /tmp/hta-venv/bin/pip install torch==2.13.0   # CPU wheel; keeps pip off CUDA torch
    /tmp/hta-venv/bin/pip install traceinsight
    /tmp/hta-venv/bin/python tests/golden/make_hta_golden.py

For each trace (or multi-rank set) it symlinks the file(s) into a temp folder, loads it
with ``hta.trace_analysis.TraceAnalysis(trace_dir=...)`` and runs:

* ``get_temporal_breakdown(visualize=False)``
* ``get_idle_time_breakdown(ranks=<all>, visualize=False, show_idle_interval_stats=True)``
* ``get_comm_comp_overlap(visualize=False)``
* ``get_gpu_kernel_breakdown(visualize=False)``

twice, each in its own subprocess: once with HTA's defaults (key ``"rounded"``: HTA
rounds fractional-microsecond timestamps, start up / end down) and once with
``HTA_DISABLE_NS_ROUNDING=1`` (key ``"exact"``). Output: one JSON file per case in
``tests/golden/hta/<subdir>__<stem>.json`` (``/`` in subdir written as ``__``), plus
``tests/golden/hta/_index.json`` listing every case and the ones HTA could not handle.

All times are microseconds (HTA works in the trace's own unit, which for Kineto JSON is
us). Percentages are exactly as HTA reports them (rounded by HTA to 2 decimals for the
temporal breakdown and overlap, 1 decimal for the kernel-type breakdown). NaN is
written as null.

Usage:
    make_hta_golden.py                 # all cases, both configurations
    make_hta_golden.py --only NAME...  # only cases whose output name contains NAME
    make_hta_golden.py --worker CASE OUT.json   # internal: one case, one configuration
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TRACES = Path(os.environ.get("SKALPEL_HTA_TRACES", "/work/shared/traces/hta"))
OUT_DIR = Path(__file__).resolve().parent / "hta"
SCRIPT_REL = "tests/golden/make_hta_golden.py"

# name -> list of trace files relative to TRACES.  "expect_gpu": False marks the
# cases that have no GPU kernels / are not Kineto traces; they are tried anyway and
# their outcome is recorded in _index.json, but no golden file is written for them.
CASES: dict[str, dict] = {}


def _case(files: list[str], name: str | None = None, expect_gpu: bool = True) -> None:
    if name is None:
        f = files[0]
        subdir, base = f.rsplit("/", 1)
        stem = re.sub(r"\.json(\.gz)?$|\.raw\.gz$", "", base)
        name = subdir.replace("/", "__") + "__" + stem
    CASES[name] = {"files": files, "expect_gpu": expect_gpu}


_case(["trace_filter/sampled_rank-0.json.gz"])
_case(["trace_filter/sampled_rank-1.json.gz"])
_case(
    ["trace_filter/sampled_rank-0.json.gz", "trace_filter/sampled_rank-1.json.gz"],
    name="trace_filter__sampled_rank-0+1",
)
_case(["trace_diff/control/control.json.gz"])
_case(["trace_diff/test/test.json.gz"])
_case(["df_index_resolver/df_index_resolver.json.gz"])
_case(["negative_queue_length_values_check/rank0.json.gz"])
_case(["nccl_parser_config/nccl_data.json.gz"])
_case(["ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"])
_case(["critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz"])
_case(["critical_path/cuda_event_sync/event_sync_trace.json.gz"])
_case(["critical_path/cuda_event_sync_multi_stream/event_sync_trace.json.gz"])
_case(["with_gpu_user_annotation/step_based_trace_2543932.json.gz"])
_case(["amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz"])
_case(["triton_example/triton_example.json.gz"])
_case(["execution_trace/benchmark_simple_add_trace.json.gz"])
# No GPU kernels or not a Kineto trace: tried, outcome recorded, no golden file.
_case(["cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"], expect_gpu=False)
_case(["mtia_inference_trace/mtia_inference_rank_0.json.gz"], expect_gpu=False)
_case(["cupti_profiler/benchmark_result_924719_1679055439_trace.json.gz"], expect_gpu=False)
_case(["execution_trace/benchmark_simple_add_et.json.gz"], expect_gpu=False)
_case(["memory_analysis/memory_timeline.raw.gz"], expect_gpu=False)

CONFIGS = {
    "rounded": {},  # HTA default
    "exact": {"HTA_DISABLE_NS_ROUNDING": "1"},
}


# --------------------------------------------------------------------------- helpers


def plain(x):
    """Convert numpy / pandas scalars and containers to plain JSON values (NaN -> None)."""
    import numpy as np

    if isinstance(x, dict):
        return {str(k): plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating, float)):
        f = float(x)
        return None if math.isnan(f) or math.isinf(f) else f
    if isinstance(x, np.bool_):
        return bool(x)
    if x is None or isinstance(x, (int, str, bool)):
        return x
    try:
        import pandas as pd

        if x is pd.NA or (not isinstance(x, str) and pd.isna(x)):
            return None
    except (TypeError, ValueError):
        pass
    return str(x)


def records(df) -> list[dict]:
    if df is None:
        return []
    return [plain(r) for r in df.to_dict(orient="records")]


def raw_file_summary(path: Path) -> dict:
    """What the raw file holds, read without HTA: its ProfilerStep#N events and its
    device-side events (args.stream present) by category."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as fh:
        data = json.loads(fh.read())
    if not isinstance(data, dict):
        return {"not_a_chrome_trace": type(data).__name__}
    if "traceEvents" not in data:
        return {"not_a_chrome_trace": "no traceEvents (keys: %s)" % sorted(data)[:8]}
    steps = []
    by_cat: dict = {}
    for ev in data.get("traceEvents", []):
        if ev.get("ph") != "X":
            continue
        m = re.match(r"ProfilerStep\s*#\s*(\d+)", str(ev.get("name", "")))
        if m:
            steps.append({"step": int(m.group(1)), "cat": ev.get("cat"),
                          "ts": ev.get("ts"), "dur": ev.get("dur")})
        args = ev.get("args") or {}
        if isinstance(args, dict) and "stream" in args:
            c = str(ev.get("cat"))
            by_cat[c] = by_cat.get(c, 0) + 1
    return {
        "profiler_steps": sorted({s["step"] for s in steps}),
        "profiler_step_events": sorted(steps, key=lambda s: (s["ts"] or 0)),
        "events_with_args_stream_by_cat": dict(sorted(by_cat.items())),
    }


# --------------------------------------------------------------------------- worker


def run_worker(case_name: str, out_path: str) -> int:
    import pandas as pd
    from hta.configs.env_options import HTAEnvOptions
    from hta.trace_analysis import TraceAnalysis
    from hta.utils.utils import get_kernel_type

    case = CASES[case_name]
    result: dict = {
        "env": {"HTA_DISABLE_NS_ROUNDING": os.environ.get("HTA_DISABLE_NS_ROUNDING")},
        "hta_disable_ns_rounding_effective": bool(
            HTAEnvOptions.instance().disable_ns_rounding()
        ),
        "worker_command": " ".join(
            ([f"HTA_DISABLE_NS_ROUNDING={os.environ['HTA_DISABLE_NS_ROUNDING']}"]
             if "HTA_DISABLE_NS_ROUNDING" in os.environ else [])
            + [shlex.quote(sys.executable), SCRIPT_REL, "--worker", case_name, "OUT.json"]
        ),
    }
    errors: dict = {}
    with tempfile.TemporaryDirectory(prefix="hta-golden-") as tmp:
        for f in case["files"]:
            src = TRACES / f
            os.symlink(src, Path(tmp) / src.name)
        t0 = time.perf_counter()
        try:
            analyzer = TraceAnalysis(trace_dir=tmp)
        except BaseException as e:  # noqa: BLE001 - we record whatever HTA raises
            errors["load"] = f"{type(e).__name__}: {e}"
            result["errors"] = errors
            Path(out_path).write_text(json.dumps(plain(result), indent=1))
            return 0
        result["load_seconds"] = round(time.perf_counter() - t0, 3)
        t = analyzer.t
        sym = t.symbol_table.get_sym_table()
        ranks = sorted(int(r) for r in t.traces.keys())
        result["ranks"] = ranks
        result["rank_files"] = {str(r): Path(p).name for r, p in t.trace_files.items()}

        # ---- what HTA's dataframe contains (after its last-step filter)
        per_rank: dict = {}
        for r in ranks:
            df = t.traces[r]
            info: dict = {"rows": int(len(df))}
            if df.empty or "stream" not in df.columns:
                info["empty"] = True
                per_rank[str(r)] = info
                continue
            names = df["name"].map(lambda i: sym[i])
            cats = df["cat"].map(lambda i: sym[i])
            step_rows = df[names.str.match(r"ProfilerStep\s*#")]
            kept: dict = {}
            for i, c in zip(step_rows["name"], cats[step_rows.index]):
                n = int(re.match(r"ProfilerStep\s*#\s*(\d+)", sym[i]).group(1))
                kept.setdefault(str(c), set()).add(n)
            # ProfilerStep#N rows left in HTA's dataframe after its last-step filter,
            # by category (user_annotation = the CPU-side step).
            info["profiler_steps_in_df"] = {c: sorted(v) for c, v in sorted(kept.items())}
            gpu = df[df["stream"].ne(-1)]
            gcats = cats[gpu.index]
            info["gpu_events_counted"] = int(len(gpu))  # stream != -1
            info["gpu_events_by_cat"] = {
                str(k): int(v) for k, v in gcats.value_counts().sort_index().items()
            }
            ktypes = gpu["name"].map(lambda i: get_kernel_type(sym[i]))
            info["gpu_events_by_kernel_type"] = {
                str(k): int(v) for k, v in ktypes.value_counts().sort_index().items()
            }
            # cuda_sync and similar non-kernel GPU rows, by name (they enter the
            # temporal breakdown's span/merge but are never COMPUTATION)
            odd = gpu[~gcats.isin(["kernel", "Kernel", "gpu_memcpy", "Memcpy",
                                   "gpu_memset", "Memset"])]
            info["non_kernel_gpu_rows_by_name"] = {
                str(k): int(v)
                for k, v in odd["name"].map(lambda i: sym[i]).value_counts().items()
            }
            # HTA's "iteration" of each counted GPU row (ProfilerStep of its launching
            # CPU event; HTA leaves it NaN for stream 0 and -1 when unknown)
            info["gpu_events_by_iteration"] = (
                {("nan" if pd.isna(k) else str(int(k))): int(v)
                 for k, v in gpu["iteration"].value_counts(dropna=False).sort_index().items()}
                if "iteration" in gpu.columns else None
            )
            if len(gpu):
                end = gpu["ts"] + gpu["dur"]
                info["window_start_us"] = plain(gpu["ts"].min() + t.min_ts)
                info["window_end_us"] = plain(end.max() + t.min_ts)
                info["gpu_sum_dur_us"] = plain(gpu["dur"].sum())
                info["ts_dtype"] = str(gpu["ts"].dtype)
            per_rank[str(r)] = info
        result["per_rank"] = per_rank

        # ---- the four analyses
        try:
            tb = analyzer.get_temporal_breakdown(visualize=False)
            result["temporal_breakdown"] = records(tb)
        except BaseException as e:  # noqa: BLE001
            errors["temporal_breakdown"] = f"{type(e).__name__}: {e}"
        try:
            idle, stats = analyzer.get_idle_time_breakdown(
                ranks=ranks, visualize=False, show_idle_interval_stats=True
            )
            result["idle_time_breakdown"] = records(idle)
            if stats is not None:
                stats = stats.reset_index()
            result["idle_interval_stats"] = records(stats)
        except BaseException as e:  # noqa: BLE001
            errors["idle_time_breakdown"] = f"{type(e).__name__}: {e}"
        try:
            ov = analyzer.get_comm_comp_overlap(visualize=False)
            result["comm_comp_overlap"] = records(ov)
        except BaseException as e:  # noqa: BLE001
            errors["comm_comp_overlap"] = f"{type(e).__name__}: {e}"
        try:
            ktype, kall = analyzer.get_gpu_kernel_breakdown(visualize=False)
            result["gpu_kernel_breakdown"] = {
                "kernel_type": records(ktype),
                "top_kernels": records(kall),
            }
        except BaseException as e:  # noqa: BLE001
            errors["gpu_kernel_breakdown"] = f"{type(e).__name__}: {e}"
    if errors:
        result["errors"] = errors
    Path(out_path).write_text(json.dumps(plain(result), indent=1))
    return 0


# --------------------------------------------------------------------------- driver


def hta_version() -> str:
    from importlib.metadata import version

    try:
        return version("traceinsight")
    except Exception:  # noqa: BLE001
        import hta

        return getattr(hta, "__version__", "unknown")


def run_case(name: str) -> dict:
    case = CASES[name]
    configs: dict = {}
    for cfg, env_add in CONFIGS.items():
        env = dict(os.environ)
        env.pop("HTA_DISABLE_NS_ROUNDING", None)
        env.update(env_add)
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tf:
            out = tf.name
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", name, out]
        t0 = time.perf_counter()
        p = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if p.returncode != 0 or not Path(out).stat().st_size:
            tail = (p.stderr or p.stdout)[-1500:]
            configs[cfg] = {"errors": {"process": f"exit {p.returncode}: {tail}"},
                            "env": env_add}
        else:
            configs[cfg] = json.loads(Path(out).read_text())
            configs[cfg]["wall_seconds"] = round(wall, 2)
        os.unlink(out)
    raw = {}
    for f in case["files"]:
        try:
            raw[f] = raw_file_summary(TRACES / f)
        except Exception as e:  # noqa: BLE001
            raw[f] = {"unreadable": f"{type(e).__name__}: {e}"}
    return {
        "case": name,
        "trace_files": case["files"],
        "traces_root": str(TRACES),
        "hta_version": hta_version(),
        "pandas_version": __import__("pandas").__version__,
        "command": f"/tmp/hta-venv/bin/python {SCRIPT_REL}",
        "configs": {k: v or {"HTA_DISABLE_NS_ROUNDING": "unset"} for k, v in CONFIGS.items()},
        "hta_calls": [
            "TraceAnalysis(trace_dir=<tmp dir with symlinks>)  # include_last_profiler_step=False",
            "get_temporal_breakdown(visualize=False)",
            "get_idle_time_breakdown(ranks=<all ranks>, visualize=False, "
            "show_idle_interval_stats=True)  # consecutive_kernel_delay=30 (us)",
            "get_comm_comp_overlap(visualize=False)",
            "get_gpu_kernel_breakdown(visualize=False)  # include_memory_kernels=True, "
            "num_kernels=10, duration_ratio=0.8",
        ],
        "raw_file": raw,
        "units": "times in microseconds; *_pctg / percentage exactly as HTA reports them",
        **configs,
    }


def summarize_ok(doc: dict) -> tuple[bool, str]:
    for cfg in CONFIGS:
        d = doc.get(cfg, {})
        if d.get("errors"):
            return False, f"{cfg}: {d['errors']}"
        if not d.get("temporal_breakdown"):
            return False, f"{cfg}: no temporal breakdown"
    return True, ""


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", nargs=2, metavar=("CASE", "OUT"))
    ap.add_argument("--only", nargs="*", default=None)
    args = ap.parse_args(argv)
    if args.worker:
        return run_worker(*args.worker)

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    index_path = OUT_DIR / "_index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {}
    index.setdefault("cases", {})
    names = [n for n in CASES if not args.only or any(s in n for s in args.only)]
    for name in names:
        t0 = time.perf_counter()
        doc = run_case(name)
        ok, why = summarize_ok(doc)
        entry = {"files": CASES[name]["files"]}
        if ok:
            (OUT_DIR / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
            entry["golden"] = f"{name}.json"
        else:
            stale = OUT_DIR / f"{name}.json"
            if stale.exists():
                stale.unlink()
            entry["skipped"] = why[:2000]
        index["cases"][name] = entry
        print(f"{name}: {'ok' if ok else 'SKIPPED'} ({time.perf_counter() - t0:.1f}s)"
              + ("" if ok else f" -- {why[:300]}"), flush=True)
    index["hta_version"] = hta_version()
    index["command"] = f"/tmp/hta-venv/bin/python {SCRIPT_REL}"
    index_path.write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
