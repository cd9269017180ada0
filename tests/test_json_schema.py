"""Every JSON skalpel writes follows its shipped schema (skalpel.report/1, skalpel.diff/1)."""

from __future__ import annotations

import dataclasses
import json
from importlib import resources
from pathlib import Path

import jsonschema
import pytest

from skalpel.cli import main
from skalpel.result import report as model
from skalpel.result import sections
from tests.conftest import corpus
from tests.report_fixtures import full_report

CORPUS = (
    "kineto/tb_plugin/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz",  # GPU, stacks, memory
    "kineto/tb_plugin_history/samples/resnet50_autograd_api_num_workers_0/worker0.pt.trace.json.gz",  # no steps
    "hta/trace_filter",  # two ranks, NCCL
    "hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "hta/triton_example/triton_example.json.gz",
    "hta/with_gpu_user_annotation/step_based_trace_2543932.json.gz",
    "kineto/docs/traces/after_fix_trace.json",
)


SECTION_DEFS = {
    sections.LaunchSummary: "launch", sections.StepDeviceSummary: "step_device", sections.BlameSummary: "blame",
    sections.BlameStep: "blame_step", sections.BlameCause: "blame_cause", sections.PeerWaits: "peer_waits",
    sections.PeerStep: "peer_step", sections.PeerCause: "peer_cause", sections.SyncSummary: "syncs",
    sections.CompileSummary: "compile", sections.CompiledSummary: "compiled",
    sections.CompiledRegion: "compiled_region", sections.Compilation: "compilation",
    sections.CollectiveRow: "collective_row", sections.CommSummary: "comm", sections.DistributedSummary: "distributed",
    sections.ModulesSummary: "modules", sections.ModuleRow: "module_node", sections.RooflineSummary: "roofline",
    sections.RooflineOp: "roofline_op",
}  # fmt: skip


def schema(name: str) -> dict:
    return json.loads(resources.files("skalpel.result").joinpath(name).read_text())


def validator(name: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(schema(name))


@pytest.mark.parametrize("name", ["report.schema.json", "diff.schema.json"])
def test_schemas_are_valid_and_ship_in_the_package(name: str) -> None:
    jsonschema.Draft202012Validator.check_schema(schema(name))


def test_schema_keeps_the_design_keys() -> None:
    report = schema("report.schema.json")
    assert set(report["required"]) >= {"schema", "source", "steps", "ranks", "findings"}
    rank = report["$defs"]["rank"]["properties"]
    assert {"rank", "step_breakdown_pct", "gpu", "memory", "top_ops"} <= set(rank)
    breakdown = set(rank["step_breakdown_pct"]["properties"])
    assert breakdown == {"kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_exec", "other"}


def test_schema_documents_every_model_field() -> None:
    """A field added to the Report model must be added to report.schema.json as well."""
    defs = schema("report.schema.json")
    where = {
        model.Report: defs["properties"], model.Source: defs["properties"]["source"]["properties"],
        model.StepStats: defs["properties"]["steps"]["properties"], model.CaptureInfo: defs["$defs"]["capture"]["properties"],
        model.RankReport: defs["$defs"]["rank"]["properties"], model.GpuSummary: defs["$defs"]["gpu"]["properties"],
        model.MemorySummary: defs["$defs"]["memory"]["properties"], model.OpRow: defs["$defs"]["op"]["properties"],
        model.KernelRow: defs["$defs"]["kernel"]["properties"], model.Finding: defs["$defs"]["finding"]["properties"],
        model.AcrossRanks: defs["$defs"]["across"]["properties"], model.JobSummary: defs["$defs"]["job"]["properties"],
        model.MetricSpread: defs["$defs"]["job"]["properties"]["metrics"]["items"]["properties"],
        model.RankGroup: defs["$defs"]["job"]["properties"]["groups"]["items"]["properties"],
        model.CollectiveSpread: defs["$defs"]["job"]["properties"]["collectives"]["items"]["properties"],
    }  # fmt: skip
    extra = defs["$defs"]["rank"]["properties"]["extra"]["properties"]
    assert list(extra) == list(sections.SECTIONS)  # a rank's sections are written under "extra", in this order
    where[model.RankReport] = {**where[model.RankReport], **extra}
    where.update({cls: defs["$defs"][name]["properties"] for cls, name in SECTION_DEFS.items()})
    missing = [f"{cls.__name__}.{f.name}" for cls, props in where.items() for f in dataclasses.fields(cls) if f.name not in props]
    assert missing == []


def test_full_report_validates_and_broken_ones_do_not() -> None:
    check = validator("report.schema.json")
    document = json.loads(full_report().to_json())
    check.validate(document)
    broken = json.loads(json.dumps(document))
    broken["findings"][0]["severity"] = "fatal"
    assert not check.is_valid(broken)
    broken = json.loads(json.dumps(document))
    del broken["steps"]
    assert not check.is_valid(broken)
    broken = json.loads(json.dumps(document))
    broken["ranks"][0]["top_ops"][0]["calls"] = "many"
    assert not check.is_valid(broken)
    broken = json.loads(json.dumps(document))
    broken["schema"] = "skalpel.report/2"
    assert not check.is_valid(broken)


@pytest.mark.slow
@pytest.mark.parametrize("relative", CORPUS)
def test_analyze_json_on_corpus_traces_validates(relative: str, tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    assert main(["analyze", str(corpus(relative)), "--json", str(out)]) == 0
    document = json.loads(out.read_text())
    validator("report.schema.json").validate(document)
    assert model.Report.from_dict(document).to_json() == out.read_bytes()  # reads back to the same bytes


def test_analyze_json_to_stdout_validates(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    relative = "hta/critical_path/cuda_event_sync/event_sync_trace.json.gz"
    assert main(["analyze", str(corpus(relative)), "--json"]) == 0
    validator("report.schema.json").validate(json.loads(capsys.readouterr().out))
