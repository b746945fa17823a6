"""A small MCP server for docs/mcp-proxy.md: `search` finds nothing, the same
way each time; `searches_run` says how often search really ran."""

from mcp.server.mcpserver import MCPServer

server = MCPServer("search")
ran = 0


@server.tool()
def search(query: str) -> str:
    """Search the catalogue."""
    global ran
    ran += 1
    return f"no results for {query!r}"


@server.tool()
def searches_run() -> int:
    """How many times search ran."""
    return ran


if __name__ == "__main__":
    server.run("stdio")
