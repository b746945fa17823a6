"""Telegram end to end: messages/s and message-to-reply latency of the plainest
python-telegram-bot echo bot (a) against botbouncer in front of the same echo
(b), both on the fake Bot API of tests/fakes/telegram/, in one invocation.

The contestants, each its own process, started once and kept for all its
runs (start-up is not measured):

- a: bench/_bare_telegram.py, PTB's echo example: a MessageHandler for text
  that answers `message.reply_text(text)` (a reply to the message in a group,
  as botbouncer's adapter answers: a send_message with reply_parameters),
  long polling with `run_polling`'s defaults, which are the adapter's too
  (timeout 10 s, no interval), no rate limiter, nothing logged per message.
  E2E_BARE picks its concurrency: `example` (the default) leaves it as the
  example is written, one update at a time; `adapter` sets
  `concurrent_updates` to the adapter's CONCURRENT_UPDATES.
- b: the real daemon, `python -m gateway run -c <config>`: one Telegram bot in
  polling mode, the echo backend, the store on a real Redis (a private
  redis-server, or REDIS_URL), the rate cap lifted (max_replies 1,000,000, so
  every message is answered) and PTB's send-rate limits lifted
  (`telegram.rate_limit` 0/0: the fake has no flood limits, and PTB's 30/s and
  20/min per group would measure the limiter, not the guard). Its default INFO
  log, one decision line per message, stays on: that is the real cost.

Each contestant has its own fake server instance in this process, with one
bot (privacy mode on, BotFather's default), CHATS supergroups and USERS
people. Message i of a run goes to chat i % CHATS from person i % USERS and
reads `@bench_bot r<run>m<i>`: it mentions the bot, because a group bot with
privacy mode on gets only mentions, commands and replies, and botbouncer's
default `respond_to: mentions` answers exactly those. Both bots echo the
text, so the fake reports each reply (its sendMessage) to `Replies` under the
text's last word, in O(1). bench/_e2e.py's `drive` keeps WINDOW messages in
flight (closed loop) and `alternate` runs a warm-up each, then a, b, a, b, ...
Each round prints b/a for throughput, p50, p99 and CPU per message (the bot's
process, plus botbouncer's Redis when it is the benchmark's private one); at
the end a line per contestant splits the CPU by process, "fake+driver" being
this process while it serves that contestant. The contestant's lifecycle is
bench/_e2e.py's `Contestant`: subprocess output goes to files in a temporary
directory; a contestant that exits or stops answering for STALL_S (15)
seconds ends the benchmark with its log's last lines (exit 2).

Run from the repo root:  .venv/bin/python bench/e2e_telegram.py
(E2E_MESSAGES, E2E_WINDOW, E2E_ROUNDS size it.) The last line is
`throughput_ratio=<b/a> p99_ratio=<b/a> p50_ratio=<b/a> cpu_ratio=<b/a>
cpu_with_redis_ratio=<b/a>` (targets: throughput >= 0.9, p99 <= 1.1, cpu, the
bot's process alone, <= 1.05), then the memory store's, prefixed `memory_`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for `tests`

import telegram
from _e2e import MESSAGES, ROUNDS, WINDOW, Bench, Contestant, Replies
from _redis import ROOT

from adapters.telegram import CONCURRENT_UPDATES
from tests.fakes.telegram import FakeBot, FakeTelegram, Json

HERE = Path(__file__).resolve().parent
CHATS = 50
USERS = 8
CHAT_BASE = -1008800000000  # chat k is CHAT_BASE - k
USER_BASE = 880001
BOT_ID = 8800
NAME = "e2e_telegram"
# a's concurrency: PTB's example as written (one update at a time) or the adapter's
BARE = os.environ.get("E2E_BARE", "example")
if BARE not in ("example", "adapter"):
    raise SystemExit(f"E2E_BARE={BARE!r}: must be 'example' or 'adapter'")
BARE_CONCURRENCY = CONCURRENT_UPDATES if BARE == "adapter" else 0
BOT_USERNAME = "bench_bot"


class BenchTelegram(FakeTelegram):
    """The fake Bot API, reporting each sendMessage to `replies` under the
    text's last word (both bots echo `@bench_bot r<run>m<i>`)."""

    def __init__(self, replies: Replies) -> None:
        super().__init__()
        self.replies = replies

    async def _send_message(self, bot: FakeBot, params: Json) -> Json:
        msg = await super()._send_message(bot, params)
        self.replies.arrived(str(msg.get("text", "")).rpartition(" ")[2])
        return msg


