"""Where replies come from (docs/backends.md).

A backend turns one admitted message (plus the chat's recent context) into the
texts to send; an empty list means stay silent. Backends raise on failure; the
pipeline turns that into `backend_error` and releases the rate-cap slot. Every
configured backend is wrapped in `Guarded`: a timeout and a circuit breaker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from gateway.backends.breaker import CircuitBreaker, CircuitOpen
from gateway.config import BackendConfig, BreakerConfig
from gateway.errors import BotbouncerError
from gateway.model import Message
from gateway.outbound import Outbound
from gateway.store import ContextEntry
from gateway.wire import clean


class BackendError(BotbouncerError):
    """The backend failed; the message says how."""


class Backend(Protocol):
    name: str

    async def reply(self, msg: Message, context: Sequence[ContextEntry]) -> list[str]: ...


class EchoBackend:
    """Repeats the text: for demos and tests."""

    name = "echo"

    async def reply(self, msg: Message, context: Sequence[ContextEntry]) -> list[str]:
        return [msg.text] if msg.text.strip() else []


class Guarded:
    """A backend with a deadline, a circuit breaker and at most `max_concurrent`
    calls in flight (the rest wait for a place within their deadline).

    No retry: a retried call that had in fact answered could reply twice.
    """

    def __init__(
        self, inner: Backend, timeout: float, breaker: CircuitBreaker, max_concurrent: int = 32
    ) -> None:
        self.inner = inner
        self.name = inner.name
        self.timeout = timeout
        self.breaker = breaker
        self.max_concurrent = max_concurrent
        self.places = asyncio.Semaphore(max_concurrent)

    async def reply(self, msg: Message, context: Sequence[ContextEntry]) -> list[str]:
        try:
            self.breaker.before_call()
        except CircuitOpen as exc:
            raise BackendError(str(exc)) from None
        placed = False
        try:
            async with asyncio.timeout(self.timeout), self.places:
                placed = True
                out = await self.inner.reply(msg, context)
        except asyncio.CancelledError:
            self.breaker.abandoned()
            raise
        except TimeoutError:
            self.breaker.failed()
            busy = "" if placed else f" (waited for a place: {self.max_concurrent} calls in flight)"
            raise BackendError(f"no reply within {self.timeout:g} s{busy}") from None
        except Exception:
            self.breaker.failed()
            raise
        self.breaker.succeeded()
        # a lone surrogate (half an emoji) could be sent but never counted
        return [clean(r) for r in out]


def _breaker(cfg: BreakerConfig) -> CircuitBreaker:
    return CircuitBreaker(cfg.failures, cfg.cooldown_seconds)


def make_backend(cfg: BackendConfig, bot_name: str, outbound: Outbound) -> Backend:
    """The configured backend, guarded. Raises BackendError if it cannot be set up
    (e.g. a python callable that does not import)."""
    if cfg.type == "echo":
        return EchoBackend()
    if cfg.type == "webhook":
        from gateway.backends.webhook import WebhookBackend

        inner: Backend = WebhookBackend(cfg, bot_name, outbound)
    elif cfg.type == "openai":
        from gateway.backends.openai import OpenAIBackend

        inner = OpenAIBackend(cfg, bot_name, outbound)
    else:
        from gateway.backends.python import PythonBackend

        inner = PythonBackend(cfg)
    return Guarded(inner, cfg.timeout_seconds, _breaker(cfg.breaker), cfg.max_concurrent)


def context_wanted(cfg: BackendConfig | None) -> int:
    """How many recent messages the backend is given (none without one)."""
    return 0 if cfg is None or cfg.type == "echo" else cfg.context_messages


def deadline(cfg: BackendConfig | None) -> float:
    """The longest the backend may take to answer, in seconds (none without one)."""
    return 0.0 if cfg is None or cfg.type == "echo" else cfg.timeout_seconds
