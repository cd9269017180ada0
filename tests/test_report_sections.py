"""A rank's further analyses are typed sections (result/sections.py), read by attribute, written as before.

- No module of ``src/skalpel`` reads (or writes) a rank's sections by string key: an AST walk flags a
  string-keyed use (``x.extra["comm"]``, ``x.extra.get("blame")``, ``"blame" in x.extra``, ``extra["syncs"] = ...``)
  of anything called ``extra``.
  ``Trace.extra`` is keyed by event index, never by a string, so it passes.
- Every section, and the report around it, reads back from its JSON to the same bytes: the stored reports,
  one with every section filled by hand, one as an older version wrote it, and every corpus report (slow).

    python tests/test_report_sections.py [SRC]    # the string-keyed uses under SRC (default: this tree's src/)
"""

from __future__ import annotations

import ast
import dataclasses
import json
import sys
from pathlib import Path

import orjson
import pytest

from skalpel.result.report import RankReport, Report, ReportFormatError
from skalpel.result.sections import (
    SECTIONS,
    BlameCause,
    BlameStep,
    BlameSummary,
    CollectiveRow,
    CommSummary,
    Compilation,
    CompiledRegion,
    CompiledSummary,
    CompileSummary,
    DistributedSummary,
    LaunchSummary,
    ModuleRow,
    ModulesSummary,
    RooflineOp,
    RooflineSummary,
    PeerCause,
    PeerStep,
    PeerWaits,
    StepDeviceSummary,
    SyncSummary,
)

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO.parent / "shared" / "traces"  # as tests/conftest.py finds the corpus
ALLOWED: set[tuple[str, str]] = set()  # (module, key) string-keyed reads allowed: none


def _is_extra(node: ast.AST) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr == "extra"
    return isinstance(node, ast.Name) and node.id == "extra"


