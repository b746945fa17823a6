"""A fake Slack (Web API, Socket Mode, Events API requests) that the real slack_sdk
(3.48) and slack_bolt (1.30) async clients talk to.

    async with FakeSlack() as fake:
        fake.world.add_user("U1", "alice")
        app = fake.world.add_app("A1", "echo", bot_id="B1", bot_user_id="UBOT")
        fake.world.add_channel("C1", "general", "U1", "UBOT")
        bolt = AsyncApp(client=fake.web_client("A1"))
        handler = AsyncSocketModeHandler(bolt, app.app_token)
        await handler.connect_async()
        await fake.user_says("C1", "U1", "hello <@UBOT>")
        await fake.wait_for_messages("C1", 2)

The modules, each built on those before it:

- world.py: the workspace (team id), people, apps with their bot user and xoxb-/xapp-
  tokens, channels (public `C...`, DMs `D...`) and their members;
- payloads.py: messages, message events in event_callback bodies, users.info and
  conversations.info objects, slash-command fields, the v0 request signature;
- socket.py: Socket Mode: envelopes pending per app until acked, the websocket
  (hello, envelopes, acks), redelivery of pending envelopes on each new connection,
  `close_sockets`, `send_disconnect`, `lose_next_acks` (an ack lost on the way);
- api.py: the Web API (`/api/<method>`): auth.test, apps.connections.open,
  chat.postMessage (delivers a message event to every app in the channel, the
  sender's own included, as Slack does), chat.postEphemeral, conversations.info,
  users.info; `rate_limit_next` (one or more 429s), `disconnect_next` (done, then the
  connection cut before the answer), `fail_next` (not done: an edge proxy's answer,
  a plain-text 503 by default); unknown methods answered `unknown_method`;
  a reply in a thread carries `parent_user_id`, as Slack's do;
- fake.py: FakeSlack itself, its lifecycle, what people do (`user_says`,
  `integration_says` for a workflow's bot_message, `edit`, `delete`,
  `invoke_command`) and signed Events API requests to an app's URL (`post_event`,
  `post_command`, `url_verification`, `post_raw`).

Known simplifications: the fake sends nothing by itself to Events API (HTTP) apps,
tests call `post_event`; no scopes (a bot token may call every method); a bot may
post only in channels its bot user is a member of (no chat:write.public); no
blocks, attachments or reactions; edits and deletions only as events; thread
parents get no reply_count; envelopes go to an app's newest socket only; a socket
URL stays valid forever.

Everything is recorded (`calls`, `unknown_methods`, each channel's `messages`,
`envelopes`, `acks`, `connections`, `ephemeral`, `http_posts`) and every change
notifies one asyncio.Condition, so tests wait with deadlines (`wait_until`,
`wait_for_messages`).
"""

from tests.fakes.slack.api import ApiError, Ephemeral, WebApi, WebCall
from tests.fakes.slack.fake import FakeSlack, HttpResult
from tests.fakes.slack.payloads import signature
from tests.fakes.slack.socket import Ack, Envelope
from tests.fakes.slack.world import FakeApp, FakeChannel, FakeUser, Json, World

__all__ = [
    "Ack",
    "ApiError",
    "Envelope",
    "Ephemeral",
    "FakeApp",
    "FakeChannel",
    "FakeSlack",
    "FakeUser",
    "HttpResult",
    "Json",
    "WebApi",
    "WebCall",
    "World",
    "signature",
]
