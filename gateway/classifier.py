"""The reply decision: a cheap LLM asked "REPLY or SKIP?" (DESIGN §3.5).

Called only when every deterministic rule already allowed a reply. The prompt
carries the bot's identity, the chat's recent messages with speaker names and a
bot/human tag, and the new message: a gate that sees only the last line cannot
tell a bot-to-bot echo from a question. The answer is SKIP only if it starts
with SKIP; anything else - REPLY, junk, empty, a timeout, an HTTP or network
error - means REPLY (fail open), and the cause is logged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.config import ReplyDecisionPolicy
from gateway.llm import LLMError, chat_completion, completions_url
from gateway.model import ChatKind, Message
from gateway.outbound import Outbound
from gateway.store import ContextEntry
from gateway.turns import is_addressed

log = logging.getLogger("botbouncer.classifier")

SYSTEM = (
    "You decide whether a chat bot should answer a message in a group chat. "
    "Reply with exactly one word: REPLY or SKIP."
)

DEFAULT_PROMPT = """You are the reply gate for the bot "{identity}".

Recent messages, oldest first:
{context}

New message from {author} ({author_kind}):
{message}

Should {identity} answer the new message? Answer SKIP when nothing is asked of
{identity}, when it has nothing to add, or when bots are only echoing or
thanking each other. Otherwise answer REPLY. One word: REPLY or SKIP."""


@dataclass(frozen=True, slots=True)
class Verdict:
    reply: bool
    result: str  # "reply", "skip" or "error" (failed open): the metric label
    cause: str  # what the model said, or why the call failed


def _line(name: str, bot: bool, text: str) -> str:
    return f"- {name} ({'bot' if bot else 'human'}): {text}"


class Classifier:
    def __init__(self, cfg: ReplyDecisionPolicy, bot_name: str, outbound: Outbound) -> None:
        if cfg.endpoint is None or cfg.model is None:
            raise ValueError("reply_decision needs endpoint and model")
        self.cfg = cfg
        self.identity = cfg.identity or bot_name
        self.url = completions_url(cfg.endpoint)
        self.model = cfg.model
        self.api_key = cfg.api_key.get_secret_value() if cfg.api_key else None
        self.template = cfg.prompt or DEFAULT_PROMPT
        self.outbound = outbound

    def applies(self, msg: Message, bot_id: str) -> bool:
        """Whether to ask the model at all. Empty and system messages are never
        classified, DMs only under scope all, and a person who addresses this
        bot (a mention, a reply to it) never: the gate is for bot messages and
        for messages nobody addressed to this bot, so a SKIP can never silence
        a person who asked."""
        if msg.system or not msg.text.strip():
            return False
        if not msg.author.is_bot and is_addressed(msg, bot_id):
            return False
        return self.cfg.scope == "all" or msg.chat.kind is ChatKind.GROUP

    def prompt(self, msg: Message, context: Sequence[ContextEntry]) -> str:
        recent = context[-self.cfg.context_messages :] if self.cfg.context_messages else []
        lines = "\n".join(_line(e.name, e.bot, e.text) for e in recent) or "(none)"
        return self.template.format(
            identity=self.identity,
            context=lines,
            author=msg.author.display,
            author_kind="bot" if msg.author.is_bot else "human",
            message=msg.text,
        )

    async def decide(self, msg: Message, context: Sequence[ContextEntry]) -> Verdict:
        started = time.perf_counter()
        try:
            answer = await chat_completion(
                self.outbound.session, self.url, model=self.model,
                messages=[{"role": "system", "content": SYSTEM},
                          {"role": "user", "content": self.prompt(msg, context)}],
                max_tokens=self.cfg.max_tokens, timeout_seconds=self.cfg.timeout_seconds,
                api_key=self.api_key,
            )  # fmt: skip
        except LLMError as exc:
            log.warning("reply decision for %s failed open (REPLY): %s", msg.id, exc)
            return Verdict(True, "error", str(exc))
        ms = (time.perf_counter() - started) * 1000
        if answer.strip().upper().startswith("SKIP"):
            log.info("reply decision for %s: SKIP (%.0f ms)", msg.id, ms)
            return Verdict(False, "skip", answer.strip()[:40])
        if not answer.strip().upper().startswith("REPLY"):
            log.warning("reply decision for %s: unclear answer %r, failing open (REPLY)",
                        msg.id, answer[:40])  # fmt: skip
            return Verdict(True, "error", f"unclear answer {answer[:40]!r}")
        return Verdict(True, "reply", answer.strip()[:40])
