"""The MCP proxy (docs/mcp-proxy.md): `botbouncer mcp-proxy`, the agent guard
in front of any MCP server, for any MCP client.

- gateway/mcpproxy/calls.py: what is done to a `tools/call` and its answer;
- gateway/mcpproxy/stdio.py: the stdio transport (the server as a child);
- gateway/mcpproxy/http.py: streamable HTTP in front of a server's URL;
- gateway/mcpproxy/main.py: the command, its guard and its store.
"""
