"""memory_growth judges a leak by how soon it fills the device, not by its share of the peak.

A real H200 capture of a 32 MiB/step leak on a ~5 GiB footprint (0.6% of the peak a step, silent
under the old share-of-peak rule) must be named with its projection; beside it, synthetic
look-alikes: the same leak far from the device's limit (info), a device of unknown memory (the
share of the peak decides), a growth that levels off, a one-time allocation and allocator noise
(all quiet).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from skalpel.analysis.memory import memory
from skalpel.analysis.steps import segment_steps
from skalpel.api import analyze
from skalpel.diagnose import thresholds
from skalpel.trace.loader import load

from .tracebuilder import TraceBuilder

MIB, GIB = 2**20, 2**30
STEP_US = 10_000.0
H200 = [{"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150_109_880_320}]  # 139.8 GiB, as the real trace says
WATCH_LEAK = Path(__file__).resolve().parent / "traces" / "h200" / "watch_leak_capture.json.gz"


def _growth(path: Path):
    return [finding for finding in analyze(path).findings if finding.id == "memory_growth"]


def test_the_h200_watch_capture_names_the_leak_with_its_projection():
    (finding,) = _growth(WATCH_LEAK)
    evidence = finding.evidence
    assert finding.severity == "warning"
    assert evidence["growth_mib_per_step"] == pytest.approx(32.0) and evidence["rising_steps_pct"] == 100
    assert evidence["growth_pct_of_peak"] < thresholds.MEMORY_GROWTH.share_pct  # the old rule's silence
    assert evidence["capacity_mib"] == pytest.approx(150_109_880_320 / MIB)
    # (capacity - 5,377 MiB peak) / 32 MiB a step, at the 7.0 ms median step
    assert evidence["steps_to_full"] == pytest.approx(4306, abs=2)
    assert evidence["seconds_to_full"] == pytest.approx(4306 * 0.0070, rel=0.01)
    assert evidence["steps_to_full"] <= evidence["horizon_steps"] == thresholds.MEMORY_GROWTH.param("horizon_steps")
    projection = "at 32.0 MiB/step the 139.8 GiB device is full in ~4,300 steps (~30 s at 7.0 ms/step)"
    assert evidence["projection"] == projection and projection in finding.title
    assert finding.locations and all("watch_leak.py" in where for where in finding.locations)  # the script, not torch


def test_the_h200_curve_is_read_at_the_host_step_ends():
    """The device runs up to 33 ms behind the host: at the steps' device ends every allocation was long made."""
    trace = load([WATCH_LEAK])
    assert (trace.memory.addr > 0).all()  # each block's address, to pair frees with their allocations
    device = memory(trace, segment_steps(trace)).main_device(0)
    deltas = np.diff(np.array(device.step_end_bytes)) / MIB
    assert deltas.tolist() == pytest.approx([96.0, 32.0, 32.0, 32.0, 32.0], abs=0.1)


def _steps(builder: TraceBuilder, deltas: list[int], *, base: int, device_type: int = 1) -> None:
    """``base`` bytes held (weights), then one step per entry of ``deltas``: a 64 MiB temporary allocated and
    freed, and ``delta`` bytes more kept (negative: freed) by aten::clone at model.py:60."""
    held = base
    builder.memory(5, base, held, device_type=device_type)
    for number, delta in enumerate(deltas):
        start = 100 + number * STEP_US
        builder.step(number + 1, start, STEP_US - 1)
        builder.frame("model.py(60): forward", start + 5, 400)
        builder.host("aten::mm", start + 10, 100)
        builder.memory(start + 20, 64 * MIB, held + 64 * MIB, device_type=device_type)
        builder.memory(start + 90, -64 * MIB, held, device_type=device_type)
        builder.host("aten::clone", start + 200, 100)
        if delta:
            held += delta
            builder.memory(start + 210, delta, held, device_type=device_type)
        builder.launch(start + 120, 5, work_ts=start + 130, work_dur=5000)


def test_a_leak_on_a_big_footprint_near_the_limit_is_a_warning(tmp_path):
    builder = TraceBuilder()  # 16 GiB
    _steps(builder, [32 * MIB] * 6, base=12 * GIB)
    (finding,) = _growth(builder.write(tmp_path / "trace.json"))
    evidence = finding.evidence
    assert finding.severity == "warning" and evidence["growth_pct_of_peak"] < 1
    peak = 12 * GIB + 5 * 32 * MIB + 64 * MIB  # the last step's temporary on five steps' leak
    assert evidence["steps_to_full"] == pytest.approx((16 * GIB - peak) / (32 * MIB))  # 121 steps
    assert evidence["seconds_to_full"] == pytest.approx(evidence["steps_to_full"] * STEP_US / 1e6, rel=0.01)
    assert "the 16.0 GiB device is full in ~120 steps" in finding.title
    assert any("model.py:60" in where for where in finding.locations)


def test_the_same_slow_leak_far_from_the_limit_is_info(tmp_path):
    builder = TraceBuilder()
    builder.device_properties = H200
    _steps(builder, [2 * MIB] * 6, base=5 * GIB)  # ~69,000 steps from the limit: beyond the horizon
    (finding,) = _growth(builder.write(tmp_path / "trace.json"))
    assert finding.severity == "info"
    assert finding.evidence["steps_to_full"] > thresholds.MEMORY_GROWTH.param("horizon_steps")
    assert "~69,000 steps" in finding.title


