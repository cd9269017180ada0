"""`skalpel run` loses nothing and crashes on nothing: signals, the script's own profiler, threads,
forks, a changed directory, runs started together, a full disk. Each through the real command."""

from __future__ import annotations

import gzip
import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from skalpel.result.report import Report

pytestmark = pytest.mark.slow

# A small training loop; with a marker path as argv[1] it writes that file at step 6 (inside the
# recorded window of --wait 1 --warmup 1) and keeps stepping slowly, waiting to be signalled.
LOOP = """
import os, signal, sys, time
import torch

torch.set_num_threads(1)
model = torch.nn.Linear(16, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
MARKER = sys.argv[1] if len(sys.argv) > 1 else None
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 400


def train_step():
    optimizer.zero_grad()
    model(torch.randn(8, 16)).sum().backward()
    optimizer.step()


def loop():
    for step in range(STEPS):
        train_step()
        if MARKER and step == 6:
            open(MARKER, "w").close()
        if MARKER:
            time.sleep(0.02)
"""


def _script(tmp_path: Path, body: str, name: str = "train.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(LOOP) + textwrap.dedent(body))
    return path


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "skalpel", "run", *args]


def _skalpel(*args: str, cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(_command(*args), cwd=cwd, capture_output=True, text=True, timeout=300, **kwargs)


def _signal_in_window(tmp_path: Path, script: Path, out: Path, *signums: int,
                      between: str | None = None) -> subprocess.CompletedProcess:  # fmt: skip
    """Start the run, wait until the script is inside the recorded window, send ``signums``; with ``between``,
    wait before each next signal until the script has written the marker path with that suffix."""
    marker = tmp_path / "in-window"
    args = _command("--out", str(out), "--wait", "1", "--warmup", "1", "--active", "200", str(script), str(marker))
    process = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), "the script never reached its recorded window"
    for number, signum in enumerate(signums):
        if number and between:
            ready = marker.with_name(marker.name + between)
            deadline = time.monotonic() + 120  # generous: only a hang reaches it
            while not ready.exists() and process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)
        process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=300)
    return subprocess.CompletedProcess(args, process.returncode, stdout, stderr)


def _steps_in(trace_file: Path) -> int:
    events = json.loads(gzip.decompress(trace_file.read_bytes()))["traceEvents"]
    return sum(1 for event in events if str(event.get("name", "")).startswith("ProfilerStep#"))


def _no_partial_files(folder: Path) -> None:
    assert not [path.name for path in folder.iterdir() if path.name.startswith("partial-")]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_or_sighup_inside_the_recorded_window_keeps_the_trace(tmp_path: Path, signum: int) -> None:
    script = _script(tmp_path, "loop()\nprint('never reached')\n")
    out = tmp_path / "run"
    result = _signal_in_window(tmp_path, script, out, signum)
    assert result.returncode == 128 + signum, result.stderr
    assert "never reached" not in result.stdout
    assert f"stopped by {signal.Signals(signum).name}" in result.stderr and "Traceback" not in result.stderr
    recorded = _steps_in(out / "trace-rank0.json.gz")
    assert 1 <= recorded < 200  # the window was cut short; what it recorded is there
    report = Report.from_json((out / "report.json").read_bytes())
    assert report.capture is not None and report.capture.exit_status == 128 + signum
    summary = (out / "summary.txt").read_text()
    assert f"{signal.Signals(signum).name} arrived after" in summary.replace("\n", " ")
    _no_partial_files(out)


def test_sigterm_after_the_script_ended_keeps_the_trace_and_says_what_the_folder_holds(tmp_path: Path) -> None:
    # The script ends; the signal lands while skalpel writes the trace or analyses it.
    script = _script(tmp_path, "loop()\nprint('script done', flush=True)\n")
    out = tmp_path / "run"
    args = _command("--out", str(out), "--warmup", "1", "--active", "60", str(script), "", "70")
    process = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None and "script done" in process.stdout.readline()
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 143, stderr
    assert "Traceback" not in stderr
    _no_partial_files(out)
    assert _steps_in(out / "trace-rank0.json.gz") == 60
    if not (out / "summary.txt").exists():  # the analysis was cut short: the message says what is there
        said = stderr.replace("\n", " ")
        assert "holds trace-rank0.json.gz" in said and f"skalpel analyze {out}" in said