def _text(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def string_key_reads(src: Path) -> list[tuple[str, int, str]]:
    """(module under skalpel/, line, key) of every string-keyed read or write of something called ``extra``."""
    found = []
    for path in sorted((src / "skalpel").rglob("*.py")):
        module = path.relative_to(src / "skalpel").as_posix()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            key = None
            if isinstance(node, ast.Subscript) and _is_extra(node.value):
                key = _text(node.slice)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
                if _is_extra(node.func.value) and node.args:
                    key = _text(node.args[0])
            elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
                if any(_is_extra(item) for item in node.comparators):
                    key = _text(node.left)
            if key is not None:
                found.append((module, node.lineno, key))
    return found


def test_no_module_reads_a_rank_section_by_string_key() -> None:
    found = [item for item in string_key_reads(REPO / "src") if item[::2] not in ALLOWED]
    assert found == [], "read RankReport.<section> (result/sections.py), not extra[...]: " + repr(found)


def test_a_planted_string_key_read_is_found(tmp_path: Path) -> None:
    module = tmp_path / "skalpel" / "report" / "planted.py"
    module.parent.mkdir(parents=True)
    module.write_text("def f(rank, extra):\n    a = rank.extra.get('comm')\n    b = extra['blame']\n"
                      "    return 'syncs' in rank.extra, rank.extra[0]\n")  # fmt: skip
    assert [(line, key) for _, line, key in string_key_reads(tmp_path)] == [(2, "comm"), (3, "blame"), (4, "syncs")]


def _every_section() -> RankReport:
    """One rank with every section filled, each optional part of it too (commbench's figures, a compile log)."""
    peers = PeerWaits("rank 1", {"rank 1": 2.0, "transfer": 0.5}, (PeerStep(4, {"rank 1": 2.0}),),
                      (PeerCause("rank 1", "nccl:all_reduce", "train.py:9 in step", 2.0),))  # fmt: skip
    return RankReport(
        rank=1, step_ms=(10.0, 12.0), step_breakdown_pct={"kernel": 90.0},
        launch=LaunchSummary(10, 5.0, 6.0, 7.0, 8.0, 0, 10, 2.0, 3.0, 1, 2, 5.0, 20.0, 10.0),
        step_device=StepDeviceSummary(2, 80.0, 20.0, 2.2, marked=True),
        blame=BlameSummary(waits_on="main thread", unit="step", idle_ms_per_step=2.5,
                           ms_per_step={"collective_wait": 2.5}, share_pct={"collective_wait": 100.0},
                           steps=(BlameStep(4, 2.5, {"collective_wait": 2.5}),),
                           top=(BlameCause("collective_wait", "all_reduce", 2.5),), notes=("a note",),
                           collective_wait_by_peer=peers),  # fmt: skip
        syncs=SyncSummary(0.1, 1, 0.1, 0, 0.0, 2, 0.0, 0, 0.0, 1, 4096, 0.01),
        compile=CompileSummary(1, 2.0, 1, 0, 3, 0.1, 2, 1.5, 1, 900.0, 0, 4, 2, 0.5, 12.5),
        compiled=CompiledSummary(
            regions=(CompiledRegion("0/0", "forward", "model.py:3 in forward", 2, 3.0, 1.0, 4, 2, ("abc",)),),
            compilations=1, recompilations=0, compile_ms=900.0, graph_breaks=0, limits_reached=0, stacks_off=False,
            sources=("dynamo",),
            events=(Compilation("0/0", "model.py:3 in forward", None, 900.0, 0, False, None, None),),
        ),  # fmt: skip
        comm=CommSummary("device", 2.0, 18.0, 1.0, 50.0, (
            CollectiveRow("all_reduce", 4, 2.0, 4.0, 2.0, 18.0, 1e6, 500000, 2, 1.0, 1.0, 10.0, 10.0, 12.0),
            CollectiveRow("broadcast", 1, 0.5, 0.1, 0.05, 0.4, 10.0, 20, 2, None, None))),  # fmt: skip
        distributed=DistributedSummary(11.0, 2.0, 2.5, 8.5, -3.0, "aligned", 4, 1, True, {"all_reduce": 1.2}),
        modules=ModulesSummary("step", 2, 10.0, 4.0, 6.0, 8.0, 7.0, 1.0, "device", (
            ModuleRow(("Net_0",), 1.0, 4.0, 0.5, 7.0, 0.0, 2e9, 0.0, "model.py:9 in forward"),
            ModuleRow(("Net_0", "Linear_0"), 2.0, 3.5, 3.5, 7.0, 7.0, 2e9, 2e9, None,
                      "torch/nn/modules/linear.py:130 in forward"))),  # fmt: skip
        roofline=RooflineSummary("measured on this CPU (skalpel run)", (
            RooflineOp("aten::mm", "[[512,512],[512,512]]", "fp32", 1.0, 5.0, 2.7e8, 3.1e6, 85.3, 53.7, 0.63, 134.5,
                       7.3, "compute-bound", 40.0, "intensity 85.3 FLOP/B >= ridge 18.3"),
            RooflineOp("aten::add", None, None, 2.0, 1.0, None, None, None, None, None, None, None, "not judged", None,
                       "no input shapes recorded (record_shapes)"))),  # fmt: skip
    )


def _report(*ranks: RankReport) -> Report:
    from tests.report_fixtures import full_report

    return dataclasses.replace(full_report(ranks=1, ops=2, curve=3, steps=2, findings=False), ranks=ranks)


def test_every_section_reads_back_to_the_same_bytes() -> None:
    report = _report(_every_section(), RankReport(2, (1.0,), {}, distributed=DistributedSummary()))
    data = report.to_json()
    again = Report.from_json(data)
    assert again == report and again.to_json() == data
    written = json.loads(data)["ranks"]
    assert list(written[0]["extra"]) == list(SECTIONS)  # every section, in its order, under "extra"
    assert written[1]["extra"] == {"distributed": {}}  # a rank the comparison lacks: an empty object, as before
    own = [spec.name for spec in dataclasses.fields(RankReport) if spec.name not in SECTIONS]
    assert list(written[0]) == [*own[:-1], "extra", "ledger"]  # "extra" where it always was, before the ledger


def test_a_report_of_an_older_version_reads_back_to_the_same_bytes() -> None:
    """Fields added to a section later (blame's unit, distributed's transfer bandwidth, the compile log's events)
    are absent from older reports, and stay absent when they are written again."""
    data = json.loads(_report(_every_section()).to_json())
    extra = data["ranks"][0]["extra"]
    del extra["blame"]["unit"], extra["distributed"]["transfer_busbw_gbps"], extra["compiled"]["events"]
    for name in ("compilations", "recompilations", "compile_ms", "graph_breaks", "limits_reached", "stacks_off"):
        del extra["compiled"][name]
    del extra["compiled"]["sources"]
    text = orjson.dumps(data, option=orjson.OPT_INDENT_2)
    again = Report.from_json(text)
    assert again.ranks[0].blame.unit is None and again.ranks[0].compiled.compilations is None
    assert again.to_json() == text


def test_a_section_of_the_wrong_shape_is_named() -> None:
    data = json.loads(_report(_every_section()).to_json())
    data["ranks"][0]["extra"]["comm"]["by_type"][1]["calls"] = "many"
    with pytest.raises(ReportFormatError, match=r"ranks\[0\]\.extra\.comm\.by_type\[1\]\.calls: expected an integer"):
        Report.from_dict(data)
    del data["ranks"][0]["extra"]["comm"]
    del data["ranks"][0]["extra"]["blame"]["steps"][0]["idle_ms"]
    with pytest.raises(ReportFormatError, match=r"ranks\[0\]\.extra\.blame\.steps\[0\]: the field 'idle_ms' is mis"):
        Report.from_dict(data)


NOT_TRACES = {  # JSON files of the corpus that are no Kineto trace: skalpel refuses them (exit status 2)
    "extra/AMD-AGI__TraceLens/tests/traces/inference/vllm_decode_full/capture_traces/execution_details.json",
    "extra/AMD-AGI__TraceLens/tests/traces/inference/vllm_prefilldecode_piecewise/capture_traces/execution_details.json",
    "hta/execution_trace/benchmark_simple_add_et.json.gz",
}


def _corpus_targets() -> list[str]:
    """Every trace file of the corpus and every folder that holds one (as benchmarks/compare_trees.py runs them)."""
    files = sorted(p for p in TRACES.rglob("*") if p.is_file() and p.name.endswith((".json", ".json.gz"))
                   and "README" not in p.name)  # fmt: skip
    targets = [str(p.relative_to(TRACES)) for p in files + sorted({p.parent for p in files})]
    return [target for target in targets if target not in NOT_TRACES]


@pytest.mark.slow
@pytest.mark.parametrize("relative", _corpus_targets())
def test_every_corpus_report_reads_back_to_the_same_bytes(relative: str, tmp_path: Path) -> None:
    """``skalpel analyze`` on a trace file or folder of the corpus: its report.json, read back, writes the same
    bytes again."""
    from skalpel.cli import main
    from tests.conftest import corpus

    out = tmp_path / "r.json"
    assert main(["analyze", str(corpus(relative)), "--json", str(out)]) == 0
    written = out.read_bytes()
    assert Report.from_json(written).to_json() == written


def _print_counts(src: Path) -> None:
    found = string_key_reads(src)
    for module, line, key in found:
        print(f"{module}:{line}: {key!r}")
    print(f"{len(found)} string-keyed reads and writes of rank sections under {src}")


if __name__ == "__main__":
    _print_counts(Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "src")
