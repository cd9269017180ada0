"""The module tree's times against a hand measurement of the same modules in the same run (issue 37).

For each look-alike (examples/scenarios/module_transformer.py, module_cnn.py) a wrapper script times
every module's forward by hand: global forward pre- and post-hooks around ``time.perf_counter``,
torch.set_num_threads(1) (the scripts set it), the module named as torch.profiler names it (``Class_N``,
numbered per class in the order of first call). The wrapper runs under ``skalpel run``, so the hand
timer and the trace see the same executions: the hand figure is the mean ms per step over the steps
the profiler recorded (``torch._C._autograd._profiler_enabled()`` at the step's first module call),
skalpel's is the module tree of report.json (ms per step over the same steps). On these shared
2-core machines a run without the profiler differs from a run with it by more than the load's noise
allows comparing (the same forward measured 19 and 24 ms in two plain runs a minute apart), so the
comparison is within one run. ``--rounds`` repeats the whole and prints each round.

    PYTHONPATH=src .venv/bin/python benchmarks/module_times.py [--steps 12] [--rounds 2] [--only cnn]
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ("examples/scenarios/module_transformer.py", "examples/scenarios/module_cnn.py")
SHOWN = 6
_WRAPPER = """
import json, sys
sys.path.insert(0, {bench!r})
import module_times
json.dump(module_times.hand_times({script!r}, {steps}), open({out!r}, "w"))
"""


def hand_times(script: str, steps: int) -> dict[str, float]:
    """Mean forward ms per recorded step of each module (all steps when nothing records), from hooks and a timer."""
    import torch
    import torch.optim.optimizer as optimizer_hooks
    from torch.nn.modules import module as module_hooks

    starts: dict[int, list[float]] = defaultdict(list)
    per_step: list[tuple[bool, dict[str, float]]] = []
    names: dict[int, str] = {}
    counters: dict[str, int] = defaultdict(int)
    current: dict[str, float] = defaultdict(float)
    recording = [False]

    def before(module, args):
        if id(module) not in names:
            cls = type(module).__name__
            names[id(module)] = f"{cls}_{counters[cls]}"
            counters[cls] += 1
        if not current and not any(starts.values()):  # the step's first module call
            recording[0] = torch._C._autograd._profiler_enabled()
        starts[id(module)].append(time.perf_counter())

    def after(module, args, output):
        current[names[id(module)]] += (time.perf_counter() - starts[id(module)].pop()) * 1000.0

    def step_hook(optimizer, args, kwargs):
        per_step.append((recording[0], dict(current)))
        current.clear()

    handles = [module_hooks.register_module_forward_pre_hook(before),
               module_hooks.register_module_forward_hook(after),
               optimizer_hooks.register_optimizer_step_post_hook(step_hook)]  # fmt: skip
    os.environ["MODULE_STEPS"] = str(steps)
    try:
        runpy.run_path(str(ROOT / script), run_name="__main__")
    finally:
        for handle in handles:
            handle.remove()
    chosen = [values for recorded, values in per_step if recorded] or [values for _, values in per_step]
    return {name: sum(step.get(name, 0.0) for step in chosen) / len(chosen) for name in chosen[0]}


def one_round(script: str, steps: int) -> tuple[dict[str, float], dict[str, float], dict]:
    """(skalpel's ms per step by module name, the hand timer's, the report's modules section) of one skalpel run."""
    with tempfile.TemporaryDirectory() as folder:
        wrapper, out = Path(folder) / f"hand_{Path(script).stem}.py", Path(folder) / "hand.json"
        wrapper.write_text(_WRAPPER.format(bench=str(ROOT / "benchmarks"), script=script, steps=steps, out=str(out)))
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        subprocess.run([sys.executable, "-m", "skalpel", "run", "--out", f"{folder}/run", str(wrapper)], cwd=ROOT,
                       env=env, check=True, capture_output=True)  # fmt: skip
        report = json.loads(Path(f"{folder}/run/report.json").read_text())
        hand = json.loads(out.read_text())
    modules = report["ranks"][0]["extra"]["modules"]
    return {node["path"][-1]: node["host_ms"] for node in modules["nodes"]}, hand, modules


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--only", choices=("transformer", "cnn"))
    args = parser.parse_args()
    for script in SCRIPTS:
        if args.only and args.only not in script:
            continue
        for round_number in range(args.rounds):
            profiled, hand, summary = one_round(script, args.steps)
            root = max(profiled, key=profiled.get)
            print(f"{script} round {round_number + 1}: {summary['unit_ms']:.1f} ms/step, outermost modules "
                  f"{summary['host_ms']:.1f}, outside any module {summary['host_unattributed_ms']:.1f} "
                  f"({100 * summary['host_unattributed_ms'] / summary['unit_ms']:.0f}%)")  # fmt: skip
            print(f"  {'module':<20} {'skalpel ms':>10} {'hand ms':>9} {'ratio':>6} {'share sk':>9} {'share hand':>10}")
            for name in sorted(profiled, key=profiled.get, reverse=True)[:SHOWN]:
                if name not in hand:
                    continue
                share_sk, share_hand = profiled[name] / profiled[root], hand[name] / hand[root]
                print(f"  {name:<20} {profiled[name]:>10.2f} {hand[name]:>9.2f} {profiled[name] / hand[name]:>6.3f} "
                      f"{share_sk:>9.3f} {share_hand:>10.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
