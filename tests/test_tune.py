"""`skalpel tune`'s parts without running a script: candidate choice, the edits, statistics, verdicts,
the recommendation, the result file, the schema and the HTML page. The real runs are in test_tune_runs.py."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from skalpel.cli import main
from skalpel.cores import cgroup_quota_cores, usable_cores
from skalpel.diagnose import RULES
from skalpel.tune import candidates, stats
from skalpel.tune.html import render as render_html
from skalpel.tune.launch import StepClock, WindowDone
from skalpel.tune.measure import Window, read_result
from skalpel.tune.result import Baseline, CandidateResult, LossCheck, TuneResult
from skalpel.tune.session import loss_check, recommend

DESIGN = Path(__file__).resolve().parent.parent.parent / "shared" / "DESIGN.md"


def _site(path: str, line: int, code: str) -> dict:
    return {"location": f"{path}:{line} in train", "path": path, "line": line, "code": code}


STARVED_FACTS = {
    "device": "cpu", "threads": 1, "cudnn_benchmark": False,
    "threads_call": {"site": _site("train.py", 16, "torch.set_num_threads(1)"), "threads": 1},
    "loaders": [{"site": _site("train.py", 31, "loader = DataLoader(SlowDataset(), batch_size=16, num_workers=0)"),
                 "batch_size": 16, "num_workers": 0, "pin_memory": False, "persistent_workers": False,
                 "prefetch_factor": None}],
    "optimizers": [{"class": "SGD", "site": _site("train.py", 30, "optimizer = torch.optim.SGD(model.parameters(), lr=0.01)"),
                    "foreach": None, "fused": None, "accepts": ["foreach", "fused"]}],
    "model": {"class": "Sequential", "site": _site("train.py", 29, "model = nn.Sequential(nn.Linear(256, 10))"),
              "call_site": _site("train.py", 34, "loss = loss_fn(model(x), y)"), "device": "cpu"},
}  # fmt: skip


def _names(chosen: list[candidates.Choice]) -> list[str]:
    return [choice.candidate.name for choice in chosen]


def test_a_starving_loader_gets_more_workers_at_its_line() -> None:
    selection = candidates.select(STARVED_FACTS, {"dataloader_bound"}, cores=4)
    # threads: a CPU run with fewer threads than cores; compile: a CPU step is host-bound
    assert _names(selection.chosen) == ["num_workers", "threads", "compile"]
    assert selection.chosen[0].reason == "dataloader_bound" and selection.chosen[2].reason == "host-bound step (CPU)"
    assert {item["name"] for item in selection.skipped} == {"persistent_workers", "prefetch_factor"}
    workers = candidates.BY_NAME["num_workers"]
    assert workers.fix(STARVED_FACTS, 4) == {"dataloader": {"num_workers": 4}}  # the 1 thread keeps its number
    (change,) = workers.changes(STARVED_FACTS, 4)
    assert change["location"] == "train.py:31 in train"
    assert change["after"] == "loader = DataLoader(SlowDataset(), batch_size=16, num_workers=4)"


def test_more_workers_are_the_sizing_skalpel_run_shares() -> None:
    from skalpel.cores import MAX_LOADER_WORKERS

    workers = candidates.BY_NAME["num_workers"]
    assert workers.fix(STARVED_FACTS, 2) == {"dataloader": {"num_workers": 2}}  # one per usable core
    assert workers.fix(STARVED_FACTS, 64)["dataloader"]["num_workers"] == MAX_LOADER_WORKERS
    assert workers.why_not(STARVED_FACTS, 1) == "with 1 usable core, worker processes would only compete with training"


def test_more_workers_beside_threads_that_fill_the_cores_take_one_thread_back() -> None:
    """2 intra-op threads on 2 cores: tune tries what skalpel run advises, 2 workers with torch.set_num_threads(1)."""
    from skalpel.diagnose.input import loader_plan

    facts = {**STARVED_FACTS, "threads": 2}
    workers = candidates.BY_NAME["num_workers"]
    assert workers.fix(facts, 2) == {"dataloader": {"num_workers": 2}, "threads": 1}
    loader_change, threads_change = workers.changes(facts, 2)
    assert loader_change["after"].endswith("num_workers=2)") and threads_change["after"] == "torch.set_num_threads(1)"
    advice = loader_plan({"cores_available": 2, "intra_op_threads": 2}, wait_ms=94.0, step_ms=341.0, single=True,
                         device=False, min_speedup=1.1)  # fmt: skip
    assert "DataLoader(num_workers=2, persistent_workers=True, prefetch_factor=2) with torch.set_num_threads(1)" \
        in advice.fix
    # threads that leave a core free keep their number
    assert workers.fix({**STARVED_FACTS, "threads": 2}, 8) == {"dataloader": {"num_workers": 4}}


def _with_workers(workers: int, threads: int) -> dict:
    loader = {**STARVED_FACTS["loaders"][0], "num_workers": workers}
    loader["site"] = _site("train.py", 31, f"loader = DataLoader(ds, batch_size=16, num_workers={workers})")
    return {**STARVED_FACTS, "threads": threads, "threads_call": None, "loaders": [loader]}


def test_four_workers_on_two_cores_try_the_plan_skalpel_run_advises_and_no_workers_with_no_finding() -> None:
    """4 workers + 2 threads on 2 cores: tune times what loader_oversubscribed advises (cores.workers_that_fit: one
    worker and one thread fewer) and no workers at all; the split is the same setting here, so it is not run twice."""
    from skalpel.cores import workers_that_fit

    facts = _with_workers(4, 2)
    selection = candidates.select(facts, set(), cores=2)
    reasons = {choice.candidate.name: choice.reason for choice in selection.chosen}
    assert list(reasons) == ["fewer_workers", "no_workers", "compile"]
    assert reasons["fewer_workers"] == reasons["no_workers"] == "4 workers + 2 threads > 2 cores"
    assert workers_that_fit(4, 2, 2) == (1, 1)
    assert candidates.BY_NAME["fewer_workers"].fix(facts, 2) == {"dataloader": {"num_workers": 1}, "threads": 1}
    loader_change, threads_change = candidates.BY_NAME["fewer_workers"].changes(facts, 2)
    assert loader_change["after"] == "loader = DataLoader(ds, batch_size=16, num_workers=1)"
    assert "now 4 workers with 2 intra-op threads on 2 usable cores" in loader_change["edit"]
    assert threads_change["after"] == "torch.set_num_threads(1)"
    assert candidates.BY_NAME["no_workers"].fix(facts, 2) == {"dataloader": {"num_workers": 0}}
    (none,) = candidates.BY_NAME["no_workers"].changes(facts, 2)
    assert none["after"] == "loader = DataLoader(ds, batch_size=16, num_workers=0)"
    assert "is what fewer_workers tries" in candidates.BY_NAME["workers_threads"].why_not(facts, 2)
    # 4 workers + 1 thread on 4 cores: the workers on the 3 cores the thread leaves free, the threads kept
    assert candidates.BY_NAME["fewer_workers"].fix(_with_workers(4, 1), 4) == {"dataloader": {"num_workers": 3}}
    # 8 workers + 8 threads on 8 cores: the split (4 + 4) differs from the plan (1 + 7), so both are tried
    assert candidates.BY_NAME["fewer_workers"].fix(_with_workers(8, 8), 8) == {"dataloader": {"num_workers": 1}, "threads": 7}
    assert candidates.BY_NAME["workers_threads"].why_not(_with_workers(8, 8), 8) is None
    # the real settings in the words: a loader with 4 workers is not said to have 2
    why = candidates.BY_NAME["num_workers"].why_not(facts, 2)
    assert why == "every DataLoader already has at least num_workers=2 (num_workers=4)"
    # workers and threads that fit the cores: nothing to take away
    fits = _with_workers(1, 1)
    assert not {"fewer_workers", "no_workers", "workers_threads"} & set(_names(candidates.select(fits, set(), cores=2).chosen))
    assert "fit in the 2 usable cores" in candidates.BY_NAME["fewer_workers"].why_not(fits, 2)
    # the same facts, the same set, every session
    assert all(_names(candidates.select(facts, set(), cores=2).chosen) == list(reasons) for _ in range(3))


def test_no_workers_drops_the_settings_that_need_workers() -> None:
    facts = _with_workers(4, 2)
    facts["loaders"][0]["site"] = _site("train.py", 31, "loader = DataLoader(ds, num_workers=4, persistent_workers=True, prefetch_factor=4)")
    (change,) = candidates.BY_NAME["no_workers"].changes(facts, 2)
    assert change["after"] == "loader = DataLoader(ds, num_workers=0, persistent_workers=False, prefetch_factor=None)"


def test_the_worker_split_shares_the_cores() -> None:
    from skalpel.cores import fewer_workers, worker_split

    assert worker_split(4, 2, 2) == (1, 1) and worker_split(8, 8, 8) == (4, 4) and worker_split(2, 2, 8) == (2, 2)
    assert worker_split(3, 1, 1) == (1, 1)  # one core: one of each, the least there is
    assert fewer_workers(4, 2, 2) == 1 and fewer_workers(2, 2, 2) == 1 and fewer_workers(2, 1, 4) is None
    assert fewer_workers(4, 1, 4) == 3
    assert fewer_workers(1, 4, 2) is None  # one worker: fewer is none, which is not a DataLoader tune changes


def test_a_host_bound_step_tries_compile_with_no_finding_and_gpu_candidates_are_listed_once() -> None:
    selection = candidates.select({**STARVED_FACTS, "loaders": []}, set(), cores=1)  # threads == cores: no threads
    assert _names(selection.chosen) == ["compile"] and selection.chosen[0].reason == "host-bound step (CPU)"
    assert selection.skipped == []
    gpu_only = [item["name"] for item in selection.not_applicable]
    assert gpu_only == ["pin_memory", "compile_reduce_overhead", "autocast_bf16", "cudnn_benchmark"]
    assert all(item["why"] == "needs a GPU" for item in selection.not_applicable)
    forced = candidates.select(STARVED_FACTS, set(), cores=1, forced=("cudnn_benchmark",))
    assert forced.skipped == [{"name": "cudnn_benchmark", "why": "cuDNN autotuning needs a GPU"}]
    assert "cudnn_benchmark" not in {item["name"] for item in forced.not_applicable}  # said once, where asked


def test_no_finding_no_loader_candidate_and_a_gpu_brings_its_own() -> None:
    no_model = {**STARVED_FACTS, "model": None}
    assert candidates.select(no_model, set(), cores=1).chosen == []  # threads already == cores, nothing to compile
    oversubscribed = {**no_model, "threads": 8}
    chosen = candidates.select(oversubscribed, {"cpu_contention"}, cores=2).chosen
    assert _names(chosen) == ["threads"] and chosen[0].reason == "cpu_contention"
    assert chosen[0].candidate.fix(oversubscribed, 2) == {"threads": 2}
    fused_runs = [{**STARVED_FACTS["optimizers"][0], "fused_supported": True}]
    gpu = {**STARVED_FACTS, "device": "cuda", "bf16_supported": True, "optimizers": fused_runs}
    selection = candidates.select(gpu, set(), cores=8)
    assert _names(selection.chosen) == ["pin_memory", "autocast_bf16", "fused_optimizer", "cudnn_benchmark"]
    assert selection.not_applicable == []


def test_try_forces_a_candidate_and_says_why_one_cannot_run() -> None:
    no_loader = {**STARVED_FACTS, "loaders": []}
    selection = candidates.select(no_loader, set(), cores=1, forced=("compile", "num_workers"))
    assert _names(selection.chosen) == ["compile"] and selection.chosen[0].reason == "--try"
    assert selection.skipped == [{"name": "num_workers", "why": "the script builds no DataLoader"}]
    (change,) = candidates.BY_NAME["compile"].changes(no_loader, 1)
    assert change["after"].splitlines() == ["model = nn.Sequential(nn.Linear(256, 10))", "model = torch.compile(model)"]


def test_set_keyword_edits_one_line_calls_only() -> None:
    assert candidates.set_keyword("DataLoader(ds)", "num_workers", "2") == "DataLoader(ds, num_workers=2)"
    assert candidates.set_keyword("DataLoader()", "num_workers", "2") == "DataLoader(num_workers=2)"
    assert candidates.set_keyword("DataLoader(ds, num_workers=n_cpu)", "num_workers", "2") == "DataLoader(ds, num_workers=2)"
    assert candidates.set_keyword("loader = DataLoader(", "num_workers", "2") is None  # a call spread over lines
    assert (candidates.set_keyword("DataLoader(ds, num_workers=min(4, os.cpu_count()), shuffle=True)", "num_workers", "2")
            == "DataLoader(ds, num_workers=2, shuffle=True)")  # fmt: skip
    assert candidates.set_keyword("SGD(p, lr=0.1, foreach=False)", "foreach", "True") == "SGD(p, lr=0.1, foreach=True)"


def test_combined_fix_keeps_one_of_two_exclusive_settings() -> None:
    merged = candidates.combine([{"dataloader": {"num_workers": 2}}, {"optimizer": {"fused": True}},
                                 {"optimizer": {"foreach": True}}, {"dataloader": {"pin_memory": True}}])  # fmt: skip
    assert merged == {"dataloader": {"num_workers": 2, "pin_memory": True}, "optimizer": {"fused": True}}


def test_candidate_findings_are_registered_or_being_added() -> None:
    known = {rule.id for rule in RULES}
    if DESIGN.exists():
        being_added = DESIGN.read_text().split("## Findings being added", 1)[1].split("## ", 1)[0]
        known |= {line.split("`")[1] for line in being_added.splitlines() if line.startswith("| `")}
    for candidate in candidates.CATALOGUE:
        assert set(candidate.findings) <= known, candidate.name


def test_run_step_time_is_the_mean_not_a_mode_of_alternating_steps() -> None:
    alternating = [[5.0, 27.0] * 5]  # two workers: one step waits, the next does not
    assert stats.timing(alternating).median_ms == pytest.approx(16.0)


def _runs(means: list[float], *, steps: int = 10, jitter: float = 0.01, seed: int = 0) -> list[list[float]]:
    """Recorded-looking runs: each run's steps around its mean, a little step noise."""
    rng = np.random.default_rng(seed)
    return [list(mean * (1 + rng.normal(0, jitter, steps))) for mean in means]


