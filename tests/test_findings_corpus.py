"""For every stored corpus trace, the findings a performance engineer would expect, checked.

``expect`` maps a finding id to the lowest severity it must have; ``absent`` lists ids that
must not appear at warning or above. Every trace must also diagnose without a rule error.
Reasons are given beside each expectation (see ../shared/traces/*/README.md for the traces).
"""

from __future__ import annotations

from functools import lru_cache

import pytest

from skalpel.api import analyze
from tests.conftest import corpus

DEVICE_RULES = ("pageable_memcpy", "host_device_sync", "gpu_idle", "attention_hotspot")
TRACELENS = "extra/AMD-AGI__TraceLens/tests/traces/"
SEMANTIC = "extra/AMD-AGI__TraceLens/agent_evals/Analysis/partial_tests/"
DLRM = "extra/facebookresearch__param/et_replay/tests/inputs/dlrm_kineto_extracted/"
RESNET_NW0 = "kineto/tb_plugin/samples/resnet50_num_workers_0/"
RESNET_NW4 = "kineto/tb_plugin/samples/resnet50_num_workers_4/"
SLOW = pytest.mark.slow

# (path, {id: minimum severity}, ids absent at warning+, marks)
CASES = [
    # TensorBoard plugin samples: num_workers=0 waits 33% / 23% for data (the plugin's own numbers), 4 workers do not.
    (RESNET_NW0 + "worker0.1623143089861.pt.trace.json.gz", {"dataloader_bound": "critical", "gpu_idle": "warning",
     "pageable_memcpy": "info"}, ("launch_bound",), ()),
    (RESNET_NW0 + "worker0.1623143566756.pt.trace.json.gz", {"dataloader_bound": "warning", "pageable_memcpy": "info"},
     ("launch_bound",), ()),
    (RESNET_NW4 + "worker0.1623212756351.pt.trace.json.gz", {"pageable_memcpy": "info", "no_bottleneck": "info"},
     ("dataloader_bound", "gpu_idle", "launch_bound", "hot_op"), ()),
    (RESNET_NW4 + "worker0.1623213129365.pt.trace.json.gz", {"pageable_memcpy": "info", "no_bottleneck": "info",
     "noisy_measurement": "info"}, ("dataloader_bound", "gpu_idle", "launch_bound"), ()),  # step-time cv 23%
    # Legacy autograd-profiler ResNet with num_workers=0: no steps; its first iteration takes 4.5 s of the 5.3 s window
    # (a 1.5 s first kernel launch, the first convolutions): cold_start. With that one-time work taken out, the loop's
    # iterations wait for data 18% of the time (5.8% of the whole window, start-up included): dataloader_bound, as
    # on the plugin's num_workers=0 samples. Its allocator calls come from the first iteration: not churn. gpu_idle
    # and launch_bound judge the 5 iterations after the first too: the device idles 36% of them, 74% of it while the
    # main process loads the batch (a warning, not the cold window's critical 81%); the rest is no launch-bound
    # idling (the 1.5 s first launch was the "launch bound" that fired on the whole window).
    ("kineto/tb_plugin_history/samples/resnet50_autograd_api_num_workers_0/worker0.pt.trace.json.gz",
     {"gpu_idle": "warning", "cold_start": "critical", "dataloader_bound": "warning"},
     ("allocator_churn", "launch_bound"), ()),
    # The plugin's GPU-metrics sample: DataLoader 5.4% (below 10%), GPU util 0.4%.
    ("kineto/tb_plugin/test/gpu_metrics_input.json", {"gpu_idle": "critical"}, ("dataloader_bound",), ()),
    ("kineto/docs/traces/before_fix_trace.json", {"no_bottleneck": "info"}, (), ()),  # mock test trace
    ("kineto/docs/traces/after_fix_trace.json", {"no_bottleneck": "info"}, (), ()),
    # HTA's sync micro-benchmarks: stream, event, device syncs and .item().
    # One 3.15 ms step in which the device works 0.05 ms: idle in the step, whatever HTA's span says.
    ("hta/critical_path/cuda_event_sync/event_sync_trace.json.gz", {"host_device_sync": "info", "gpu_idle": "critical"},
     (), ()),
    ("hta/critical_path/cuda_event_sync_multi_stream/event_sync_trace.json.gz", {"host_device_sync": "info"}, (), ()),
    # A benchmark from process start: the first aten::to creates the CUDA context (30 s of the 43 s window), and
    # one-time work is 96% of it: cold_start says so, and no steady-state rule judges the rest (issue 33).
    ("hta/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz",
     {"cold_start": "critical"}, ("gpu_idle", "host_device_sync", "attention_hotspot", "allocator_churn",
     "device_activity_missing"), ()),
    # gloo all_reduce holds its one step: a collective, communication_bound's, not one op holding the step.
    ("hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz", {}, DEVICE_RULES + ("launch_bound", "hot_op"), ()),
    # One compiled region, 0/0; its one 13 s marked step (compiling) runs 2 us of kernels: idle in the step.
    ("hta/triton_example/triton_example.json.gz", {"gpu_idle": "critical"}, ("recompilation",), ()),
    ("hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz", {"gpu_idle": "critical"}, (), ()),
    ("hta/with_gpu_user_annotation/step_based_trace_2543932.json.gz", {"gpu_idle": "critical"}, (), ()),
    ("hta/execution_trace/benchmark_simple_add_trace.json.gz", {"cold_start": "critical"}, ("gpu_idle",),
     ()),  # the first aten::rand creates the CUDA context: 19.6 s of the 19.8 s window, nothing steady to judge
    # A CUPTI range-profiler benchmark: the first conv2d (3 s, later ones 0.3 s) and addmm (1.8 s) are 41% of the
    # window. Its kernels are not linked to launches (range profiler): not "device activity missing".
    ("hta/cupti_profiler/benchmark_result_924719_1679055439_trace.json.gz", {"cold_start": "warning"},
     ("allocator_churn", "device_activity_missing"), ()),
    ("hta/mtia_inference_trace/mtia_inference_rank_0.json.gz", {"no_bottleneck": "info"}, ("hot_op",), ()),
    ("hta/nccl_parser_config/nccl_data.json.gz", {"gpu_idle": "critical"}, ("dataloader_bound",), ()),  # HTA: 77% idle
    # TorchRec training, ranks 0 and 1 of 128: all_to_all and all_gather barely overlap with compute.
    ("hta/trace_filter/sampled_rank-0.json.gz", {"gpu_idle": "warning", "low_comm_overlap": "warning"},
     ("attention_hotspot",), ()),
    ("hta/trace_filter/sampled_rank-1.json.gz", {"gpu_idle": "warning", "low_comm_overlap": "warning"},
     ("attention_hotspot",), ()),
    ("hta/negative_queue_length_values_check/rank0.json.gz", {"host_device_sync": "info", "gpu_idle": "critical"},
     ("memory_growth",), (SLOW,)),
    # DDP CNN on one V100: kernels fill 97% of the step; one sync every few steps costs no device time.
    ("hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz", {"no_bottleneck": "info"},
     ("host_device_sync", "gpu_idle", "hot_op"), (SLOW,)),
    ("hta/df_index_resolver/df_index_resolver.json.gz", {"gpu_idle": "warning"}, ("memory_growth",), (SLOW,)),
    # Recsys training: 25 syncs per step, but the device is kept busy after them (info notes that locate them).
    ("hta/trace_diff/control/control.json.gz", {"host_device_sync": "info"}, ("dataloader_bound", "host_device_sync"),
     (SLOW,)),
    ("hta/trace_diff/test/test.json.gz", {"host_device_sync": "info"}, ("dataloader_bound", "host_device_sync"), (SLOW,)),
    # Hugging Face inference on H100 / MI300: eager bmm+softmax attention against SDPA flash.
    # Their eager attention matrices (820 MiB, 1.8 GiB) are transients of a 2.5 / 4.2 GiB peak on an 80 GB H100:
    # room to spare, so no memory warning (the 1.8 GiB one is info: large in itself).
    (TRACELENS + "h100/google_owlv2-large-patch14-ensemble__1016001.json.gz",
     {"attention_hotspot": "warning"}, ("memory_spike",), (SLOW,)),
    # Its one 383 ms step keeps the device busy 158 ms (HTA's span, kernel to kernel, says 1% idle).
    (TRACELENS + "h100/facebook_timesformer-base-finetuned-k400__1016002.json.gz",
     {"attention_hotspot": "warning", "memory_spike": "info", "gpu_idle": "warning"}, ("memory_spike",), (SLOW,)),
    # GEMMs hold these devices: healthy, not hot_op (on a device only fallback kernels are judged).
    (TRACELENS + "h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz", {}, ("attention_hotspot", "hot_op"), ()),
    (TRACELENS + "mi300/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz", {}, ("attention_hotspot", "hot_op"), ()),
    (TRACELENS + "h100/gaunernst_bert-small-uncased__1016001.json.gz", {"gpu_idle": "critical"}, ("attention_hotspot",), ()),
    (TRACELENS + "h100/Falconsai_nsfw_image_detection__1016002.json.gz", {"gpu_idle": "critical"}, ("attention_hotspot",), ()),
    # vLLM eager decode on B200: thousands of tiny kernels, device idle; not graph-replayed.
    (TRACELENS + "b200/eager_trace.json.gz", {"launch_bound": "warning", "gpu_idle": "critical"}, ("attention_hotspot",), ()),
    # CUDA/HIP-graph replays: one graph launch feeds hundreds of kernels, so not launch bound.
    # Its first copy_ waits 463 ms in a synchronous hipMemcpy: a wait, not one-time work.
    (TRACELENS + "inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz", {}, ("launch_bound", "cold_start"), ()),
    (TRACELENS + "inference/vllm_decode_full/graph_execution.json.gz", {}, ("launch_bound",), ()),
    (TRACELENS + "inference/vllm_prefilldecode_piecewise/graph_execution.json.gz", {}, ("launch_bound",), ()),
    (SEMANTIC + "semantic_purity_deepseek_r1/B300/1782843274.7730265-TP-0-DECODE.trace.json.gz", {"no_bottleneck": "info"},
     ("launch_bound",), ()),
    (SEMANTIC + "semantic_purity_deepseek_r1/MI300/1782841132.2905657-TP-0-DECODE.trace.json.gz", {"no_bottleneck": "info"},
     ("launch_bound",), ()),
    (SEMANTIC + "semantic_purity_qwen3_30b_a3b/B300/1782799835.6885648-TP-0-DECODE.trace.json.gz", {"no_bottleneck": "info"},
     ("launch_bound",), ()),
    (SEMANTIC + "semantic_purity_qwen3_30b_a3b/MI300/1782859605.7198358-TP-0-DECODE.trace.json.gz", {"no_bottleneck": "info"},
     ("launch_bound",), ()),
    (TRACELENS + "inference/sglang_prefilldecode/sglang_Qwen3-8B_prefilldecode.json.gz", {"gpu_idle": "warning"}, (), (SLOW,)),
    # CUDA-graph capture: the kernels launched while capturing are recorded into a graph, not run.
    (TRACELENS + "inference/vllm_decode_full/capture_traces/graph_capture_rank_0.1773709742341309550.pt.trace.json.gz",
     {"gpu_idle": "critical"}, ("device_activity_missing",), (SLOW,)),
    (TRACELENS + "inference/vllm_prefilldecode_piecewise/capture_traces/graph_capture_rank_0.1773709679453551615.pt.trace.json.gz",
     {"gpu_idle": "critical"}, (), (SLOW,)),
    # torch.compile traces: compiled once (0/0), flash attention inside the graph despite a Triton kernel's name.
    (TRACELENS + "inference/xdit_sd_3.5/profile_trace_rank_0.json.gz", {"gpu_idle": "warning"},
     ("recompilation", "attention_hotspot"), (SLOW,)),
    (TRACELENS + "torch_compile_triton/trace.json.gz", {"no_bottleneck": "info"},
     ("recompilation", "attention_hotspot", "hot_op"), ()),
    (TRACELENS + "mi300/resnet_act_checkpoint.json.gz", {}, ("dataloader_bound", "attention_hotspot", "hot_op"), ()),
] + [
    # DLRM on 8 V100s, one step per file: every rank idles its GPU a third of the time or more.
    (DLRM + name, {"gpu_idle": "warning"}, ("attention_hotspot", "dataloader_bound"), ())
    for name in (
        "worker0_step_12.1694128201545.pt.trace.json.gz", "worker1_step_12.1694128201556.pt.trace.json.gz",
        "worker2_step_12.1694128201554.pt.trace.json.gz", "worker3_step_12.1694128201557.pt.trace.json.gz",
        "worker4_step_12.1694128201547.pt.trace.json.gz", "worker5_step_12.1694128201549.pt.trace.json.gz",
        "worker6_step_12.1694128201553.pt.trace.json.gz", "worker7_step_12.1694128201553.pt.trace.json.gz",
    )
]  # fmt: skip

