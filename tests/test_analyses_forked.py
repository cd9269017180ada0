"""Analyses split between this process and a forked one give exactly the one-process report."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from skalpel.analysis import bundle
from skalpel.forking import Child
from skalpel.job.report_of import report_of_trace
from skalpel.trace.loader import load

from .conftest import corpus


@pytest.fixture
def forks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Records the pid of each forked analysis child."""
    started: list[int] = []

    def recording(work, shared):
        child = Child(work, shared)
        started.append(child.pid)
        return child

    monkeypatch.setattr(bundle, "Child", recording)
    return started


def test_df_index_resolver_report_is_the_same_from_two_processes(
    forks: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = load(corpus("hta/df_index_resolver/df_index_resolver.json.gz"))  # 123k events: the largest corpus trace
    monkeypatch.setattr(bundle, "FORK_FROM_EVENTS", len(trace))
    alone = report_of_trace(trace, processes=1)
    assert forks == []
    split = report_of_trace(trace, processes=2)
    assert len(forks) == 1 and forks[0] > 0
    assert split.to_json() == alone.to_json()
    assert split.ranks[0].top_ops and split.ranks[0].step_breakdown_pct  # the child's share is in it


@pytest.mark.parametrize(
    "name",
    [
        "hta/nccl_parser_config/nccl_data.json.gz",  # collectives
        "kineto/tb_plugin/samples/resnet50_num_workers_0/worker0.1623143566756.pt.trace.json.gz",  # memory
        "hta/trace_filter/sampled_rank-0.json.gz",
    ],
)
def test_small_corpus_traces_split_the_same(name: str, forks: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bundle, "FORK_FROM_EVENTS", 0)
    trace = load(corpus(name))
    alone = report_of_trace(trace, processes=1).to_json()
    assert report_of_trace(trace, processes=2).to_json() == alone
    assert len(forks) == 1


def test_small_traces_stay_in_one_process(forks: list[int]) -> None:
    trace = load(corpus("hta/trace_filter/sampled_rank-0.json.gz"))
    assert len(trace) < bundle.FORK_FROM_EVENTS
    report_of_trace(trace, processes=4)
    assert forks == []


def test_a_child_that_dies_leaves_its_work_to_this_process(forks: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed as the OOM killer would: the op table and breakdown are then computed here, the same."""
    monkeypatch.setattr(bundle, "FORK_FROM_EVENTS", 0)
    trace = load(corpus("hta/nccl_parser_config/nccl_data.json.gz"))
    alone = report_of_trace(trace, processes=1).to_json()
    parent, real = os.getpid(), bundle.op_table

    def killed_in_the_child(trace):
        if os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(trace)

    monkeypatch.setattr(bundle, "op_table", killed_in_the_child)
    assert report_of_trace(trace, processes=2).to_json() == alone
    assert len(forks) == 1
    with pytest.raises(ChildProcessError):
        os.waitpid(forks[0], os.WNOHANG)  # reaped


def test_an_error_here_stops_the_child(forks: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bundle, "FORK_FROM_EVENTS", 0)
    trace = load(corpus("hta/nccl_parser_config/nccl_data.json.gz"))

    def broken(trace, steps):
        raise KeyboardInterrupt

    monkeypatch.setattr(bundle, "analyze_comm", broken)
    with pytest.raises(KeyboardInterrupt):
        report_of_trace(trace, processes=2)
    assert len(forks) == 1
    with pytest.raises(ChildProcessError):
        os.waitpid(forks[0], os.WNOHANG)  # killed and reaped, not left running
    assert not Path(f"/proc/{forks[0]}").exists()