def test_verdicts_against_the_noise() -> None:
    base = _runs([30.0, 30.3, 29.8])
    faster = stats.compare(base, _runs([15.0, 15.1], seed=1))
    assert faster.verdict == "faster" and faster.speedup == pytest.approx(2.0, rel=0.05)
    assert faster.speedup_low < faster.speedup < faster.speedup_high
    same = stats.compare(base, _runs([30.2, 30.1], seed=2))
    assert same.verdict == "no_gain" and not same.undecided
    slower = stats.compare(base, _runs([60.0]))
    assert slower.verdict == "slower" and stats.clearly_worse(slower)
    drifting = [[30.0] * 10, [45.0] * 10]  # baseline runs 40% apart: a 20% gain is inside that
    assert stats.compare(drifting, [[30.0] * 10, [30.0] * 10]).verdict == "no_gain"
    assert stats.compare(base, [[]]) is None


def test_a_gain_of_3_percent_inside_a_drift_of_5_percent_is_no_gain() -> None:
    base = _runs([100.0, 105.0, 101.0, 104.5])  # identical runs, interleaved, 5% apart: the machine's drift
    candidate = _runs([98.0, 101.4], seed=3)  # 3% faster than the baseline's mean
    result = stats.compare(base, candidate)
    assert result.drift_pct > 2 and result.band_pct == stats.TUNE_MIN_EFFECT_PCT  # the drift widens the interval
    assert result.change_pct == pytest.approx(-3.0, abs=0.6)  # the median of the paired rounds
    assert result.verdict == "no_gain"
    # the same 3% on a quiet machine clears the minimum effect only with an interval beyond it
    quiet = stats.compare(_runs([100.0, 100.2, 99.9]), _runs([97.0, 97.1], seed=4))
    assert quiet.band_pct == stats.TUNE_MIN_EFFECT_PCT and quiet.verdict == "no_gain"