ORDER = ("info", "warning", "critical")


@lru_cache(maxsize=4)
def _report(path: str):
    return analyze(corpus(path))


@pytest.mark.parametrize(
    ("path", "expect", "absent"),
    [pytest.param(path, expect, absent, marks=marks, id=path.split("/")[-2] + "/" + path.split("/")[-1][:40])
     for path, expect, absent, marks in CASES],
)  # fmt: skip
def test_expected_findings(path, expect, absent):
    report = _report(path)
    by_id: dict[str, list] = {}
    for finding in report.findings:
        by_id.setdefault(finding.id, []).append(finding)
    summary = [(f.id, f.severity, f.title) for f in report.findings if f.id != "not_judged"]
    for finding_id, minimum in expect.items():
        assert finding_id in by_id, f"{finding_id} expected: {summary}"
        best = max(ORDER.index(f.severity) for f in by_id[finding_id])
        assert best >= ORDER.index(minimum), f"{finding_id} below {minimum}: {summary}"
    for finding_id in absent:
        serious = [f for f in by_id.get(finding_id, ()) if f.severity != "info"]
        assert not serious, f"{finding_id} unexpected: {summary}"
    errors = [f.evidence["reason"] for f in by_id.get("not_judged", ()) if "rule error" in f.evidence["reason"]]
    assert not errors


