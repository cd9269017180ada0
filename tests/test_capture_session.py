"""skalpel.profile() in-process, the step clock, and `skalpel run` options and bad input (via cli.main)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import skalpel
from skalpel.capture import runfolder
from skalpel.capture.settings import CaptureSettings
from skalpel.capture.timing import step_timing
from skalpel.cli import main
from skalpel.errors import SkalpelError

pytestmark = pytest.mark.slow  # most tests here start a `skalpel run` or skalpel.profile() (README: "not slow" skips them)
torch.set_num_threads(1)


def _loop(run, steps: int, *, stop_at: int | None = None) -> None:
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(steps):
        if step == stop_at:
            break
        loss = model(torch.randn(4, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        run.step()


def _step_names(path: Path) -> list[str]:
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    return [event["name"] for event in events if event.get("name", "").startswith("ProfilerStep#")]


def test_profile_records_the_active_steps_and_measures_overhead(tmp_path: Path) -> None:
    with skalpel.profile(warmup=1, active=3, out=tmp_path / "run", name="unit") as run:
        _loop(run, 8)
    assert run.trace_paths == [tmp_path / "run" / "trace-rank0.json.gz"]
    assert len(_step_names(run.trace_paths[0])) == 3
    report = run.report()
    assert report.steps.count == 3
    capture = report.capture
    assert capture is not None and capture.active_steps == 3 and capture.warmup_steps == 2
    assert capture.overhead_pct is not None and capture.unprofiled_step_ms > 0
    assert {path.name for path in run.written} >= {"flamegraph.svg", "summary.txt", "report.json"}


def test_profile_in_process_filters_kineto_chatter_and_keeps_real_errors(tmp_path: Path) -> None:
    """skalpel.profile() in the user's own process: no `USDT: profiler_start` lines, their own stderr intact."""
    script = tmp_path / "loop.py"
    script.write_text(textwrap.dedent(f"""
        import os, torch, skalpel
        model = torch.nn.Linear(8, 1)
        with skalpel.profile(out={str(tmp_path / "run")!r}, warmup=1, active=3) as run:
            for _ in range(6):
                model(torch.randn(4, 8)).sum().backward()
                run.step()
            os.write(2, b"ERROR: the user's own error line\\n")
        print("done", flush=True)
    """))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "done"
    assert "USDT" not in result.stderr and "Memory block of unknown size" not in result.stderr
    assert "ERROR: the user's own error line" in result.stderr
    assert (tmp_path / "run" / "trace-rank0.json.gz").is_file()


def test_profile_in_process_stops_recording_past_its_memory_budget(tmp_path: Path) -> None:
    """Steps of tens of thousands of ops under a 16 MiB budget: the window ends at a run.step(), whole steps kept.

    In a fresh process: the budget reads resident memory, which a long-lived test process's freed heap absorbs."""
    script = tmp_path / "lstm.py"
    script.write_text(textwrap.dedent(f"""
        import torch, skalpel
        torch.set_num_threads(1)
        cell, head = torch.nn.LSTMCell(4, 8), torch.nn.Linear(8, 1)
        x = torch.randn(2, 450, 4)  # several MiB the profiler holds a step: the budget trips well inside the 8
        with skalpel.profile(out={str(tmp_path / "run")!r}, warmup=1, active=8) as run:
            for _ in range(14):
                h = c = torch.zeros(2, 8)
                for t in range(x.shape[1]):
                    h, c = cell(x[:, t], (h, c))
                head(h).pow(2).mean().backward()
                run.step()
        print("recorded", run.recorded_steps, run.report().steps.count, flush=True)
    """))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, OMP_NUM_THREADS="1", SKALPEL_RECORD_BUDGET_MB="16"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "recording stopped early" in result.stderr and "(budget 16 MiB, $SKALPEL_RECORD_BUDGET_MB)" in result.stderr
    assert "cut where" not in result.stderr  # stopped at a run.step(): whole steps only
    _, recorded, in_report = result.stdout.split()
    assert 1 <= int(recorded) < 8 and int(in_report) == int(recorded)
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert any("recording stopped early" in warning for warning in report["warnings"])
    # The look-alike: a small loop under the default budget records its whole window.
    with skalpel.profile(out=tmp_path / "quiet", warmup=1, active=3) as quiet:
        _loop(quiet, 8)
    assert not [w for w in quiet.report().warnings if "stopped early" in w] and quiet.recorded_steps == 3


