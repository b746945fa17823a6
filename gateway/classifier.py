"""The reply decision: a cheap LLM asked "REPLY or SKIP?" (docs/backends.md).

Called only when every deterministic rule already allowed a reply. The prompt
carries the bot's identity, the chat's recent messages with speaker names and a
bot/human tag, and the new message: a gate that sees only the last line cannot
tell a bot-to-bot echo from a question. The first word of the answer that is
REPLY or SKIP decides (a reasoning model's <think> block left out); anything
else - junk, empty, a timeout, an HTTP or network error - means REPLY (fail
open), and the cause is logged. An answer cut off at max_tokens before the
word is a configuration problem, logged as an error and counted as such.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.config import ReplyDecisionPolicy
from gateway.llm import LLMError, chat_completion, completions_url, without_thinking
from gateway.model import ChatKind, Message
from gateway.outbound import Outbound
from gateway.redact import redact
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
    # the metric label: "reply", "skip", "error" (failed open) or "truncated"
    # (failed open: max_tokens ran out before the word, a configuration problem)
    result: str
    cause: str  # what the model said, or why the call failed


# The answer's word, the first REPLY or SKIP (after the thinking a reasoning
# model may return inline: gateway.llm.without_thinking).
_WORD = re.compile(r"\b(REPLY|SKIP)\b", re.I)


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
        except Exception as exc:  # a call not even made (aiohttp refused a header): fail open too
            why = redact(f"{type(exc).__name__}: {exc}", [self.api_key])
            log.warning("reply decision for %s failed open (REPLY): %s", msg.id, why)
            return Verdict(True, "error", why)
        ms = (time.perf_counter() - started) * 1000
        text = without_thinking(answer.text).strip()
        word = _WORD.search(text)
        if word is not None and word.group(1).upper() == "SKIP":
            log.info("reply decision for %s: SKIP (%.0f ms)", msg.id, ms)
            return Verdict(False, "skip", text[:40])
        if word is not None:
            return Verdict(True, "reply", text[:40])
        if answer.finish_reason == "length":
            # Not a passing fault: every decision will fail open like this one
            # until the configuration changes, so it is said as an error.
            log.error("reply decision for %s: the model stopped at max_tokens (%d) before "
                      "it answered REPLY or SKIP, failing open (REPLY); raise "
                      "reply_decision.max_tokens (a reasoning model spends tokens before "
                      "the word)", msg.id, self.cfg.max_tokens)  # fmt: skip
            return Verdict(True, "truncated", f"cut off at max_tokens={self.cfg.max_tokens}")
        log.warning("reply decision for %s: unclear answer %r, failing open (REPLY)",
                    msg.id, text[:40])  # fmt: skip
        return Verdict(True, "error", f"unclear answer {text[:40]!r}")
