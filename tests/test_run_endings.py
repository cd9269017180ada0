"""`skalpel run` ends the process as the script alone would, and never crashes at its end: threads still in torch
when the main thread ends (daemon or not), the script's exit handlers, ``os._exit``, ``sys.exit`` in a thread.
Each through the real command, on a main thread that trains 14 steps (capture/exits.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from skalpel.result.report import Report

pytestmark = pytest.mark.slow

# The main thread trains 14 steps (enough for the default window and its baseline); a second thread, if any,
# steps an optimizer of its own until its seconds have passed, or the main thread's once that one has trained (at
# once, the two would race on the same parameters: autograd's in-place check fails the script, alone too).
TRAIN = """
import atexit, os, sys, threading, time
import torch

torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)


trained = threading.Event()


def side(seconds, same=False, then=None):
    if same:
        trained.wait()
    side_model = model if same else torch.nn.Linear(32, 32)
    side_optimizer = optimizer if same else torch.optim.SGD(side_model.parameters(), lr=0.01)
    inputs = 64 if same else 32
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        side_optimizer.zero_grad()
        side_model(torch.randn(16, inputs)).sum().backward()
        side_optimizer.step()
    print("side done", flush=True)
    if then is not None:
        then()


def train():
    for _ in range(14):
        optimizer.zero_grad()
        model(torch.randn(32, 64)).sum().backward()
        optimizer.step()
    print("main done", flush=True)
    trained.set()
"""


def _run(tmp_path: Path, body: str) -> tuple[subprocess.CompletedProcess, Path]:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TRAIN) + textwrap.dedent(body))
    out = tmp_path / "run"
    command = [sys.executable, "-m", "skalpel", "run", "--out", str(out), str(script)]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    # the report's "wrote <path>" lines wrap at the terminal's width, inside a long temporary path: read them whole
    result.stdout = result.stdout.replace("\n", "")
    return result, out


def _report(out: Path) -> Report:
    return Report.from_json((out / "report.json").read_bytes())


@pytest.mark.parametrize("same", [False, True], ids=["own-optimizer", "same-optimizer"])
def test_a_daemon_thread_still_in_torch_ends_with_the_scripts_status_and_the_main_threads_report(
    tmp_path: Path, same: bool
) -> None:
    result, out = _run(
        tmp_path,
        f"""
        atexit.register(lambda: print("script atexit ran", flush=True))
        log = open("left-open.log", "w")  # never closed: the interpreter's teardown would flush it
        log.write("written before the end\\n")
        threading.Thread(target=side, args=(60.0, {same}), daemon=True, name="side").start()
        train()
        """,
    )
    assert "terminate called" not in result.stderr and "Warning" not in result.stderr, result.stderr
    assert result.returncode == 0, result.stderr
    report = _report(out)
    assert report.steps.count == 5 and report.capture.exit_status == 0
    if not same:  # stepping all along, in the recorded steps too: said, and not taken for the main thread's steps
        assert any("came from thread 'side'" in warning for warning in report.warnings)
    assert "side done" not in result.stdout  # the daemon died with the process: nobody waited its 60 s
    assert result.stdout.index("summary.txt") < result.stdout.index("script atexit ran")  # after the report
    assert (tmp_path / "left-open.log").read_text() == "written before the end\n"


def test_a_non_daemon_thread_is_waited_for_and_its_sys_exit_leaves_the_status_as_python_does(tmp_path: Path) -> None:
    result, out = _run(
        tmp_path,
        """
        atexit.register(lambda: print("script atexit ran", flush=True))
        threading.Thread(target=side, args=(4.0, False, lambda: sys.exit(4)), name="side").start()
        train()
        """,
    )
    assert result.returncode == 0, result.stderr  # sys.exit in a thread ends that thread only
    assert "terminate called" not in result.stderr and "Traceback" not in result.stderr
    assert result.stdout.index("side done") < result.stdout.index("script atexit ran")  # waited, then the handlers
    report = _report(out)
    assert report.steps.count == 5 and report.capture.exit_status == 0


def test_os_exit_after_training_writes_the_run_first_and_keeps_the_status(tmp_path: Path) -> None:
    result, out = _run(
        tmp_path,
        """
        atexit.register(lambda: print("script atexit ran", flush=True))
        try:
            train()
            os._exit(3)
        finally:
            print("finally ran", flush=True)
        print("after os._exit", flush=True)
        """,
    )
    assert result.returncode == 3, result.stderr
    report = _report(out)
    assert report.steps.count == 5 and report.capture.exit_status == 3
    assert any("os._exit(3)" in warning for warning in report.warnings)
    assert (out / "summary.txt").is_file() and (out / "trace-rank0.json.gz").is_file()
    assert "main done" in result.stdout and "summary.txt" in result.stdout  # the report was shown before the end
    for skipped in ("finally ran", "after os._exit", "script atexit ran"):  # os._exit skips them, as without skalpel
        assert skipped not in result.stdout


def test_a_plain_script_ends_as_before_with_its_handlers_and_the_interpreters_teardown(tmp_path: Path) -> None:
    result, out = _run(
        tmp_path,
        """
        class Marker:
            def __del__(self, write=os.write):
                write(1, b"teardown ran\\n")

        sys.skalpel_test_marker = Marker()  # freed by the interpreter's teardown only
        atexit.register(lambda: print("script atexit ran", flush=True))
        train()
        """,
    )
    assert result.returncode == 0, result.stderr
    report = _report(out)
    assert report.steps.count == 5 and report.capture.exit_status == 0
    assert not any("thread" in warning or "os._exit" in warning for warning in report.warnings)
    assert result.stdout.index("summary.txt") < result.stdout.index("script atexit ran")
    assert result.stdout.index("script atexit ran") < result.stdout.index("teardown ran")  # the usual exit, whole


def test_files_are_flushed_past_a_dead_weak_proxy_at_the_end(tmp_path: Path) -> None:
    """torch.compile leaves dead ``weakref.proxy`` objects behind, and ``isinstance`` on one raises ReferenceError:
    the end's flush of the script's open files steps over them (two compiled scenarios exited 1 there) and still
    flushes the file the script left open."""
    import weakref

    from skalpel.capture import exits

    class Held:
        pass

    held = Held()
    proxy = weakref.proxy(held)
    del held
    left_open = open(tmp_path / "log.txt", "w")  # left open on purpose, as a script would
    left_open.write("buffered")
    exits._flush_files()
    assert (tmp_path / "log.txt").read_text() == "buffered"
    with pytest.raises(ReferenceError):
        isinstance(proxy, int)  # the proxy is dead and in gc's view: the case above met it
    left_open.close()