def test_leaving_early_still_yields_what_was_recorded(tmp_path: Path) -> None:
    with skalpel.profile(warmup=1, active=5, out=tmp_path) as run:
        _loop(run, 20, stop_at=4)  # steps 0 (wait) and 1 (warm-up) un-profiled; 2 and 3 recorded
    assert 2 <= run.report().steps.count <= 3


def test_no_recorded_step_is_a_clear_error(tmp_path: Path) -> None:
    with skalpel.profile(out=tmp_path) as run:
        _loop(run, 2)
    with pytest.raises(SkalpelError, match="only 2 step"):
        run.report()


def test_repeat_two_records_two_windows_and_reports_noise(tmp_path: Path) -> None:
    with skalpel.profile(wait=0, warmup=1, active=2, repeat=2, out=tmp_path, write=False) as run:
        _loop(run, 10)
    capture = run.report().capture
    assert len(capture.window_medians_ms) == 2
    assert capture.noise_pct is not None and capture.noise_pct >= 0
    assert len(run.trace_paths) == 1  # the report comes from the first window


def test_step_timing_overhead_and_noise() -> None:
    settings = CaptureSettings(wait=1, warmup=1, active=2, repeat=2)
    # steps: 0 wait, 1 warm-up, 2-3 active (window 0); 4 wait, 5 warm-up, 6-7 active (window 1); 8 after
    seconds = [0.010, 0.010, 0.012, 0.012, 0.010, 0.010, 0.018, 0.018, 0.5]
    timing = step_timing(list(enumerate(seconds)), settings)
    assert timing["unprofiled_step_ms"] == pytest.approx(10.0)
    assert timing["window_medians_ms"] == (12.0, 18.0)
    assert timing["overhead_pct"] == pytest.approx(50.0)  # median of 12, 12, 18, 18 is 15
    assert timing["noise_pct"] == pytest.approx(40.0)  # (18 - 12) / 15


def test_settings_reject_nonsense() -> None:
    with pytest.raises(SkalpelError, match="active must be at least 1"):
        CaptureSettings(active=0)


# ---- skalpel run in-process (cli.main), bad input ------------------------------------------

TRAIN = """
import torch
torch.set_num_threads(1)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.TensorDataset(torch.randn(STEPS * 2, 4), torch.randn(STEPS * 2, 1))
for x, y in torch.utils.data.DataLoader(data, batch_size=2):
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
print("reached the end")
"""


def _write(path: Path, source: str) -> Path:
    path.write_text(textwrap.dedent(source))
    return path


