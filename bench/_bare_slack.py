"""The plainest Slack Bolt echo app: bench/e2e_slack.py's baseline.

    python bench/_bare_slack.py BOT_TOKEN APP_TOKEN API_BASE [docs|session]

Bolt for Python's quickstart as its documentation writes it for asyncio and
Socket Mode (docs.slack.dev/tools/bolt-python: "Getting started", the app
that listens with `@app.message(...)` and answers with `say(...)`; "Using
Socket Mode", section "Using Async (asyncio)": an `AsyncApp` and
`AsyncSocketModeHandler(app, app_token).start_async()` under `asyncio.run`),
with one listener that echoes every message's text back. The only changes:

- the tokens come from the command line, not SLACK_BOT_TOKEN/SLACK_APP_TOKEN,
  and the app's client is an `AsyncWebClient(token, base_url=API_BASE)`
  pointed at the benchmark's fake Slack (Socket Mode asks that client for its
  websocket URL, so the socket goes to the fake too);
- `say(..., thread_ts=message.get("thread_ts"))`: a message in a thread is
  answered in the thread, as botbouncer's adapter answers; `say` alone posts
  to the channel. The benchmark's messages are top-level, so the call is the
  docs' `say(text)` (botbouncer answers a top-level message at top level too);
- SIGTERM or SIGINT closes the Socket Mode client and the process exits 0
  (`start_async` sleeps forever and has no stop of its own);
- warnings and errors are logged with their level (Python's default level,
  WARNING, as the docs leave it: nothing is written per message).

Bolt's defaults stay: `process_before_response` off (the envelope is acked
before the listener runs), its middleware (single-team authorization from
one auth.test, ignoring the app's own messages, the `message` event's
listener matching), the aiohttp Socket Mode client with its 10 s ping.

`docs` (the default) leaves the client as the docs make it: an
AsyncWebClient without a session opens a new aiohttp ClientSession, so a new
connection, for every Web API call, each `say` included. `session` hands it
one aiohttp session for the process (the `session=` argument slack_sdk
offers), as botbouncer's adapter does: a baseline without that cost.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from typing import Any

import aiohttp
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.app.async_app import AsyncApp
from slack_sdk.web.async_client import AsyncWebClient


def build(bot_token: str, api_base: str, session: aiohttp.ClientSession | None) -> AsyncApp:
    app = AsyncApp(client=AsyncWebClient(token=bot_token, base_url=api_base, session=session))

    @app.message()
    async def echo(message: dict[str, Any], say: Any) -> None:
        await say(message["text"], thread_ts=message.get("thread_ts"))

    return app


async def main(bot_token: str, app_token: str, api_base: str, client: str) -> None:
    session = aiohttp.ClientSession() if client == "session" else None
    app = build(bot_token, api_base, session)
    handler = AsyncSocketModeHandler(app, app_token)
    serving = asyncio.ensure_future(handler.start_async())  # type: ignore[no-untyped-call]
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    stop = asyncio.ensure_future(stopping.wait())
    await asyncio.wait([serving, stop], return_when=asyncio.FIRST_COMPLETED)
    crashed = serving.done()  # start_async ends only by failing
    await handler.close_async()  # type: ignore[no-untyped-call]
    for task in (serving, stop):
        task.cancel()
    await asyncio.gather(serving, stop, return_exceptions=True)
    if session is not None:
        await session.close()
    if crashed:
        serving.result()  # raises what ended it


if __name__ == "__main__":
    if len(sys.argv) not in (4, 5) or sys.argv[4:] not in ([], ["docs"], ["session"]):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    bot_token, app_token, api_base = sys.argv[1:4]
    asyncio.run(main(bot_token, app_token, api_base, sys.argv[4] if len(sys.argv) == 5 else "docs"))