def test_a_gain_of_40_percent_is_faster_with_an_interval_holding_the_gain_measured_alone() -> None:
    rng = np.random.default_rng(7)
    drift = lambda: float(rng.uniform(-0.025, 0.025))  # noqa: E731 - each run drifts up to 2.5% either way
    base = _runs([100.0 * (1 + drift()) for _ in range(3)], seed=5)
    fixed = _runs([100.0 / 1.4 * (1 + drift()) for _ in range(2)], seed=6)
    result = stats.compare(base, fixed)
    assert result.verdict == "faster"
    # the fixed loop timed alone in the same session, three runs against three of the baseline's own
    alone_base = np.mean([100.0 * (1 + drift()) for _ in range(3)])
    alone_fixed = np.mean([100.0 / 1.4 * (1 + drift()) for _ in range(3)])
    assert result.speedup_low <= alone_base / alone_fixed <= result.speedup_high
    assert result.speedup_low <= 1.4 <= result.speedup_high
    assert result.speedup == pytest.approx(100 / (100 + result.change_pct), rel=1e-3)
    assert result.speedup == pytest.approx((result.speedup_low * result.speedup_high) ** 0.5, rel=2e-3)  # its centre
    assert isinstance(result.drift_pct, float) and json.dumps(result.__dict__)  # plain numbers: the JSON takes them