class TelegramContestant(Contestant[BenchTelegram]):
    """A bot of `token` on its own fake Bot API: ready once it long-polls."""

    CONNECTING = "polling getUpdates"

    def __init__(self, label: str, token: str, logs: Path) -> None:
        super().__init__(label, logs)
        self.token = token
        self.fake.add_bot(token, BOT_ID, BOT_USERNAME, "Bench")
        for u in range(USERS):
            self.fake.add_user(USER_BASE + u, f"Person {u}", f"person{u}")
        for k in range(CHATS):
            self.fake.add_chat(CHAT_BASE - k, "supergroup", f"group {k}")
            self.fake.add_member(CHAT_BASE - k, BOT_ID)
            for u in range(USERS):
                self.fake.add_member(CHAT_BASE - k, USER_BASE + u)

    def make_fake(self) -> BenchTelegram:
        return BenchTelegram(self.replies)

    def connected(self) -> bool:
        return self.fake.bots[self.token].polling > 0

    async def inject(self, i: int) -> str:
        key = f"r{self.runs}m{i}"
        await self.fake.user_says(CHAT_BASE - i % CHATS, USER_BASE + i % USERS,
                                  f"@{BOT_USERNAME} {key}")  # fmt: skip
        return key


class TelegramBench(Bench[TelegramContestant]):
    name = NAME
    # what an earlier invocation left for these chats (its dedupe memory
    # would take the fake's message ids for repeats)
    keys = f"bb:{{telegram:{str(CHAT_BASE)[:-3]}*"

    def contestants(self, logs: Path) -> tuple[TelegramContestant, TelegramContestant]:
        return (TelegramContestant("a bare PTB", "8800:bare-bench", logs),
                TelegramContestant("b botbouncer", "8800:bouncer-bench", logs))  # fmt: skip

    def spawn_bare(self, a: TelegramContestant) -> None:
        a.spawn([sys.executable, str(HERE / "_bare_telegram.py"), a.token, a.fake.api_base,
                 str(BARE_CONCURRENCY)])  # fmt: skip

    def spawn_bouncer(self, c: TelegramContestant, store_url: str, checkout: Path = ROOT) -> None:
        # PTB's send-rate limits lifted: the fake has no flood limits
        limits = {"overall_per_second": 0, "group_per_minute": 0}
        c.spawn_daemon("telegram", c.token, store_url, checkout, telegram={"rate_limit": limits})

    def header(self, on: str, store_kind: str) -> None:
        print(f"python-telegram-bot {telegram.__version__}, botbouncer on {on}; "
              f"{MESSAGES} messages a run, {WINDOW} in flight, {ROUNDS} rounds after a "
              f"warm-up; {CHATS} group chats, {USERS} people; concurrent_updates "
              f"{CONCURRENT_UPDATES} in b, {BARE_CONCURRENCY or 'none (one at a time)'} "
              f"in a; {os.cpu_count()} CPUs")  # fmt: skip
        print(f"a: bare PTB echo bot; b: botbouncer daemon, echo backend, {store_kind} store, "
              "INFO decision log on", flush=True)  # fmt: skip

    def notes(self, c: TelegramContestant) -> list[str]:
        actions = c.fake.chat_actions
        return [f"{c.label}: {len(actions)} chat actions (typing) sent"] if actions else []


if __name__ == "__main__":
    sys.exit(TelegramBench().main())