def test_two_fast_ctrl_c_leave_a_readable_trace(tmp_path: Path) -> None:
    """The second Ctrl-C comes as soon as the first has unwound the script (its ``finally`` writes a marker):
    it lands while skalpel writes the trace, analyses it, or says what it did; the exit status stays 130."""
    script = _script(tmp_path, "try:\n    loop()\nfinally:\n    open(MARKER + '.unwound', 'w').close()\n")
    out = tmp_path / "run"
    result = _signal_in_window(tmp_path, script, out, signal.SIGINT, signal.SIGINT, between=".unwound")
    assert result.returncode == 130, result.stderr
    _no_partial_files(out)
    assert _steps_in(out / "trace-rank0.json.gz") >= 1  # a whole gzip file whatever the second Ctrl-C hit
    assert "Traceback" not in result.stderr.split("KeyboardInterrupt")[-1]  # skalpel's own code shows none


CAUGHT_IN_EXEC = """
import sys

from skalpel import cli

real_main = cli.main


def main(argv=None):
    code = real_main(argv)
    try:
        exec("raise KeyboardInterrupt")  # a Ctrl-C in code built from a string (a dataclass in a lazy import)
    except KeyboardInterrupt:
        pass  # caught, as skalpel catches one in the analysis
    return code


cli.main = main
sys.argv = ["skalpel", "explain", "no_such_finding"]
cli.entry()
"""


