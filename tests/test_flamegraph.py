"""Flame graph (SVG and speedscope) from the trace model: a fresh CPU capture and a stored GPU trace."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET

import pytest
import torch

import skalpel
from skalpel.analysis.call_tree import merged_tree, thread_stacks
from skalpel.report import flamegraph
from skalpel.trace import Kind, load

from .conftest import corpus
from .tracebuilder import TraceBuilder

SVG = "{http://www.w3.org/2000/svg}"


def _batches(count: int):
    for _ in range(count):
        yield torch.randn(8, 16), torch.randn(8, 1)


def train_step(model, optimizer, x, y) -> None:
    with torch.profiler.record_function("my_region"):
        loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    torch.set_num_threads(1)
    folder = tmp_path_factory.mktemp("flame")
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 16), torch.randn(64, 1)), batch_size=8)
    with skalpel.profile(wait=0, warmup=1, active=3, out=folder, write=False) as run:
        for x, y in loader:
            train_step(model, optimizer, x, y)
            run.step()
    return load(run.trace_paths)


def _frames(svg_text: str) -> list[tuple[float, float, float, str]]:
    """(x, y, width, tooltip) of every drawn frame."""
    root = ET.fromstring(svg_text)
    frames = []
    for group in root.iter(f"{SVG}g"):
        rect, title = group.find(f"{SVG}rect"), group.find(f"{SVG}title")
        frames.append((float(rect.get("x")), float(rect.get("y")), float(rect.get("width")), title.text))
    return frames


def test_svg_frames_are_labelled_and_sized_by_time(captured) -> None:
    svg = flamegraph.render_svg(captured, rank=0)
    frames = _frames(svg)
    root_x, root_y, root_width, root_tip = frames[0]
    assert root_tip.startswith("all\n") and root_width == pytest.approx(flamegraph.WIDTH - 2 * flamegraph.PAD)
    total_ms = float(re.search(r"([\d.]+) ms \(100\.0%\)", root_tip).group(1))
    for x, y, width, tip in frames[1:]:
        milliseconds = float(re.search(r"\n([\d.]+) ms", tip).group(1))
        rounding = root_width * 0.001 / total_ms + 0.01  # the tooltips (frame and total) round to 1 us
        assert width == pytest.approx(root_width * milliseconds / total_ms, abs=rounding)  # width = time
        assert root_x - 0.01 <= x and x + width <= root_x + root_width + 0.05
    # The planted frame is drawn whatever its share; whether its label fits depends on its width, i.e. on how
    # the load spread the wall time (13% of the steps once, its label cut to "train_step (test_fla.."): the
    # labels are checked on a trace with fixed timings below.
    (step,) = [tip for _, _, _, tip in frames if re.match(r"[^\n]*test_flamegraph\.py\(\d+\): train_step\n", tip)]
    assert float(re.search(r"\n([\d.]+) ms", step).group(1)) > 0
    assert "my_region" in svg and "aten::addmm" in svg


def test_svg_labels_frames_wide_enough_and_leaves_out_the_narrowest(tmp_path) -> None:
    """Fixed timings (10 ms of steps): a frame's label is whole, cut with "..", or absent by its width alone."""
    builder = TraceBuilder()
    builder.step(1, 0, 10_000)
    builder.frame("/home/user/project/train.py(10): <module>", 0, 10_000)
    builder.frame("/home/user/project/train.py(20): train_step", 100, 8_000)  # 80%: 944 px
    builder.host("aten::addmm", 200, 6_000)
    builder.frame("/home/user/project/train.py(30): load_batch", 8_200, 700)  # 7%: 82.6 px, 11 characters
    builder.frame("/home/user/project/train.py(40): log", 9_000, 160)  # 1.6%: 18.9 px, room for 1 character: none
    builder.frame("/home/user/project/train.py(50): tick", 9_200, 2)  # 0.02%: 0.24 px, under MIN_PX
    svg = flamegraph.render_svg(load(builder.write(tmp_path / "trace.json")), rank=0)
    drawn = {}
    for group in ET.fromstring(svg).iter(f"{SVG}g"):
        text = group.find(f"{SVG}text")
        drawn[group.find(f"{SVG}title").text.split("\n")[0]] = None if text is None else text.text
    where = "/home/user/project/train.py"
    assert drawn[f"{where}(10): <module>"] == "<module> (train.py:10)"
    assert drawn[f"{where}(20): train_step"] == "train_step (train.py:20)"
    assert drawn["aten::addmm"] == "aten::addmm"
    assert drawn[f"{where}(30): load_batch"] == "load_batc.."
    assert drawn[f"{where}(40): log"] is None
    assert f"{where}(50): tick" not in drawn


