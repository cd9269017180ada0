"""A number an analysis decides with and a finding's threshold states is declared once, in analysis/options.py.

An analysis cannot import diagnose/, so such a number has two homes unless both read it from one: blame's
one_time_init and cold_start disagreed on what one-time work is the day one of two equal literals changed.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from skalpel.analysis import blame, gpu_time, onetime, options
from skalpel.diagnose import thresholds

SRC = Path(__file__).resolve().parents[1] / "src" / "skalpel"


def _analysis_numbers() -> dict[str, list[tuple[str, ast.expr | None]]]:
    """name -> (where, default) for every *Options field and every function parameter of analysis/."""
    found: dict[str, list[tuple[str, ast.expr | None]]] = {}
    for path in sorted((SRC / "analysis").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Options"):
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        found.setdefault(item.target.id, []).append((f"{path.name}:{node.name}", item.value))
            elif isinstance(node, ast.FunctionDef):
                args = node.args
                positional = args.posonlyargs + args.args
                defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
                for arg, default in [*zip(positional, defaults), *zip(args.kwonlyargs, args.kw_defaults)]:
                    found.setdefault(arg.arg, []).append((f"{path.name}:{node.name}", default))
    return found


def _threshold_params() -> list[tuple[str, str, ast.expr]]:
    """(threshold, param, value as written) for every param of diagnose/thresholds.py."""
    found = []
    for node in ast.parse((SRC / "diagnose" / "thresholds.py").read_text()).body:
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        for keyword in node.value.keywords:
            if keyword.arg == "params" and isinstance(keyword.value, ast.Tuple):
                for pair in keyword.value.elts:
                    name, value = pair.elts  # type: ignore[attr-defined]
                    found.append((node.targets[0].id, name.value, value))  # type: ignore[attr-defined]
    return found


def _is_literal(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, (int, float))


def test_a_threshold_param_an_analysis_decides_with_is_read_from_analysis_options():
    analysis = _analysis_numbers()
    shared = [(threshold, name, value) for threshold, name, value in _threshold_params() if name in analysis]
    assert {name for _, name, _ in shared} >= {"first_call_ratio", "min_event_ms", "min_call_ratio"}
    for threshold, name, value in shared:
        assert not _is_literal(value), f"thresholds.{threshold} declares {name} again: read it from analysis/options.py"
        for where, default in analysis[name]:
            assert not _is_literal(default), f"{where} declares {name} again: read it from analysis/options.py"


def test_the_options_the_analyses_run_with_are_the_thresholds_numbers():
    cold_start = dict(thresholds.COLD_START.params)
    defaults = onetime.OneTimeOptions()
    assert (defaults.first_call_ratio, defaults.min_event_ms) == (cold_start["first_call_ratio"], cold_start["min_event_ms"])
    assert thresholds.STRAGGLER_RANK.param("min_call_ratio") == options.MIN_CALL_RATIO


def test_one_option_in_several_analyses_has_one_name_and_one_declaration():
    """HTA's consecutive-kernel delay: blame's dispatch and gpu_time's kernel wait are the same 30 us."""
    waits = {cls.__name__: {f.name: f.default for f in dataclasses.fields(cls)} for cls in (blame.BlameOptions, gpu_time.GpuTimeOptions)}
    assert all(fields.get("kernel_wait_us") == options.KERNEL_WAIT_US for fields in waits.values()), waits
    for name, places in _analysis_numbers().items():
        options_fields = [(where, default) for where, default in places if "Options" in where]
        if len(options_fields) > 1:
            assert not any(_is_literal(default) for _, default in options_fields), f"{name} declared in {options_fields}"
