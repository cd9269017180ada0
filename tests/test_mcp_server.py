"""``skalpel mcp``: the MCP SDK's own client starts the server over stdio, lists its tools and calls them; the
answers are the CLI's JSON, and a bad path or a trace that does not load is an error result, the server going on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import corpus, importorskip

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
TRACE = "hta/trace_filter/sampled_rank-0.json.gz"


def _session(calls: list[tuple[str, dict]]) -> tuple[list, list]:
    """Start ``skalpel mcp`` with the SDK's stdio client; the tools it lists and the result of each call, in order."""
    anyio = importorskip("anyio")
    importorskip("mcp")
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(command=sys.executable, args=["-m", "skalpel", "mcp"],
                                   env={"PYTHONPATH": str(REPO / "src")}, cwd=str(REPO))  # fmt: skip

    async def talk() -> tuple[list, list]:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            tools = (await session.list_tools()).tools
            return tools, [await session.call_tool(name, arguments) for name, arguments in calls]

    return anyio.run(talk)


def _cli_json(*args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "skalpel", *args, "--json", "-"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")}, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_tools_answer_as_the_cli_and_errors_leave_the_server_running(tmp_path) -> None:
    trace = str(corpus(TRACE))
    cut = tmp_path / "cut.json"
    cut.write_text('{"traceEvents": [')
    tools, (report, missing, damaged, explained, unknown, diffed) = _session([
        ("analyze", {"paths": [trace]}),
        ("analyze", {"paths": [str(tmp_path / "missing")]}),
        ("analyze", {"paths": [str(cut)]}),
        ("explain", {"finding_id": "dataloader_bound"}),
        ("explain", {"finding_id": "no_such_finding"}),
        ("diff", {"before": trace, "after": trace}),  # after the errors: the server still answers
    ])  # fmt: skip
    assert {tool.name for tool in tools} == {"analyze", "explain", "diff", "run", "tune"}
    assert all(tool.description for tool in tools)

    assert not report.is_error
    got = report.structured_content["report"]
    assert got["schema"] == "skalpel.report/1" and got["findings"]
    assert got["findings"] == _cli_json("analyze", trace)["findings"]  # ids, evidence, locations: the CLI's own
    assert got["findings"][0]["title"][:40] in " ".join(report.structured_content["verdict"].split())

    for failed, words in ((missing, "no such file or folder"), (damaged, "cut off before its first complete event"),
                          (unknown, "unknown finding id 'no_such_finding'")):  # fmt: skip
        assert failed.is_error
        text = failed.content[0].text
        assert words in text and "\n" not in text and "Traceback" not in text, text

    assert not explained.is_error and explained.structured_content["explanation"]["id"] == "dataloader_bound"
    assert not diffed.is_error and diffed.structured_content["diff"]["schema"].startswith("skalpel.diff")


def test_run_profiles_a_script_and_keeps_its_folder(tmp_path) -> None:
    script = str(REPO / "examples" / "scenarios" / "dataloader_starved.py")
    _, (ran, failed) = _session([
        ("run", {"script": script, "out": str(tmp_path / "run")}),
        ("tune", {"script": str(tmp_path / "no_such_script.py")}),
    ])  # fmt: skip
    assert not ran.is_error, ran.content[0].text
    got = ran.structured_content
    assert got["report"]["folder"] == str(tmp_path / "run") and (tmp_path / "run" / "report.html").is_file()
    assert "dataloader_bound" in {finding["id"] for finding in got["report"]["findings"]}
    assert "dataloader_bound" in got["verdict"]
    assert failed.is_error and "no_such_script.py" in failed.content[0].text


CRASHES = """
import sys
import torch

model = torch.nn.Linear(64, 64)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(20):
    model(torch.randn(16, 64)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    print("a chatty line on stdout, the server's channel", step)
    if step == int(sys.argv[1]):
        raise RuntimeError("CUDA error: an illegal memory access was encountered\\nsecond line")
"""


def test_a_script_that_crashes_is_said_in_one_line_with_its_error(tmp_path) -> None:
    script = tmp_path / "crashes.py"
    script.write_text(CRASHES)
    _, (early, late, after) = _session([
        ("run", {"script": str(script), "args": ["2"], "out": str(tmp_path / "early")}),  # before any recorded step
        ("run", {"script": str(script), "args": ["15"], "out": str(tmp_path / "late")}),  # after the window
        ("explain", {"finding_id": "host_bound"}),  # the server still answers
    ])  # fmt: skip
    said = "the script stopped with RuntimeError: CUDA error: an illegal memory access was encountered (exit status 1)"
    assert early.is_error
    text = early.content[0].text
    assert said in text and "before any step was recorded" in text, text
    assert "\n" not in text and "Traceback" not in text, text
    # the steps before the error were profiled: a report, and the agent is told the script failed
    assert not late.is_error, late.content[0].text
    assert late.structured_content["report"]["script_error"] == said
    assert late.structured_content["verdict"].startswith(said + "\n")
    assert not after.is_error