def test_record_function_ranges_sit_under_the_frame_that_opened_them(captured) -> None:
    root = merged_tree(captured, thread_stacks(captured, 0))

    def find(node, name):
        if node.name == name:
            return node
        for child in node.children.values():
            found = find(child, name)
            if found:
                return found
        return None

    step = next(node for node in _walk(root) if node.name.endswith(": train_step"))
    region = step.children.get("my_region")
    assert region is not None and region.total_us > 0  # not buried inside record_function's __enter__
    assert find(region, "aten::addmm") is not None  # the ops of the region are below it
    loader = next(node for node in _walk(root) if node.kind == Kind.DATALOADER)
    assert loader.children  # the fetch's Python frames are below the DataLoader range
    for node in _walk(root):  # callees never add up to more than their caller (siblings never overlap)
        assert sum(child.total_us for child in node.children.values()) <= node.total_us * (1 + 1e-9) + 1e-6


def _walk(node):
    yield node
    for child in node.children.values():
        yield from _walk(child)


def _check_speedscope(text: str) -> dict:
    document = json.loads(text)
    assert document["$schema"] == "https://www.speedscope.app/file-format-schema.json"
    frame_count = len(document["shared"]["frames"])
    for profile in document["profiles"]:
        assert profile["type"] == "evented" and profile["unit"] == "microseconds"
        open_frames: list[int] = []
        last = profile["startValue"]
        for event in profile["events"]:
            assert event["at"] >= last and 0 <= event["frame"] < frame_count
            last = event["at"]
            if event["type"] == "O":
                open_frames.append(event["frame"])
            else:
                assert open_frames.pop() == event["frame"]
        assert not open_frames and last <= profile["endValue"]
    return document


def test_speedscope_events_are_balanced_and_ordered(captured) -> None:
    document = _check_speedscope(flamegraph.render_speedscope(captured, rank=0))
    python = [frame for frame in document["shared"]["frames"] if frame["name"] == "train_step"]
    assert python and python[0]["file"].endswith("test_flamegraph.py") and python[0]["line"] > 0


def test_stored_gpu_trace_with_stacks() -> None:
    trace = load(corpus("extra/AMD-AGI__TraceLens/tests/traces/h100/gaunernst_bert-small-uncased__1016001.json.gz"))
    rank = trace.rank_ids[0]
    svg = flamegraph.render_svg(trace, rank=rank)
    assert len(_frames(svg)) > 20 and "Python stacks and ops" in svg
    _check_speedscope(flamegraph.render_speedscope(trace, rank=rank))


def test_stored_trace_without_stacks_still_draws_ops() -> None:
    trace = load(corpus("kineto/tb_plugin/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"))
    rank = trace.rank_ids[0]
    svg = flamegraph.render_svg(trace, rank=rank)
    assert "ops only" in svg and len(_frames(svg)) > 20 and "aten::conv2d" in svg
    _check_speedscope(flamegraph.render_speedscope(trace, rank=rank))


def test_rank_without_events(captured) -> None:
    svg = flamegraph.render_svg(captured, rank=7)
    assert "no host events" in svg
    ET.fromstring(svg)
    assert json.loads(flamegraph.render_speedscope(captured, rank=7))["profiles"] == []