def _run(capsys, *args: str) -> tuple[int, str, str]:
    status = main(["run", *args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def _one_line_error(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("skalpel: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_missing_script(tmp_path: Path, capsys) -> None:
    status, _, err = _run(capsys, str(tmp_path / "nope.py"))
    assert status == 2 and "no such script" in _one_line_error(err)


def test_syntax_error(tmp_path: Path, capsys) -> None:
    script = _write(tmp_path / "bad.py", "x = 1\ndef broken(:\n")
    status, _, err = _run(capsys, str(script))
    assert status == 2 and "syntax error in" in _one_line_error(err) and "line 2" in err


def test_no_step_boundary_says_how_to_mark_steps(tmp_path: Path, capsys) -> None:
    script = _write(tmp_path / "idle.py", "import torch\nprint(torch.ones(2).sum())\n")
    status, _, err = _run(capsys, "--out", str(tmp_path / "run"), str(script))
    line = _one_line_error(err)
    assert status == 2 and "no step boundary found" in line and "run.step()" in line


def test_script_failing_before_its_first_iteration_gets_no_step_marking_advice(tmp_path: Path, capsys) -> None:
    """A script that cannot load its data: its own error is the news, not how to mark steps."""
    script = _write(tmp_path / "noload.py", "import torch\ntorch.load('missing.pt')\n" + "STEPS = 12\n" + TRAIN)
    status, _, err = _run(capsys, "--out", str(tmp_path / "run"), str(script))
    assert status == 1 and "FileNotFoundError" in err and "missing.pt" in err
    assert "ended before its first iteration" in err and "run.step()" not in err
    assert not (tmp_path / "run").exists()


def test_zero_steps(tmp_path: Path, capsys) -> None:
    script = _write(tmp_path / "empty.py", "STEPS = 0\n" + TRAIN)
    status, _, err = _run(capsys, "--out", str(tmp_path / "run"), str(script))
    assert status == 2 and "zero steps ran" in _one_line_error(err)


def test_too_few_steps(tmp_path: Path, capsys) -> None:
    script = _write(tmp_path / "short.py", "STEPS = 3\n" + TRAIN)
    status, _, err = _run(capsys, "--out", str(tmp_path / "run"), str(script))
    assert status == 2 and "no step was recorded" in _one_line_error(err)


def test_unwritable_output_folder(tmp_path: Path, capsys) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if os.geteuid() == 0:  # root (CI) writes through a mode: sysfs takes no new folders, not even from root
        locked = Path("/sys/skalpel-unwritable")
    script = _write(tmp_path / "train.py", "STEPS = 12\n" + TRAIN)
    status, out, err = _run(capsys, "--out", str(locked / "run"), str(script))
    assert status == 2 and "cannot write to the output folder" in _one_line_error(err)
    assert "reached the end" not in out  # checked before the script runs


def test_output_folder_that_is_a_file(tmp_path: Path, capsys) -> None:
    blocker = tmp_path / "taken"
    blocker.write_text("a file, not a folder")
    script = _write(tmp_path / "train.py", "STEPS = 12\n" + TRAIN)
    status, out, err = _run(capsys, "--out", str(blocker / "run"), str(script))
    assert status == 2 and "cannot write to the output folder" in _one_line_error(err)
    assert "reached the end" not in out


def test_module_and_stop_after_capture(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "trainmod.py", "STEPS = 40\n" + TRAIN)
    status, out, _ = _run(capsys, "--warmup", "1", "--active", "2", "--stop-after-capture", "-m", "trainmod")
    assert status == 0
    assert "reached the end" not in out and "2 steps: median" in out
    folders = list((tmp_path / "skalpel-runs").iterdir())
    assert len(folders) == 1 and folders[0].name.endswith("-trainmod")
    assert (folders[0] / "trace-rank0.json.gz").is_file()


def test_script_with_its_own_profile_keeps_its_steps(tmp_path: Path, capsys) -> None:
    script = _write(
        tmp_path / "own.py",
        """
        import skalpel, torch
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with skalpel.profile(wait=0, warmup=1, active=4) as run:
            for _ in range(12):
                optimizer.zero_grad()
                model(torch.randn(2, 4)).sum().backward()
                optimizer.step()
                run.step()
        """,
    )
    out = tmp_path / "run"
    status, stdout, _ = _run(capsys, "--out", str(out), str(script))
    assert status == 0
    assert "4 steps: median" in stdout  # the script's own settings, not skalpel run's 5 active steps
    assert len(_step_names(out / "trace-rank0.json.gz")) == 4


def test_sys_exit_code_is_kept(tmp_path: Path, capsys) -> None:
    script = _write(tmp_path / "exits.py", "STEPS = 12\n" + TRAIN + "\nraise SystemExit(3)\n")
    status, out, err = _run(capsys, "--out", str(tmp_path / "run"), "--warmup", "1", "--active", "2", str(script))
    assert status == 3 and "reached the end" in out
    assert (tmp_path / "run" / "summary.txt").is_file() and "Traceback" not in err


def test_script_raising_mid_window_keeps_the_steps_recorded_so_far(tmp_path: Path, capsys) -> None:
    source = TRAIN.replace("    optimizer.step()", "    optimizer.step()\n    if len(done) == 6: raise ValueError('bad batch')\n    done.append(1)")
    script = _write(tmp_path / "fails.py", "STEPS = 30\ndone = []\n" + source)
    status, out, err = _run(capsys, "--out", str(tmp_path / "run"), "--warmup", "1", "--active", "10", str(script))
    assert status == 1 and "ValueError: bad batch" in err
    assert "fails.py" in err and "steps: median" in out
    steps = _step_names(tmp_path / "run" / "trace-rank0.json.gz")
    assert 1 <= len(steps) < 10


def test_interrupt_keeps_the_trace_and_exits_130(tmp_path: Path, capsys) -> None:
    source = TRAIN.replace("    optimizer.step()", "    optimizer.step()\n    if len(done) == 8: raise KeyboardInterrupt\n    done.append(1)")
    script = _write(tmp_path / "interrupted.py", "STEPS = 30\ndone = []\n" + source)
    status, out, err = _run(capsys, "--out", str(tmp_path / "run"), "--warmup", "1", "--active", "3", str(script))
    assert status == 130 and "KeyboardInterrupt" in err
    assert (tmp_path / "run" / "summary.txt").is_file() and "3 steps: median" in out


def test_interrupt_before_any_recorded_step_removes_the_folder_and_says_so(tmp_path: Path, capsys) -> None:
    source = TRAIN.replace("    optimizer.step()", "    optimizer.step()\n    raise KeyboardInterrupt")
    script = _write(tmp_path / "early.py", "STEPS = 30\n" + source)
    out = tmp_path / "run"
    status, _, err = _run(capsys, "--out", str(out), str(script))
    assert status == 130 and "KeyboardInterrupt" in err
    assert f"removed the empty run folder {out}" in err
    assert not out.exists()


def test_run_without_a_script(capsys) -> None:
    status, _, err = _run(capsys)
    assert status == 2 and "give a script to run" in _one_line_error(err)


def test_step_boundaries_stay_outside_the_optimizer_step_range(tmp_path: Path, capsys) -> None:
    script = _write(
        tmp_path / "no_loader.py",
        """
        import torch
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(12):
            model(torch.randn(2, 4)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
        """,
    )
    status, _, _ = _run(capsys, "--out", str(tmp_path / "run"), "--warmup", "1", "--active", "3", str(script))
    assert status == 0
    events = json.loads(gzip.decompress((tmp_path / "run" / "trace-rank0.json.gz").read_bytes()))["traceEvents"]
    starts = [event["ts"] for event in events if event.get("name", "").startswith("ProfilerStep#")]
    ranges = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name", "").startswith("Optimizer.")]
    assert len(starts) == 3 and len(ranges) >= 5
    assert not any(low < start < high for start in starts for low, high in ranges)


def test_runs_started_in_the_same_second_get_their_own_folders(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    same = runfolder.default_folder("train", now=1_790_000_000.0)
    first, second, third = (runfolder.prepare_new(same) for _ in range(3))
    assert first.is_absolute() and first == tmp_path / same
    assert second.name == first.name + "-2" and third.name == first.name + "-3"
    assert runfolder.prepare(Path("given")) == tmp_path / "given"  # --out, made absolute before the script runs


# ---- step detection and the step clock, in-process ------------------------------------------


def test_watchdog_says_when_a_step_runs_long_and_once_per_silence() -> None:
    import time as clock

    from skalpel.capture.steps import StepDetector, Watchdog

    detector = StepDetector(lambda: None)
    said: list[str] = []
    checks: list[int] = []  # one entry per check the watchdog made (it asks done() first), with what it had said
    watchdog = Watchdog(detector.policy, 0.2, said.append, done=lambda: checks.append(len(said)) or False)
    detector.policy.boundaries, detector.policy.signal = 3, "optimizer"
    detector.policy.last_boundary = clock.monotonic()
    watchdog.start()
    deadline = clock.monotonic() + 60  # generous: a loaded machine delays the checks, never the verdict
    while sum(1 for seen in checks if seen) < 4 and clock.monotonic() < deadline:  # 4 checks after the message
        clock.sleep(0.01)
    watchdog.stop()
    assert sum(1 for seen in checks if seen) >= 4, checks
    assert len(said) == 1  # one message per silent stretch, not one per check
    assert said[0].startswith("step 3 has run for") and "optimizer.step()" in said[0] and "--step-on" in said[0]


def test_detector_marks_one_step_per_gan_iteration_in_process() -> None:
    from skalpel.capture.steps import StepDetector

    marks: list[str] = []
    detector = StepDetector(lambda: marks.append(detector.policy.signal))
    d, g = torch.nn.Linear(4, 1), torch.nn.Linear(4, 4)
    opt_d, opt_g = torch.optim.SGD(d.parameters(), lr=0.1), torch.optim.SGD(g.parameters(), lr=0.1)
    detector.install()
    try:
        for _ in range(5):  # no DataLoader: each optimizer's own zero_grad, D then G
            opt_d.zero_grad()
            d(g(torch.randn(2, 4)).detach()).sum().backward()
            opt_d.step()
            opt_g.zero_grad()
            d(g(torch.randn(2, 4))).sum().backward()
            opt_g.step()
    finally:
        detector.uninstall()
    assert marks == ["optimizer"] * 4  # a boundary at each iteration's first zero_grad after the first iteration
    assert torch.optim.Optimizer.zero_grad.__name__ == "zero_grad"  # the wrapper is gone


def test_detector_times_the_threads_backward_and_optimizer_step_a_closures_backward_as_the_optimizers() -> None:
    import threading
    import time as clock

    from skalpel.capture.steps import StepDetector

    def burn(ms: float) -> None:
        began = clock.thread_time()
        while clock.thread_time() - began < ms / 1e3:
            pass

    class SlowBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):  # noqa: ANN001, ANN205
            return x * 2

        @staticmethod
        def backward(ctx, grad):  # noqa: ANN001, ANN205
            burn(3)
            return grad * 2

    model = torch.nn.Linear(4, 1)
    detector = StepDetector(lambda: None, only="optimizer")  # backward does not mark steps: it is still timed
    detector.install()
    try:
        SlowBackward.apply(model(torch.ones(4))).sum().backward()
        backward_s, optimizer_s = detector.hooks.backward_s, detector.hooks.optimizer_s
        elsewhere = threading.Thread(target=lambda: SlowBackward.apply(model(torch.ones(4))).sum().backward())
        elsewhere.start()
        elsewhere.join()
        after_other_thread = detector.hooks.backward_s
        lbfgs = torch.optim.LBFGS(model.parameters(), max_iter=1)

        def closure() -> torch.Tensor:
            lbfgs.zero_grad()
            loss = SlowBackward.apply(model(torch.ones(4))).sum()
            loss.backward()
            return loss

        lbfgs.step(closure)
    finally:
        detector.uninstall()
    assert backward_s >= 0.003 and optimizer_s == 0
    assert after_other_thread == backward_s  # another thread's backward is not the step's
    assert detector.hooks.backward_s == backward_s and detector.hooks.optimizer_s >= 0.003  # the closure's: the optimizer's
    assert torch.autograd.backward.__name__ == "backward"  # the wrapper is gone


def test_step_timing_baseline_is_before_the_recording_and_the_steps_after_it_its_check() -> None:
    settings = CaptureSettings(wait=2, warmup=2, active=3)
    # step 0 (slow) is left out of the baseline; the wait and warm-up steps after it are the baseline; the steps
    # after the window ran faster (a process the profiler changed): the check, said, never the baseline
    seconds = [0.5, 0.010, 0.0105, 0.0095, 0.012, 0.013, 0.0115]
    timing = step_timing(list(enumerate(seconds)), settings, after=[0.008, 0.0081, 0.0079, 0.008, 0.0082])
    assert timing["unprofiled_step_ms"] == pytest.approx(10.0)
    assert timing["baseline_steps"] == 3
    assert timing["overhead_pct"] == pytest.approx(20.0)
    assert timing["after_step_ms"] == pytest.approx(8.0) and timing["after_change_pct"] == pytest.approx(-20.0)
    assert 0 < timing["overhead_noise_pct"] < 20.0
