"""Slack end to end: messages/s and message-to-reply latency of Bolt for
Python's quickstart echo app (a) against botbouncer in front of the same echo
(b), both over Socket Mode on the fake Slack of tests/fakes/slack/, in one
invocation.

The contestants, each its own process, started once and kept for all its
runs (start-up is not measured):

- a: bench/_bare_slack.py, Bolt's quickstart as its docs write it for asyncio
  and Socket Mode ("Getting started" and "Using Socket Mode", async): an
  `AsyncApp` whose `@app.message()` listener answers `await say(text)`,
  `AsyncSocketModeHandler(app, app_token).start_async()`, Bolt's defaults
  (the envelope acked before the listener runs, its own messages ignored by
  its middleware), pointed at the fake by an `AsyncWebClient(base_url=...)`.
  E2E_BARE picks its Web API client: `docs` (the default) leaves it as the
  docs make it, without a session, so slack_sdk opens a new aiohttp session
  and connection for every call, each reply included; `session` gives it one
  aiohttp session for the process, as botbouncer's adapter has.
- b: the real daemon, `python -m gateway run -c <config>`: one Slack bot in
  Socket Mode (slack_sdk's aiohttp SocketModeClient, replies by
  AsyncWebClient.chat_postMessage), the echo backend, the store on a real
  Redis (a private redis-server, or REDIS_URL) or `memory://`, the rate cap
  lifted (max_replies 1,000,000, so every message is answered) and the
  machine-pace backstop off (the simulated people answer at machine pace by
  design). Its default INFO log, one decision line per message, stays on:
  that is the real cost.

Each contestant has its own fake Slack in this process, with one app (its
bot user U0BENCHBOT), CHATS public channels and USERS people, all members of
every channel. Message i of a run goes to channel i % CHATS from person
i % USERS, top-level (not in a thread: both bots answer a top-level message
at top level, Bolt's `say` and botbouncer's adapter alike), and reads
`<@U0BENCHBOT> r<run>m<i>`: it mentions the bot, which botbouncer's default
`respond_to: mentions` answers. Both bots echo the text, so the fake reports
each reply (its chat.postMessage) to `Replies` under the text's last word,
in O(1) (`BenchSlack`, a subclass here; the fake itself is unchanged). As
Slack does, the fake sends each reply back to the app as a message event
before it answers the POST: Bolt's middleware drops it, botbouncer decides it
from what it counted. bench/_e2e.py's `drive` keeps WINDOW messages in flight
(closed loop) and `alternate` runs a warm-up each, then a, b, a, b, ...
Between runs the fake forgets what it recorded. Each round prints b/a for
throughput, p50, p99 and CPU per message (the bot's process, plus
botbouncer's Redis when it is the benchmark's private one); at the end a line
per contestant splits the CPU by process, "fake+driver" being this process
while it serves that contestant. The contestant's lifecycle is
bench/_e2e.py's `Contestant`: subprocess output goes to files in a temporary
directory; a contestant that exits, posts a reply no message awaits, or
answers nothing for STALL_S (15) seconds ends the benchmark with its log's
last lines (exit 2).

Run from the repo root:  .venv/bin/python bench/e2e_slack.py
(E2E_MESSAGES, E2E_WINDOW, E2E_ROUNDS size it; E2E_STORES picks the stores;
E2E_BARE=session gives a its one session.)
The last line is `throughput_ratio=<b/a> p99_ratio=<b/a> p50_ratio=<b/a> cpu_ratio=<b/a>
cpu_with_redis_ratio=<b/a>` (targets: throughput >= 0.9, p99 <= 1.1, cpu, the
bot's process alone, <= 1.05), then the memory store's, prefixed `memory_`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for `tests`

import slack_bolt.version
import slack_sdk.version
from _e2e import MESSAGES, ROUNDS, WINDOW, Bench, Contestant, Replies
from _redis import ROOT

from tests.fakes.slack import FakeApp, FakeSlack, Json

HERE = Path(__file__).resolve().parent
NAME = "e2e_slack"
CHATS = 50
USERS = 8
APP_ID, BOT_ID, BOT_USER = "A0BENCH", "B0BENCH", "U0BENCHBOT"
CHANNELS = [f"C0BENCH{k:04d}" for k in range(CHATS)]
PEOPLE = [f"U0PERSON{u:02d}" for u in range(USERS)]
# a's Web API client: as the docs make it (a new connection per call) or on one session
BARE = os.environ.get("E2E_BARE", "docs")
if BARE not in ("docs", "session"):
    raise SystemExit(f"E2E_BARE={BARE!r}: must be 'docs' or 'session'")


class BenchSlack(FakeSlack):
    """The fake Slack, reporting each chat.postMessage to `replies` under the
    text's last word (both bots echo `<@U0BENCHBOT> r<run>m<i>`)."""

    def __init__(self, replies: Replies) -> None:
        super().__init__()
        self.replies = replies

    async def _post_message(self, app: FakeApp, params: Json) -> Json:
        answer = await super()._post_message(app, params)  # refused: ApiError, not a reply
        self.replies.arrived(str(params.get("text", "")).rpartition(" ")[2])
        return answer

    def forget(self) -> None:
        """Drop what the fake recorded (between runs, nothing in flight): its
        records would grow through the invocation, and so would the time
        this process's collector spends walking them."""
        for records in (self.calls, self.envelopes, self.acks, self.unknown_methods):
            records.clear()
        for channel in self.world.channels.values():
            channel.messages.clear()


