"""`openai`: the bot is an LLM. System prompt + recent context + the message."""

from __future__ import annotations

from collections.abc import Sequence

from gateway import config
from gateway.llm import LLMError, chat_completion, completions_url, without_thinking
from gateway.model import Message
from gateway.outbound import Outbound
from gateway.store import ContextEntry


class OpenAIBackend:
    name = "openai"

    def __init__(self, cfg: config.OpenAIBackend, bot: str, outbound: Outbound) -> None:
        self.cfg = cfg
        self.bot = bot
        self.outbound = outbound
        self.url = completions_url(cfg.endpoint)
        self.system = cfg.system_prompt.format(name=bot)

    def messages(self, msg: Message, context: Sequence[ContextEntry]) -> list[dict[str, str]]:
        out = [{"role": "system", "content": self.system}]
        for e in context:
            if e.author == self.bot:
                out.append({"role": "assistant", "content": e.text})
            else:
                tag = "bot" if e.bot else "human"
                out.append({"role": "user", "content": f"{e.name} ({tag}): {e.text}"})
        tag = "bot" if msg.author.is_bot else "human"
        out.append({"role": "user", "content": f"{msg.author.display} ({tag}): {msg.text}"})
        return out

    async def reply(self, msg: Message, context: Sequence[ContextEntry]) -> list[str]:
        key = self.cfg.api_key.get_secret_value() if self.cfg.api_key else None
        answer, finish = await chat_completion(
            self.outbound.session, self.url, model=self.cfg.model,
            messages=self.messages(msg, context), max_tokens=self.cfg.max_tokens,
            timeout_seconds=self.cfg.timeout_seconds, api_key=key,
            temperature=self.cfg.temperature,
        )  # fmt: skip
        # A reasoning model's inline thinking is not for the chat.
        text = without_thinking(answer).strip()
        if not text and finish == "length":
            # Not "the model chose silence": it would be the same for every message.
            raise LLMError(f"cut off at max_tokens={self.cfg.max_tokens} before any answer "
                           "(a reasoning model spends tokens thinking first): raise the "
                           "backend's max_tokens")  # fmt: skip
        return [text] if text else []
