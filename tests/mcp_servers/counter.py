"""An MCP server for the MCP proxy's tests, on the SDK's MCPServer (the
FastMCP of mcp 1.x): `python -m tests.mcp_servers.counter [stdio | http PORT]`.

`search` counts its calls in the file named by $COUNTER_FILE (the test reads
it: how often the server was really called); `calls_made` reads the count;
`slow_job` reports progress and log messages as it goes (pausing between
steps if asked: what a relay holds back then shows); `wait` sleeps (a
call to cancel: its cancellation is written to $CANCELLED_FILE); `fail`
always fails (isError); `echo` answers its text (the benchmark's trivial tool),
`work` the same after a pause (its tool that takes time)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio
from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("counter")
COUNTER = Path(os.environ.get("COUNTER_FILE", "/dev/null"))
CANCELLED = Path(os.environ.get("CANCELLED_FILE", "/dev/null"))


def _count() -> int:
    try:
        return int(COUNTER.read_text() or 0)
    except (OSError, ValueError):
        return 0


def _note(path: Path, text: str) -> None:
    path.write_text(text)


@server.tool()
def search(query: str) -> str:
    """Search the catalogue."""
    COUNTER.write_text(str(_count() + 1))
    return f"no results for {query}"


@server.tool()
def calls_made() -> int:
    """How many times search ran."""
    return _count()


@server.tool()
async def slow_job(steps: int, ctx: Context, pause: float = 0.0) -> str:
    """A job that reports its progress, `pause` seconds after each step."""
    for i in range(steps):
        await ctx.report_progress(i + 1, steps, f"step {i + 1}")
        await ctx.info(f"step {i + 1} of {steps}")
        await anyio.sleep(pause)
    return "done"


@server.tool()
async def wait(seconds: float) -> str:
    """Sleep, then answer."""
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        _note(CANCELLED, f"wait({seconds:g}) cancelled")  # no await: the scope is cancelled
        raise
    return "waited"


@server.tool()
def fail(reason: str) -> str:
    """Always fails."""
    raise ValueError(f"failed: {reason}")


@server.tool()
def echo(text: str) -> str:
    """Answer the text as it came (bench/mcp_proxy.py: a tool that does nothing)."""
    return text


@server.tool()
async def work(text: str, ms: float) -> str:
    """Answer the text after `ms` milliseconds (bench/mcp_proxy.py: a tool that takes time)."""
    await anyio.sleep(ms / 1000)
    return text


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