def test_an_interval_straddling_the_line_is_undecided_and_more_runs_settle_it() -> None:
    base = _runs([100.0, 103.0, 100.5], seed=8)
    one = stats.compare(base, _runs([92.0], seed=9))  # 8% faster on one run: beyond the drift, but one round
    assert one.verdict == "no_gain" and one.undecided and one.ci_low_pct < -one.band_pct
    more = stats.compare(base + _runs([101.0, 102.0], seed=10), _runs([92.0, 92.5, 91.8, 92.2], seed=11))
    assert more.verdict == "faster" and not more.undecided


def test_the_same_samples_give_the_same_recommendation_every_session() -> None:
    base = _runs([50.0, 51.5, 50.4], seed=12)
    samples = {"num_workers": _runs([30.0, 30.5], seed=13), "threads": _runs([49.0, 50.5], seed=14),
               "compile": _runs([36.0, 35.0], seed=15)}  # fmt: skip
    sessions = []
    for _ in range(3):
        entries = []
        for name, runs in samples.items():
            comparison = stats.compare(base, runs)
            entries.append(_entry(name, comparison.verdict, comparison.speedup))
        selection = candidates.select(_with_workers(4, 2), {"dataloader_bound"}, cores=2)
        sessions.append((recommend(entries), _names(selection.chosen)))
    assert sessions[0] == sessions[1] == sessions[2]
    assert sessions[0][0] == ["num_workers", "compile"]


def test_a_short_script_has_its_warm_up_judged_from_its_steps_and_says_when_it_never_settled() -> None:
    settled = stats.steady([80.0, 30.0, 10.0, 10.5, 9.8, 10.2, 10.1], warmup=3, window=10)
    assert settled.judged and settled.reached and settled.warmup == 2 and settled.steps[0] == 10.0
    alternating = stats.steady([200.0, 5.0, 27.0, 5.0, 27.0, 5.0, 27.0], warmup=3, window=10)
    assert alternating.reached and alternating.steps == [5.0, 27.0, 5.0, 27.0, 5.0, 27.0]  # a loader's two modes
    falling = stats.steady([40.0, 30.0, 25.0, 20.0, 16.0, 13.0, 11.0], warmup=3, window=10)
    assert falling.judged and not falling.reached
    full = stats.steady([50.0] + [10.0] * 12, warmup=3, window=10)
    assert not full.judged and full.warmup == 3 and len(full.steps) == 10


def _entry(name: str, verdict: str | None, speedup: float | None, members: list[str] | None = None) -> CandidateResult:
    return CandidateResult(name, name, "test", {}, [], members=members or [], verdict=verdict, speedup=speedup)