def test_every_corpus_trace_has_expectations():
    listed = {path for path, *_ in CASES}
    stored = {
        str(path.relative_to(corpus("."))) for path in corpus(".").rglob("*.json*")
        if path.name.endswith((".json", ".json.gz")) and "execution_details" not in path.name
        and not path.name.endswith("_et.json.gz") and "gpu_metrics_expected" not in path.name
    }  # fmt: skip
    assert stored <= listed, sorted(stored - listed)


def test_cpu_only_trace_says_gpu_rules_do_not_apply():
    report = _report("hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")
    notes = [f for f in report.findings if f.id == "not_judged" and "no device activity" in f.evidence["reason"]]
    assert notes and all(rule in notes[0].evidence["rules"] for rule in DEVICE_RULES)


def test_locations_come_from_call_stacks_in_the_resnet_trace():
    report = _report(RESNET_NW0 + "worker0.1623143089861.pt.trace.json.gz")
    finding = next(f for f in report.findings if f.id == "dataloader_bound")
    assert finding.locations == ("resnet50_profiler_api.py:42 in <module>",)  # innermost user frame, not torch


def test_findings_lead_and_are_sorted_by_severity():
    report = _report(RESNET_NW0 + "worker0.1623143089861.pt.trace.json.gz")
    ranks = [("critical", "warning", "info").index(f.severity) for f in report.findings]
    assert ranks == sorted(ranks)
    assert report.findings[0].id == "dataloader_bound"