def test_a_caught_ctrl_c_does_not_end_the_process_by_sigint(tmp_path: Path) -> None:
    """The cause of the rare -2 after a second Ctrl-C: CPython kills itself with SIGINT at exit when a
    KeyboardInterrupt once left exec'd code, however it was caught; skalpel's exit status must stand."""
    (tmp_path / "caught_in_exec.py").write_text(CAUGHT_IN_EXEC)
    done = subprocess.run([sys.executable, "-m", "caught_in_exec"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 2 and "unknown finding id" in done.stderr, (done.returncode, done.stderr)


def test_script_with_its_own_sigterm_handler_keeps_its_exit_status_and_the_trace(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        """
        def on_term(signum, frame):
            print("checkpoint saved")
            sys.exit(7)

        signal.signal(signal.SIGTERM, on_term)
        loop()
        """,
    )
    out = tmp_path / "run"
    result = _signal_in_window(tmp_path, script, out, signal.SIGTERM)
    assert result.returncode == 7, result.stderr
    assert "checkpoint saved" in result.stdout
    assert _steps_in(out / "trace-rank0.json.gz") >= 1
    assert "handled by the script's own handler" in (out / "summary.txt").read_text().replace("\n", " ")


def test_script_starting_torch_profiler_itself_is_not_crashed(tmp_path: Path) -> None:
    # skalpel's window (wait 1, warm-up 1, active 5) is open when the script opens its own profiler.
    script = _script(
        tmp_path,
        """
        for _ in range(4):
            train_step()
        with torch.profiler.profile() as own:
            for _ in range(5):
                train_step()
        own.export_chrome_trace("own-trace.json")
        for _ in range(10):
            train_step()
        print("script finished")
        """,
    )
    out = tmp_path / "run"
    result = _skalpel("--out", str(out), "--wait", "1", "--warmup", "1", str(script), cwd=tmp_path)
    assert result.returncode == 0, result.stderr  # no segfault (-11)
    assert "script finished" in result.stdout and (tmp_path / "own-trace.json").is_file()
    summary = (out / "summary.txt").read_text().replace("\n", " ")
    assert "starts torch.profiler itself (train.py:" in summary and "skalpel stopped its own capture" in summary
    assert 1 <= _steps_in(out / "trace-rank0.json.gz") <= 3  # the steps recorded before it


def test_script_profiling_before_any_recorded_step_gets_no_folder_and_a_clear_message(tmp_path: Path) -> None:
    script = _script(tmp_path, "with torch.profiler.profile():\n    loop()\nprint('script finished')\n")
    out = tmp_path / "run"
    result = _skalpel("--out", str(out), str(script), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "script finished" in result.stdout
    assert "starts torch.profiler itself (train.py:" in result.stderr and "stepped aside" in result.stderr
    assert "removed the empty run folder" in result.stderr and not out.exists()


def test_optimizer_steps_in_a_second_thread_are_not_marked(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        """
        import threading
        ema = torch.nn.Linear(16, 4)
        ema_optimizer = torch.optim.SGD(ema.parameters(), lr=0.01)

        def background():
            for _ in range(40):
                ema_optimizer.zero_grad()
                ema(torch.randn(8, 16)).sum().backward()
                ema_optimizer.step()

        worker = threading.Thread(target=background, name="ema-updater")
        worker.start()
        loop()
        worker.join()
        print("script finished")
        """,
    )
    out = tmp_path / "run"
    result = _skalpel("--out", str(out), "--warmup", "1", "--active", "3", str(script), "", "40", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "script finished" in result.stdout
    assert _steps_in(out / "trace-rank0.json.gz") == 3
    summary = " ".join((out / "summary.txt").read_text().split())  # the summary wraps its lines
    assert "came from thread 'ema-updater'" in summary and "main thread only" in summary


def test_fork_and_chdir_keep_the_folder_the_trace_and_the_exit_status(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        """
        import multiprocessing
        os.makedirs("elsewhere", exist_ok=True)
        os.chdir("elsewhere")
        pid = os.fork()
        if pid == 0:
            for _ in range(12):  # optimizer steps in the child must not drive the parent's profiler
                train_step()
            sys.exit(3)
        os.waitpid(pid, 0)
        worker = multiprocessing.get_context("fork").Process(target=loop)
        worker.start()
        worker.join()
        loop()
        print("parent finished in", os.path.basename(os.getcwd()))
        sys.exit(5)
        """,
    )
    result = _skalpel("--wait", "1", "--warmup", "1", "--active", "3", str(script), "", "30", cwd=tmp_path)
    assert result.returncode == 5, result.stderr
    assert "parent finished in elsewhere" in result.stdout
    assert "forked by" in result.stderr and "exit status 3" in result.stderr  # the child says what it was
    folders = list((tmp_path / "skalpel-runs").iterdir())  # under the directory skalpel started in
    assert len(folders) == 1 and not (tmp_path / "elsewhere" / "skalpel-runs").exists()
    assert _steps_in(folders[0] / "trace-rank0.json.gz") == 3
    assert str(folders[0] / "summary.txt") in result.stdout.replace("\n", "")  # the path printed is the real one
    assert Report.from_json((folders[0] / "report.json").read_bytes()).capture.exit_status == 5


def test_two_runs_started_together_get_a_folder_each(tmp_path: Path) -> None:
    script = _script(tmp_path, "loop()\n")
    args = _command("--warmup", "1", "--active", "2", "--name", "same", str(script), "", "12")
    runs = [subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for run in runs:
        _, stderr = run.communicate(timeout=300)
        assert run.returncode == 0, stderr
    folders = sorted((tmp_path / "skalpel-runs").iterdir())
    assert len(folders) == 2
    assert all(_steps_in(folder / "trace-rank0.json.gz") == 2 for folder in folders)


def _file_size_limit(limit: int):
    def limit_writes() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return limit_writes


def test_full_disk_during_the_export_says_so(tmp_path: Path) -> None:
    script = _script(tmp_path, "loop()\nprint('script finished')\n")
    out = tmp_path / "run"
    result = _skalpel(
        "--out", str(out), "--warmup", "1", "--active", "3", str(script), "", "12",
        cwd=tmp_path, preexec_fn=_file_size_limit(64 * 1024),
    )  # fmt: skip
    assert "script finished" in result.stdout
    assert result.returncode == 2, result.stderr
    assert "disk full" in result.stderr and "part of the 3 recorded step(s)" in result.stderr
    assert "no step was recorded" not in result.stderr and "Traceback" not in result.stderr
    _no_partial_files(out)
    kept = out / "trace-rank0.truncated.json"  # what the profiler wrote before the limit, named as such
    assert kept.is_file() and 0 < kept.stat().st_size <= 64 * 1024 and str(kept) in result.stderr.replace("\n", "")


def test_kineto_chatter_is_filtered_real_errors_kept_and_long_captures_bounded(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        """
        loop()
        os.write(2, b"USDT: a line the filter drops\\n")
        os.write(2, b"ERROR: a real error the filter keeps\\n")
        """,
    )
    out = tmp_path / "run"
    # A stacks budget this small makes the 12-step window a "long capture": stacks for its first 10 steps.
    result = _skalpel("--out", str(out), "--warmup", "1", "--active", "12", str(script), "", "20", cwd=tmp_path,
                      env=dict(os.environ, SKALPEL_STACKS_BUDGET_MB="0.01"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "USDT" not in result.stderr and "Memory block of unknown size" not in result.stderr
    assert "ERROR: a real error the filter keeps" in result.stderr
    header = next(line for line in result.stderr.splitlines() if line.startswith("skalpel: profiling"))
    assert header.endswith(": 1 wait + 1 warm-up + 12 active steps")
    summary = (out / "summary.txt").read_text()
    assert "capture: 1 wait + 1 warm-up + 12 active steps" in summary
    assert "Python stacks kept for the first 10 of 12 recorded steps" in summary.replace("\n", " ")
    assert _steps_in(out / "trace-rank0.json.gz") == 12


def test_a_crashing_script_still_shows_its_last_words_through_the_filter(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        """
        import ctypes
        loop()
        os.write(2, b"last words before the crash\\n")
        ctypes.string_at(0)  # a segfault: the process dies at once
        """,
    )
    result = _skalpel("--out", str(tmp_path / "run"), "--warmup", "1", "--active", "2", str(script), "", "8", cwd=tmp_path)
    assert result.returncode == -signal.SIGSEGV
    assert "last words before the crash" in result.stderr  # the filter outlives the process and drains the pipe


# Steps of very many ops (an LSTM cell unrolled over 150 time steps, LBFGS running the closure twice per
# optimizer step: ~40,000 ops with their stacks): the shape of a real example whose profiler grew to 24 GB in three steps and was killed.
MANY_OPS = """
import torch

torch.manual_seed(0)
torch.set_num_threads(1)
cell, head = torch.nn.LSTMCell(4, 8), torch.nn.Linear(8, 1)
optimizer = torch.optim.LBFGS(list(cell.parameters()) + list(head.parameters()), lr=0.1, max_iter=2)
x = torch.randn(2, 300, 4)  # about 17 MiB the profiler holds a step: the 24 MiB budget trips in step 2 of 5
for step in range(10):
    def closure():
        optimizer.zero_grad()
        h = c = torch.zeros(2, 8)
        for t in range(x.shape[1]):
            h, c = cell(x[:, t], (h, c))
        loss = head(h).pow(2).mean()
        loss.backward()
        return loss
    optimizer.step(closure)
print("script done", step)
"""


def test_a_recording_past_its_memory_budget_stops_early_and_keeps_what_it_has(tmp_path: Path) -> None:
    script = tmp_path / "many_ops.py"
    script.write_text(textwrap.dedent(MANY_OPS))
    out = tmp_path / "run"
    # About 41 MiB a step with everything on (torch 2.13), past 1.5 budgets: the window is recorded again lighter
    # (test_capture_long_steps), and that one stops early.
    result = _skalpel("--out", str(out), "--warmup", "1", "--active", "5", str(script), cwd=tmp_path,
                      env=dict(os.environ, SKALPEL_RECORD_BUDGET_MB="24"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "script done 9" in result.stdout  # the script ran on to its end, un-profiled
    assert "recording stopped early" in result.stderr and "(budget 24 MiB, $SKALPEL_RECORD_BUDGET_MB" in result.stderr
    report = Report.from_json((out / "report.json").read_bytes())
    assert any("recording stopped early" in warning for warning in report.warnings)
    assert report.steps.count >= 1 and (out / "trace-rank0.json.gz").is_file()
    # The look-alike: an ordinary loop under the default budget records its whole window.
    quiet = _skalpel("--out", str(tmp_path / "quiet"), "--warmup", "1", "--active", "3",
                     str(_script(tmp_path, "loop()\n")), "", "12", cwd=tmp_path)  # fmt: skip
    assert quiet.returncode == 0 and "stopped early" not in quiet.stderr
    assert Report.from_json((tmp_path / "quiet" / "report.json").read_bytes()).capture.active_steps == 3