class SlackContestant(Contestant[BenchSlack]):
    """The app on its own fake Slack: ready once its Socket Mode socket is
    open; a reply no message awaited fails its run."""

    CONNECTING = "connected over Socket Mode"

    def __init__(self, label: str, logs: Path) -> None:
        super().__init__(label, logs)
        w = self.fake.world
        for u, person in enumerate(PEOPLE):
            w.add_user(person, f"person{u}")
        self.app = w.add_app(APP_ID, "bench", bot_id=BOT_ID, bot_user_id=BOT_USER)
        for k, channel in enumerate(CHANNELS):
            w.add_channel(channel, f"bench-{k}", *PEOPLE, BOT_USER)

    def make_fake(self) -> BenchSlack:
        return BenchSlack(self.replies)

    def connected(self) -> bool:
        return self.fake.connected(APP_ID) > 0

    async def inject(self, i: int) -> str:
        key = f"r{self.runs}m{i}"
        await self.fake.user_says(CHANNELS[i % CHATS], PEOPLE[i % USERS], f"<@{BOT_USER}> {key}")
        return key

    def forget(self) -> None:
        self.fake.forget()

    def after_run(self) -> str | None:
        if strays := self.replies.unclaimed():
            return f"{len(strays)} replies no message awaited, e.g. under {strays[0]!r}"
        return None


class SlackBench(Bench[SlackContestant]):
    name = NAME
    keys = "bb:{slack:C0BENCH*"  # these channels' turn counts, remembered message ids

    def contestants(self, logs: Path) -> tuple[SlackContestant, SlackContestant]:
        return SlackContestant("a bare Bolt", logs), SlackContestant("b botbouncer", logs)

    def spawn_bare(self, a: SlackContestant) -> None:
        a.spawn([sys.executable, str(HERE / "_bare_slack.py"), a.app.bot_token,
                 a.app.app_token, a.fake.api_base, BARE])  # fmt: skip

    def spawn_bouncer(self, c: SlackContestant, store_url: str, checkout: Path = ROOT) -> None:
        c.spawn_daemon("slack", c.app.bot_token, store_url, checkout,
                       slack={"app_token": c.app.app_token})  # fmt: skip

    def header(self, on: str, store_kind: str) -> None:
        print(f"slack_bolt {slack_bolt.version.__version__}, slack_sdk "
              f"{slack_sdk.version.__version__}, botbouncer on {on}; {MESSAGES} messages "
              f"a run, {WINDOW} in flight, {ROUNDS} rounds after a warm-up; {CHATS} "
              f"channels, {USERS} people, top-level messages; "
              f"{os.cpu_count()} CPUs")  # fmt: skip
        client = ("a new connection per Web API call, as the docs make it" if BARE == "docs"
                  else "one aiohttp session")  # fmt: skip
        print(f"a: Bolt's quickstart echo app (AsyncApp, Socket Mode; {client}); b: "
              f"botbouncer daemon, Socket Mode, echo backend, {store_kind} store, INFO "
              "decision log on", flush=True)  # fmt: skip


if __name__ == "__main__":
    sys.exit(SlackBench().main())