def test_only_candidates_measured_faster_are_recommended() -> None:
    assert recommend([_entry("a", "no_gain", 1.05), _entry("b", "slower", 0.5), _entry("c", "error", None)]) == []
    assert recommend([_entry("a", "faster", 1.3), _entry("b", "no_gain", 1.5)]) == ["a"]
    together = [_entry("a", "faster", 1.3), _entry("b", "faster", 1.2)]
    assert recommend([*together, _entry("combined", "faster", 1.5, ["a", "b"])]) == ["a", "b"]
    assert recommend([*together, _entry("combined", "no_gain", 1.0, ["a", "b"])]) == ["a"]
    assert recommend([*together, _entry("combined", "error", None, ["a", "b"])]) == ["a"]


def _measured(name: str, base: list[list[float]], runs: list[list[float]], members: list[str] | None = None):
    """A candidate entry as the session fills it, from recorded runs compared with the baseline's."""
    comparison = stats.compare(base, runs)
    return CandidateResult(name, name, "test", {}, [], members=members or [], verdict=comparison.verdict,
                           speedup=comparison.speedup, speedup_low=comparison.speedup_low,
                           undecided=comparison.undecided)  # fmt: skip


def test_from_recorded_runs_the_recommendation_is_the_best_measured_not_the_fastest_looking() -> None:
    """Faster than the baseline is not enough: a candidate whose runs look fastest of all but disagree stays
    undecided (its interval crosses the line) and is not recommended; of two measured faster, the slower one is recommended only
    inside a combination measured at least as fast as the best alone."""
    base = _runs([50.0, 51.0, 50.4], seed=20)
    best = _measured("num_workers", base, _runs([30.0, 30.4], seed=21))
    second = _measured("threads", base, _runs([40.0, 40.3], seed=22))
    lucky = _measured("compile", base, _runs([15.0, 45.0], seed=26))  # two rounds that disagree: a 1.9x centre
    assert best.verdict == second.verdict == "faster" and best.speedup > second.speedup > 1
    # faster in both rounds, but 1.1x in one: ranked by its interval's slower end, below the two that agree
    assert lucky.speedup > best.speedup and lucky.verdict == "faster" and lucky.speedup_low < second.speedup_low
    assert recommend([second, best]) == ["num_workers", "threads"]  # no combination measured: both, best first
    assert recommend([lucky, second, best]) == ["num_workers", "threads", "compile"]
    disagree = _measured("compile", base, _runs([15.0, 52.0], seed=26))  # one round faster, one not
    assert disagree.verdict == "no_gain" and disagree.undecided
    lucky = disagree
    worse_together = _measured("combined", base, _runs([33.0, 33.2], seed=23), ["num_workers", "threads"])
    assert worse_together.verdict == "faster" and worse_together.speedup < best.speedup
    assert recommend([lucky, second, best, worse_together]) == ["num_workers"]
    better_together = _measured("combined", base, _runs([26.0, 26.1], seed=24), ["num_workers", "threads"])
    assert recommend([lucky, second, best, better_together]) == ["num_workers", "threads"]
    assert recommend([lucky, _measured("threads", base, _runs([50.5, 50.1], seed=25))]) == []  # nothing faster


def test_loss_is_compared_after_the_same_step(tmp_path: Path) -> None:
    base = read_result(_result_file(tmp_path / "b", [10.0] * 5, loss=2.30, loss_step=6))
    same = read_result(_result_file(tmp_path / "s", [10.0] * 5, loss=2.3001, loss_step=6))
    changed = read_result(_result_file(tmp_path / "c", [10.0] * 5, loss=2.20, loss_step=6))
    shorter = read_result(_result_file(tmp_path / "x", [10.0] * 3, loss=2.20, loss_step=4))
    assert loss_check([base], same).within_tolerance
    check = loss_check([base], changed)
    assert not check.within_tolerance and check.change_pct == pytest.approx(-4.3478, abs=1e-3)
    assert loss_check([base], shorter) is None  # not the same step: nothing to compare
    nan = read_result(_result_file(tmp_path / "n", [10.0] * 5, loss=float("nan"), loss_step=6))
    assert not loss_check([base], nan).within_tolerance


def _result_file(path: Path, steps: list[float], *, loss: float | None = None, loss_step: int | None = None,
                 end: str | None = "window") -> Path:  # fmt: skip
    lines = [json.dumps({"step_ms": value}) for value in steps]
    if end is not None:
        lines.append(json.dumps({"end": end, "exit_status": 0, "error": None, "loss": loss, "loss_step": loss_step,
                                 "steps_seen": len(steps) + 1, "facts": {"device": "cpu"}}))  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_killed_run_keeps_its_steps_and_a_short_script_still_gives_a_result(tmp_path: Path) -> None:
    path = _result_file(tmp_path / "k", [50.0, 10.0, 11.0, 12.0], end=None)
    path.write_text(path.read_text() + '{"step_ms": 1')  # cut mid-line by the kill
    killed = read_result(path, killed=True, timeout_s=60)
    assert killed.failed and killed.end == "killed" and "60 s" in killed.error
    assert killed.steps_ms == [50.0, 10.0, 11.0, 12.0]
    window = Window(warmup=3, steps=10)
    assert killed.timed(window) == [10.0, 11.0, 12.0]  # shorter than the window: the slow first step is warm-up
    assert read_result(_result_file(tmp_path / "s", [50.0, 10.0])).timed(window) == [10.0]