def test_without_the_device_memory_the_share_of_the_peak_decides(tmp_path):
    small = TraceBuilder()
    small.device_properties = []  # no deviceProperties: the capacity is unknown
    _steps(small, [32 * MIB] * 6, base=5 * GIB)  # 0.6% of the peak a step
    assert _growth(small.write(tmp_path / "small.json")) == []
    large = TraceBuilder()
    large.device_properties = []
    _steps(large, [512 * MIB] * 6, base=4 * GIB)  # >= 5% of the peak a step
    (finding,) = _growth(large.write(tmp_path / "large.json"))
    assert finding.severity == "warning" and "steps_to_full" not in finding.evidence
    assert "device is full" not in finding.title


def test_host_memory_keeps_the_share_of_the_peak(tmp_path):
    builder = TraceBuilder()
    _steps(builder, [16 * MIB] * 6, base=64 * MIB, device_type=0)  # the host: no capacity in the trace
    (finding,) = _growth(builder.write(tmp_path / "trace.json"))
    assert finding.evidence["device"] == "cpu" and "capacity_mib" not in finding.evidence


@pytest.mark.parametrize(
    "deltas",
    [
        [512 * MIB, 256 * MIB, 0, 0, 0, 0, 0, 0],  # caches filled in the first steps, then level
        [0, 0, 6 * GIB, 0, 0, 0],  # one allocation kept (weights loaded late, a workspace)
        [3 * MIB, -5 * MIB, 4 * MIB, -2 * MIB, 0, 2 * MIB, -4 * MIB, 3 * MIB],  # allocator noise
    ],
    ids=["levels-off", "one-time", "noise"],
)
def test_look_alikes_near_the_limit_stay_quiet(tmp_path, deltas):
    builder = TraceBuilder()  # 16 GiB: a warning would need only a small projection
    _steps(builder, deltas, base=8 * GIB)
    assert _growth(builder.write(tmp_path / "trace.json")) == []


def _same_size_steps(builder: TraceBuilder, *, addresses: bool) -> None:
    """Per step two 32 MiB activations made and freed in model.py:60, and one 32 MiB copy kept in train.py:90."""
    held, size = 12 * GIB, 32 * MIB
    shared = 1 << 30  # the builder's one address for every block

    def addr(value: int) -> int:
        return value if addresses else shared

    builder.memory(5, held, held, addr=addr(1))
    for number in range(6):
        start = 100 + number * STEP_US
        builder.step(number + 1, start, STEP_US - 1)
        builder.frame("model.py(60): forward", start + 5, 400)
        for slot in range(2):
            builder.memory(start + 20 + slot, size, held + (slot + 1) * size, addr=addr(1000 + slot))
        for slot in range(2):
            builder.memory(start + 300 + slot, -size, held + (1 - slot) * size, addr=addr(1000 + slot))
        builder.frame("train.py(90): step", start + 500, 100)
        held += size
        builder.memory(start + 550, size, held, addr=addr(2000 + number))
        builder.launch(start + 120, 5, work_ts=start + 130, work_dur=5000)


def test_with_addresses_the_site_is_the_block_still_held_not_a_temporary_of_its_size(tmp_path):
    paired = TraceBuilder()
    _same_size_steps(paired, addresses=True)
    (finding,) = _growth(paired.write(tmp_path / "paired.json"))
    assert finding.locations == ("train.py:90 in step",)
    by_size = TraceBuilder()  # no usable addresses: every allocation of the kept size is a candidate
    _same_size_steps(by_size, addresses=False)
    (finding,) = _growth(by_size.write(tmp_path / "by_size.json"))
    assert finding.locations[0] == "model.py:60 in forward" and "train.py:90 in step" in finding.locations


def _losses_kept(path: Path, keep) -> Path:
    """A real CPU torch.profiler run of 8 steps that appends ``keep(loss)`` of an mse_loss on a 512 x 2048 batch."""
    import torch  # a dependency of skalpel: never skipped

    torch.set_num_threads(1)
    model, target, kept = torch.nn.Linear(256, 2048), torch.randn(512, 2048), []
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True, with_stack=True,
        schedule=torch.profiler.schedule(wait=0, warmup=1, active=6, repeat=1),
        on_trace_ready=lambda prof: prof.export_chrome_trace(str(path)),
    ) as prof:  # fmt: skip
        for _ in range(8):
            loss = torch.nn.functional.mse_loss(model(torch.randn(512, 256)), target)
            loss.backward()
            kept.append(keep(loss))
            prof.step()
    return path


@pytest.mark.slow
def test_a_list_of_detached_mse_losses_keeps_their_buffers_and_is_told_why(tmp_path):
    """F.mse_loss's 0-dim result has the 4 MiB elementwise buffer as its storage (pytorch/pytorch#185647): a list
    of its .detach() keeps 4 MiB a step. The finding names the op and the fix that works; .detach().clone() (4
    bytes a step) is the look-alike that stays quiet."""
    growth = [f for f in analyze(_losses_kept(tmp_path / "detach.json", lambda loss: loss.detach())).findings
              if f.id == "memory_growth"]  # fmt: skip
    assert growth, "a 4 MiB/step leak on the host must be named"
    assert growth[0].evidence["growth_mib_per_step"] == pytest.approx(4.0, abs=0.1)
    assert growth[0].evidence["kept_by_op"][0]["op"] == "aten::mse_loss"
    assert "185647" in growth[0].fix and "test_memory_growth.py" in growth[0].locations[0]
    cloned = analyze(_losses_kept(tmp_path / "clone.json", lambda loss: loss.detach().clone()))
    assert "memory_growth" not in {f.id for f in cloned.findings}
