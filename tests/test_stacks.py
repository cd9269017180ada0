"""User-code locations from Python stacks: which frames are the user's, and the innermost one around an event."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from skalpel.trace.line_samples import HEADER_KEY
from skalpel.trace.loader import load
from skalpel.trace.stacks import NO_STACKS, Locator, format_location, is_user_file, parse_frame


@pytest.mark.parametrize(
    ("path", "user"),
    [
        ("train.py", True),
        ("/home/me/project/train.py", True),
        ("mypkg/model.py", True),
        ("torch/nn/modules/module.py", False),  # shortened by the tracer
        ("/opt/conda/lib/python3.11/site-packages/torch/nn/modules/module.py", False),
        ("/usr/lib/python3/dist-packages/numpy/core.py", False),
        ("transformers/models/bert/modeling_bert.py", False),
        ("threading.py", False),  # standard library, shortened
        ("inspect.py", False),
        ("/usr/lib/python3.11/runpy.py", False),
        ("<frozen runpy>", False),
        ("<string>", False),
        ("/work/main/src/skalpel/capture/runner.py", False),  # skalpel itself
        ("/work/main/src/skalpel/watching/recorder.py", False),  # skalpel watch's capture driver
        ("skalpel/display.py", False),
        ("/home/me/skalpel/train.py", True),  # a user's folder that happens to be called skalpel
        ("/work/main/.venv/bin/skalpel", False),  # the console script that starts skalpel run
        ("/home/me/bin/skalpel.py", True),
        ("/work/main/src/skalpel/demo.py", True),  # skalpel demo's training job stands for a user's script
    ],
)
def test_is_user_file(path, user):
    assert is_user_file(path) is user


def test_every_file_of_skalpel_is_its_own_not_the_users():
    """A sync or an allocation made by skalpel (the watch capture's profiler stop, say) is never put on the user's
    code: every module of the package, as installed here, is skalpel's, but the demo's training job."""
    import skalpel

    package = Path(skalpel.__file__).parent
    files = sorted(path for path in package.rglob("*.py") if path != package / "demo.py")
    assert len(files) > 100
    assert [path for path in files if is_user_file(str(path))] == []
    assert [path for path in files if is_user_file(path.relative_to(package.parent).as_posix())] == []


def test_parse_and_format():
    assert parse_frame("train.py(42): train_step") == ("train.py", 42, "train_step")
    assert parse_frame("<built-in method item of Tensor object at 0x7f>") is None
    here = os.getcwd()
    assert format_location(os.path.join(here, "sub", "train.py"), 7, "step", cwd=here) == "sub/train.py:7 in step"
    assert format_location("/elsewhere/train.py", 7, "step", cwd=here) == "/elsewhere/train.py:7 in step"


def _trace(tmp_path, events):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return load(path)


def _x(name, cat, ts, dur, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def test_innermost_user_frame_encloses_the_event(tmp_path):
    trace = _trace(tmp_path, [
        _x("train.py(10): <module>", "python_function", 0, 1000),
        _x("train.py(20): train_step", "python_function", 100, 800),
        _x("torch/nn/modules/module.py(1739): _call_impl", "python_function", 150, 500),
        _x("aten::mm", "cpu_op", 200, 100),
        _x("aten::mm", "cpu_op", 200, 100, tid=2),  # another thread: no frames there
    ])  # fmt: skip
    locator = Locator(trace)
    ops = [index for index in range(len(trace)) if trace.name_of(index) == "aten::mm"]
    assert locator.location_of(ops[0]).startswith("train.py:20 in train_step")
    assert locator.location_of(ops[1]) is None
    assert locator.locations(ops) == ("train.py:20 in train_step",)


def test_call_stack_argument_innermost_user_frame_first(tmp_path):
    stack = "/site-packages/torch/autograd/profiler.py(611): __init__;train.py(54): step;train.py(80): <module>"
    trace = _trace(tmp_path, [_x("aten::empty", "cpu_op", 0, 10, **{"Call stack": stack})])
    assert Locator(trace).location_of(0) == "train.py:54 in step"


def test_no_stacks_says_how_to_get_them(tmp_path):
    trace = _trace(tmp_path, [_x("aten::mm", "cpu_op", 0, 10)])
    assert Locator(trace).locations([0]) == (NO_STACKS,)
    assert "with_stack=True" in NO_STACKS


def test_line_samples_name_the_statement_that_ran(tmp_path):
    """A skalpel capture's line samples (header ``skalpel_line_samples``) put the op at line 23 of train_step, where the
    samples inside it were taken, instead of its def line 20."""
    samples = {"anchor_step": 3, "anchor_us": 5000.0, "interval_us": 50,
               "samples": [[5000.0 + t, [["train.py", 20, "train_step", 23], ["train.py", 10, "<module>", 11]]]
                           for t in (210, 250, 290)]}  # fmt: skip
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({HEADER_KEY: samples, "traceEvents": [
        _x("ProfilerStep#3", "user_annotation", 0, 1000),
        _x("train.py(10): <module>", "python_function", 0, 1000),
        _x("train.py(20): train_step", "python_function", 100, 800),
        _x("aten::mm", "cpu_op", 200, 100),
    ]}))  # fmt: skip
    trace = load(path)
    ops = [index for index in range(len(trace)) if trace.name_of(index) == "aten::mm"]
    assert Locator(trace).locations(ops) == ("train.py:23 in train_step",)