def test_cgroup_quota_lowers_the_usable_cores(tmp_path: Path) -> None:
    v2 = tmp_path / "cpu.max"
    v1 = (tmp_path / "quota", tmp_path / "period")
    v2.write_text("150000 100000\n")
    assert cgroup_quota_cores(v2, v1) == 1.5
    v2.write_text("max 100000\n")
    assert cgroup_quota_cores(v2, v1) is None
    v2.unlink()
    v1[0].write_text("-1\n")
    v1[1].write_text("100000\n")
    assert cgroup_quota_cores(v2, v1) is None
    v1[0].write_text("50000\n")
    assert cgroup_quota_cores(v2, v1) == 0.5
    assert 1 <= usable_cores()


def _result(*, hostile: str = "") -> TuneResult:
    winner = CandidateResult(
        "num_workers", "build batches in worker processes", "finding dataloader_bound", {"dataloader": {"num_workers": 2}},
        [{"location": f"train{hostile}.py:31 in train", "before": f"DataLoader(ds{hostile})",
          "after": f"DataLoader(ds{hostile}, num_workers=2)", "edit": "pass num_workers=2 to DataLoader(...)"}],
        verdict="faster", median_ms=20.0, noise_pct=3.0, speedup=1.8, change_pct=-44.4, band_pct=3.0,
        run_ms=[20.0, 20.6], runs=2, steps=20, loss=LossCheck(13, 2.3, 2.31, 0.43, 0.1, False))  # fmt: skip
    broken = CandidateResult("compile", "torch.compile the model", "--try", {"compile": "default"}, [],
                             verdict="error", runs=1, error=f"RuntimeError: {hostile or 'boom'}")  # fmt: skip
    return TuneResult(f"train{hostile}.py", ["--lr", hostile], 3, 10, 2, 2, "cpu", ["dataloader_bound"],
                      "a profiled run (skalpel run)", Baseline(36.0, 2.5, [36.0, 35.2, 36.4], 3, 30, 2.3, 13),
                      [winner, broken], [{"name": "pin_memory", "why": "needs a GPU"}], ["num_workers"], 300.0)  # fmt: skip


