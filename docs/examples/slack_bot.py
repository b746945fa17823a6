"""Slack Bolt's quickstart app (asyncio, Socket Mode), guarded by botbouncer.

    pip install 'botbouncer[slack]'
    SLACK_BOT_TOKEN=xoxb-... SLACK_APP_TOKEN=xapp-... BOTBOUNCER_CONFIG=botbouncer.yml \\
        python slack_bot.py

The app is Bolt for Python's own (it answers a message containing "hello"
with "Hey there <@you>!") plus one line, `guard(app, Bouncer(...))`. The
config names a bot with `mode: decide` and `platform: slack`, shaped like
docs/examples/sidecar.yml:

    bots:
      - name: helper
        platform: slack
        mode: decide
        respond_to: all        # the app answers messages that do not mention it
        rate_cap: {max_replies: 2}

BOTBOUNCER_BOT picks the bot by name when the config has several (default:
the first with `mode: decide`). SLACK_API_BASE (optional) points the app at
another Web API than https://slack.com/api/. tests/test_middleware_slack.py
runs `build` and `main` against a fake Slack.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from typing import Any

from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp
from slack_bolt.context.say.async_say import AsyncSay
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from botbouncer import Bouncer, ConfigError
from botbouncer.slack import SlackGuard, guard


def build(bouncer: Bouncer, client: AsyncWebClient) -> tuple[AsyncApp, SlackGuard]:
    """The app, guarded, with the quickstart's listener; and its guard."""
    app = AsyncApp(client=client)
    slack_guard = guard(app, bouncer)

    # Listens to incoming messages that contain "hello"
    @app.message("hello")
    async def message_hello(message: dict[str, Any], say: AsyncSay) -> None:
        # say() sends a message to the channel where the event was triggered
        await say(f"Hey there <@{message['user']}>!")

    return app, slack_guard


async def serve(bouncer: Bouncer, bot_token: str, app_token: str) -> int:
    base_url = os.environ.get("SLACK_API_BASE") or AsyncWebClient.BASE_URL
    async with bouncer:
        app, slack_guard = build(bouncer, AsyncWebClient(token=bot_token, base_url=base_url))
        try:  # Socket Mode would retry a refused token for ever: checked once here
            await app.client.auth_test()
        except SlackApiError as exc:
            print(f"slack_bot.py: Slack refused SLACK_BOT_TOKEN: {exc.response.get('error')}",
                  file=sys.stderr)  # fmt: skip
            return 2
        handler = AsyncSocketModeHandler(app, app_token)
        try:
            await handler.start_async()  # type: ignore[no-untyped-call]
        finally:
            await handler.close_async()  # type: ignore[no-untyped-call]
            await slack_guard.close()  # settles what it holds in the store, then the Bouncer closes
    return 0


def main() -> int:
    bot_token, app_token = os.environ.get("SLACK_BOT_TOKEN"), os.environ.get("SLACK_APP_TOKEN")
    if not bot_token or not app_token:
        print("slack_bot.py: set SLACK_BOT_TOKEN (xoxb-) and SLACK_APP_TOKEN (xapp-)",
              file=sys.stderr)  # fmt: skip
        return 2
    config = os.environ.get("BOTBOUNCER_CONFIG", "botbouncer.yml")
    try:
        bouncer = Bouncer(config, bot=os.environ.get("BOTBOUNCER_BOT") or None, platform="slack")
    except ConfigError as exc:
        print(f"slack_bot.py: {exc}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(serve(bouncer, bot_token, app_token))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stdout)
    sys.exit(main())
