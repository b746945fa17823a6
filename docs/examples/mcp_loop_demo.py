"""An MCP client stuck on one call, through `botbouncer mcp-proxy`
(docs/mcp-proxy.md): run from the repository's root,

    .venv/bin/python docs/examples/mcp_loop_demo.py
"""

import asyncio
import os
import shutil
import sys
from typing import TextIO

from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

# What an MCP client's config would say: the proxy as the command, the real
# server after `--`. The proxy is the botbouncer installed beside this Python
# (.venv/bin/botbouncer from a clone), else the one on PATH.
BESIDE = os.path.join(os.path.dirname(sys.executable), "botbouncer")
SERVER = StdioServerParameters(
    command=BESIDE if shutil.which(BESIDE) else "botbouncer",
    args=["mcp-proxy", "--", sys.executable, "docs/examples/mcp_search_server.py"],
)


async def main(errlog: TextIO) -> None:
    async with (
        stdio_client(SERVER, errlog=errlog) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        for attempt in range(1, 6):
            result = await session.call_tool("search", {"query": "tide tables"})
            texts = " | ".join(block.text for block in result.content)  # type: ignore[union-attr]
            print(f"{attempt}: {'error' if result.is_error else 'ok'}: {texts}")
        ran = await session.call_tool("searches_run", {})
        print(f"the server ran search {ran.structured_content['result']} times")  # type: ignore[index]


# The proxy's stderr (a WARNING line for each block, as an MCP client's log
# shows it) is left out here: this prints what the model is told.
with open(os.devnull, "w") as quiet:
    asyncio.run(main(quiet))