def _validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(resources.files("skalpel.tune").joinpath("tune.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_result_validates_against_the_shipped_schema_and_broken_ones_do_not() -> None:
    check = _validator()
    document = json.loads(_result().to_json())
    assert next(iter(document)) == "schema" and document["schema"] == "skalpel.tune/1"
    check.validate(document)
    for breakage in (lambda d: d["candidates"][0].update(verdict="better"), lambda d: d.pop("recommended"),
                     lambda d: d["baseline"].update(median_ms="fast"), lambda d: d.update(schema="skalpel.tune/2")):  # fmt: skip
        broken = json.loads(json.dumps(document))
        breakage(broken)
        assert not check.is_valid(broken)


def test_schema_documents_every_result_field() -> None:
    import dataclasses

    schema = json.loads(resources.files("skalpel.tune").joinpath("tune.schema.json").read_text())
    where = {TuneResult: schema["properties"], Baseline: schema["properties"]["baseline"]["properties"],
             CandidateResult: schema["$defs"]["candidate"]["properties"], LossCheck: schema["$defs"]["loss"]["properties"]}  # fmt: skip
    missing = [f"{cls.__name__}.{f.name}" for cls, props in where.items() for f in dataclasses.fields(cls) if f.name not in props]
    assert missing == []


def test_html_page_escapes_every_name_from_the_script() -> None:
    hostile = "<img src=x onerror=alert(1)>"
    page = render_html(_result(hostile=hostile))
    assert hostile not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "num_workers=2" in page and "1.80x" in page and "faster" in page and "error" in page


def test_list_and_bad_arguments_answer_in_one_line(capsys: pytest.CaptureFixture) -> None:
    assert main(["tune", "--list"]) == 0
    out = capsys.readouterr().out
    assert all(candidate.name in out for candidate in candidates.CATALOGUE)
    for argv, words in ((["tune", "--try", "warp_drive", "train.py"], "unknown candidate 'warp_drive'"),
                        (["tune", "--budget", "-5", "train.py"], "--budget must be a positive number"),
                        (["tune", "--steps", "0", "train.py"], "--steps must be at least 1"),
                        (["tune", "--extra-runs", "-1", "train.py"], "--extra-runs must be at least 0"),
                        (["tune"], "give a script to tune")):  # fmt: skip
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert words in err and err.count("\n") == 1 and "Traceback" not in err


def test_step_clock_times_the_window_syncs_its_ends_and_stops_after_it() -> None:
    import io

    out, synced = io.StringIO(), []
    clock = StepClock(out, warmup=1, steps=2, max_seconds=None, sync=lambda: synced.append(clock.boundaries + 1))
    for _ in range(3):
        clock.boundary()
    with pytest.raises(WindowDone) as done:
        clock.boundary()
    assert done.value.reason == "window"
    assert synced == [2, 4]  # where the timed steps start and where they end
    assert len([json.loads(line) for line in out.getvalue().splitlines()]) == 3
    slow = StepClock(io.StringIO(), warmup=0, steps=100, max_seconds=0.0)
    slow.boundary()
    with pytest.raises(WindowDone) as done:
        slow.boundary()
    assert done.value.reason == "time_limit"


def test_findings_from_a_stored_gpu_trace_choose_loader_and_compile_candidates() -> None:
    from skalpel.tune.findings import findings_for
    from tests.conftest import corpus

    trace = corpus("kineto/tb_plugin/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz")
    found = findings_for("train.py", (), source=str(trace), profile=True, timeout_s=1)
    findings, source = found.ids, found.source
    assert found.folder is None  # a bare trace: no run folder to keep the result in
    assert {"dataloader_bound", "gpu_idle"} <= findings and source == str(trace)
    gpu = {**STARVED_FACTS, "device": "cuda", "bf16_supported": True}
    reasons = {choice.candidate.name: choice.reason for choice in candidates.select(gpu, findings, cores=8).chosen}
    assert reasons["num_workers"].startswith("dataloader_bound") and "gpu_idle" in reasons["compile"]
    assert reasons["compile_reduce_overhead"] == reasons["compile"]
    assert findings_for("train.py", (), source=None, profile=False, timeout_s=1).ids == set()


def _tune_document(script: Path, *, args: list[str], candidates_: list[dict], recommended: list[str]) -> dict:
    return {"schema": "skalpel.tune/1", "script": script.name, "script_path": str(script), "args": args,
            "candidates": candidates_, "recommended": recommended}  # fmt: skip


def test_run_advice_cites_what_tune_measured_on_the_same_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from skalpel.tune.advice import annotate, latest_result
    from tests.report_fixtures import one_finding_report

    monkeypatch.chdir(tmp_path)
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    runs = tmp_path / "skalpel-runs"
    earlier, new = runs / "2026-12-03T10-00-00-train", runs / "2026-12-03T11-00-00-train"
    for folder in (earlier, new):
        folder.mkdir(parents=True)
    slower = {"name": "fewer_workers", "verdict": "slower", "fix": {"dataloader": {"num_workers": 1}},
              "speedup": 0.72, "speedup_low": 0.65, "speedup_high": 0.8}  # fmt: skip
    faster = {"name": "num_workers", "verdict": "faster", "fix": {"dataloader": {"num_workers": 2}},
              "speedup": 1.71, "speedup_low": 1.5, "speedup_high": 1.95}  # fmt: skip
    other = _tune_document(script, args=["--lr", "1"], candidates_=[faster], recommended=["num_workers"])
    (earlier / "tune.json").write_text(json.dumps(_tune_document(script, args=[], candidates_=[slower, faster],
                                                                 recommended=["num_workers"])))  # fmt: skip
    (new / "tune.json").write_text(json.dumps(other))  # newer, but other arguments: not this run's
    report = one_finding_report()
    cited = annotate(report, runs / "2026-12-03T12-00-00-train", str(script), ())
    (finding,) = cited.findings
    assert finding.fix.startswith("DataLoader(num_workers=4) (skalpel tune measured (skalpel-runs/")
    assert "fewer_workers (num_workers=1) 0.72x (0.65–0.80): slower: not recommended here" in finding.fix
    assert "num_workers (num_workers=2) 1.71x (1.50–1.95): recommended here" in finding.fix
    assert annotate(report, runs / "x", str(tmp_path / "other.py"), ()) is report  # no result for that script
    assert latest_result([runs], str(script), ("--lr", "1"))[1] == new / "tune.json"
    (earlier / "tune.json").write_text("{not json")  # a broken file is passed over, never an error
    assert annotate(report, runs / "x", str(script), ()) is report


def test_tune_starts_from_a_run_folder_without_a_script_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    from skalpel.errors import SkalpelError
    from skalpel.result.report import CaptureInfo
    from skalpel.tune.command import script_of_run
    from skalpel.tune.findings import run_folder_of
    from tests.report_fixtures import one_finding_report

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("pass\n")
    run = tmp_path / "skalpel-runs" / "r"
    run.mkdir(parents=True)
    report = dataclasses.replace(one_finding_report(), capture=CaptureInfo(2, 5, script="train.py"))
    (run / "report.json").write_bytes(report.to_json())
    assert script_of_run(str(run)) == "train.py" and run_folder_of(run / "report.json") == run.absolute()
    (tmp_path / "train.py").unlink()
    with pytest.raises(SkalpelError, match="give the script to tune after the options"):
        script_of_run(str(run))


def test_fused_is_tried_where_the_installed_torch_runs_it_for_the_scripts_optimizer_on_its_device() -> None:
    """Probed, not assumed by device type: torch 2.13 runs fused AdamW on the CPU, so a CPU run tries it with no
    finding; where the probe failed it is not tried, and --try says why in the probe's words."""
    from skalpel.tune.patches import fused_runs

    adamw = {"class": "AdamW", "site": _site("train.py", 30, "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)"),
             "foreach": None, "fused": None, "accepts": ["foreach", "fused"], "device": "cpu"}  # fmt: skip
    import torch

    supported = fused_runs(torch.optim.AdamW, "cpu", 1e-3)
    facts = {**STARVED_FACTS, "loaders": [], "optimizers": [{**adamw, "fused_supported": supported}]}
    chosen = candidates.select(facts, set(), cores=1).chosen
    assert ("fused_optimizer" in _names(chosen)) == supported
    assert "fused_optimizer" not in {item["name"] for item in candidates.select(facts, set(), cores=1).not_applicable}
    if supported:
        (choice,) = [c for c in chosen if c.candidate.name == "fused_optimizer"]
        assert choice.reason == "this torch runs fused for AdamW on cpu (probed)"
        (change,) = choice.candidate.changes(facts, 1)
        assert change["after"] == "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)"
    refused = {**facts, "optimizers": [{**adamw, "fused_supported": False}]}
    assert "fused_optimizer" not in _names(candidates.select(refused, set(), cores=1).chosen)
    forced = candidates.select(refused, set(), cores=1, forced=("fused_optimizer",))
    assert forced.skipped == [{"name": "fused_optimizer", "why": "this torch does not run fused=True for AdamW on cpu"}]


def test_paired_rounds_hold_a_gain_that_one_disturbed_baseline_run_would_have_hidden() -> None:
    """The issue's case: a candidate faster in every round, one baseline run disturbed by 29%. Max - min set a 29%
    line (no_gain); paired rounds (each run over its round's baseline run) and the robust noise keep it faster."""
    base = _runs([100.0, 129.0, 101.0], jitter=0.005, seed=30)  # the middle baseline run disturbed
    fixed = _runs([84.0, 83.0], jitter=0.005, seed=31)  # faster than the baseline beside it in both rounds
    old_line = (129.0 - 100.0) / 110.0 * 100  # what max - min made of it
    result = stats.compare(base, fixed, pairs=[0, 2])  # round 1 beside baseline run 0, round 2 beside run 2
    assert old_line > 25 and result.band_pct < 5 and result.drift_pct < 3  # the disturbed run sets neither
    assert result.verdict == "faster" and result.speedup == pytest.approx(1.2, rel=0.03)
    assert result.speedup_low > 1.1
    # paired with the disturbed run itself, that round's ratio is the odd one: the median holds, the verdict too
    with_odd = stats.compare(base, _runs([84.0, 107.0, 83.5], jitter=0.005, seed=32), pairs=[0, 1, 2])
    assert with_odd.verdict == "faster" and with_odd.speedup == pytest.approx(1.2, rel=0.03)
    # the same gain with no disturbance: the same verdict
    quiet = stats.compare(_runs([100.0, 100.5, 101.0], jitter=0.005, seed=33), fixed, pairs=[0, 2])
    assert quiet.verdict == "faster"
    # and a look-alike: a candidate no faster, paired the same way, stays no_gain
    same = stats.compare(base, _runs([100.5, 100.8], jitter=0.005, seed=34), pairs=[0, 2])
    assert same.verdict == "no_gain" and not same.undecided


def test_a_runs_one_time_cost_is_its_time_to_the_last_step_less_its_steps_at_their_pace() -> None:
    """3 s to the end of the first step, then a 2 s compile in step 2, then 10 ms steps: 3 + 2 + 11 x 0.01 s to
    the last boundary, 13 steps at 10 ms: about 4.98 s of one-time work (start-up, first step, compile)."""
    from skalpel.tune.measure import RunOutcome

    run = RunOutcome([2000.0] + [10.0] * 11, "window", 0, first_step_s=3.0)
    assert run.one_time_s(Window(warmup=2, steps=8)) == pytest.approx(3.0 + 2.0 + 0.11 - 13 * 0.010, abs=1e-6)
    assert RunOutcome([10.0] * 5, "window", 0).one_time_s(Window(1, 3)) is None  # no start recorded: unknown


def test_autocast_is_never_offered_where_bf16_is_not_native(monkeypatch: pytest.MonkeyPatch) -> None:
    """tune's fact is the native path: torch.cuda.is_bf16_supported() also says yes on a GPU that only emulates bf16
    (a V100, a T4: slower than fp32). No such GPU is here, so its answers are given: True with emulation counted,
    False without; the fact must be False, and autocast_bf16 is then not chosen. On a CPU it is never offered."""
    import torch

    from skalpel.tune.patches import native_cuda_bf16

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    assert native_cuda_bf16() is False
    emulating = {**STARVED_FACTS, "device": "cuda", "bf16_supported": native_cuda_bf16()}
    assert "autocast_bf16" not in _names(candidates.select(emulating, set(), cores=8).chosen)
    native = {**emulating, "bf16_supported": True}
    assert "autocast_bf16" in _names(candidates.select(native, set(), cores=8).chosen)
    cpu = {**STARVED_FACTS, "bf16_supported": True}  # even a CPU said to have bf16: autocast is GPU-only here
    assert "autocast_bf16" not in _names(candidates.select(cpu, set(), cores=1).chosen)
