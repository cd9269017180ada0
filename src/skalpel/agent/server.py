"""``skalpel mcp``: a Model Context Protocol server over stdio (the official SDK, the ``[mcp]`` extra).

Tools: analyze, explain, diff, run and tune. Each returns the JSON document the CLI writes (every finding with its
evidence: the numbers an agent may quote, and where in the code) and the text the CLI prints. A bad path, a trace
that does not load or a script that fails is an error result with skalpel's one-line message; the server goes on.
"""

from __future__ import annotations

from typing import Any

from ..errors import SkalpelError
from ..integrations.versions import check_version
from . import commands

LOW, HIGH = "2.3", "3"  # the MCP SDK releases tested
INSTRUCTIONS = (
    "skalpel is a profiler doctor for PyTorch. analyze reads torch.profiler traces or a skalpel run folder and "
    "names the bottleneck; run profiles a training script unchanged; diff compares two runs within their noise; "
    "tune reruns a script with each applicable fix and keeps only what measured faster; explain says what a "
    "finding id means. Quote numbers from a finding's evidence, and its locations (path:line)."
)


def build_server() -> Any:
    """The server and its tools (importing the SDK: only ``skalpel mcp`` does)."""
    check_version("MCP SDK", ("mcp",), LOW, HIGH, "mcp")
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    server = MCPServer("skalpel", instructions=INSTRUCTIONS, log_level="WARNING")

    def answered(call, key: str) -> dict[str, Any]:
        try:
            return call().as_tool_result(key)
        except SkalpelError as error:  # the one line the CLI would print, as the tool's error result
            raise ToolError(str(error)) from None

    @server.tool()
    def analyze(paths: list[str]) -> dict[str, Any]:
        """Diagnose stored traces: trace files, trace folders or a skalpel run folder (any torch.profiler output).
        Returns the skalpel.report/1 JSON (findings with evidence, locations and fix) and the verdict text."""
        return answered(lambda: commands.analyze(paths), "report")

    @server.tool()
    def explain(finding_id: str | None = None) -> dict[str, Any]:
        """What a finding id means: what it measures, its thresholds and the fix; every finding without an id."""
        return answered(lambda: commands.explain(finding_id), "explanation")

    @server.tool()
    def diff(before: str, after: str) -> dict[str, Any]:
        """What changed between two runs (run folders, report.json files or traces), with the noise taken into
        account. Returns the skalpel.diff/1 JSON and the text."""
        return answered(lambda: commands.diff(before, after), "diff")

    @server.tool()
    def run(script: str, args: list[str] | None = None, out: str | None = None) -> dict[str, Any]:
        """Profile a training script unchanged (skalpel run): its steps recorded with the expert defaults, the run
        folder written (``out``, or ./skalpel-runs/...). Returns the report JSON (with ``folder``) and summary."""
        return answered(lambda: commands.run(script, args or [], out=out), "report")

    @server.tool()
    def tune(script: str, args: list[str] | None = None, budget_s: float = 300.0) -> dict[str, Any]:
        """Rerun a script with each applicable fix (DataLoader workers, threads, torch.compile...), timed against
        the unchanged script; recommends only what measured faster. Takes up to budget_s seconds."""
        return answered(lambda: commands.tune(script, args or [], budget_s=budget_s), "tune")

    return server


def serve() -> int:
    """Serve over stdio until the client closes the connection."""
    build_server().run("stdio")
    return 0
