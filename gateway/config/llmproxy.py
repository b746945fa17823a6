"""`llm_proxy:` the LLM API proxy in front of an agent's model
(docs/llm-proxy.md, gateway/llmproxy/)."""

from __future__ import annotations

import re
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from gateway.config.errors import LOCATED
from gateway.fields import Float, Int, Model, NonEmptyStr, OptionalSecret, check_http_url

_PATH = re.compile(r"^(/[A-Za-z0-9._~-]+)+$")
MAX_BODY_BYTES = 256 * 1024 * 1024


def _upstream(value: str) -> str:
    check_http_url(value)
    if "?" in value or "#" in value:
        raise ValueError("must be a base URL without a query or fragment")
    # aiohttp sends a URL's user name and password as a Basic Authorization
    # header and refuses them beside the agent's own Authorization; the URL
    # is also shown in error answers and logs, password included.
    if "@" in urlsplit(value).netloc:
        raise ValueError(
            "must not hold a user name or password (user:password@host): the key goes in "
            "api_key, which may take it from the environment as ${VAR}"
        )
    return value.rstrip("/")


Upstream = Annotated[str, AfterValidator(_upstream)]


class ApiConfig(Model):
    """One API the proxy serves: agents call `path` + the API's own paths
    (`/v1/chat/completions`, `/v1/messages`, `/v1/models`, ...), which go to
    `upstream` + the same paths."""

    path: str
    upstream: Upstream
    # Replaces the agent's own key (Authorization / x-api-key) when set.
    api_key: OptionalSecret = None

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        if not _PATH.match(value):
            raise ValueError(
                'must be a URL path like "/llm/openai": segments of A-Z a-z 0-9 . _ ~ -'
            )
        if value.split("/")[1] in ("v1", "healthz", "metrics", "openapi.json"):
            raise ValueError("must not start with a path the daemon serves itself")
        return value


class OpenAIApi(ApiConfig):
    path: str = "/llm/openai"
    upstream: Upstream = "https://api.openai.com"
    # A stream is asked to report its usage (stream_options.include_usage)
    # when the agent did not ask, and the usage chunk is then kept from the
    # agent: without it a streamed answer's tokens reach no budget.
    stream_usage: bool = True


class AnthropicApi(ApiConfig):
    path: str = "/llm/anthropic"
    upstream: Upstream = "https://api.anthropic.com"


class Price(Model):
    """US dollars per million tokens. Input read from the provider's prompt
    cache, and (Anthropic) written to it, cost what `cached_input` and
    `cache_write` say; without them, what any input costs."""

    input: Float = Field(ge=0, le=10_000)
    output: Float = Field(ge=0, le=10_000)
    cached_input: Float | None = Field(default=None, ge=0, le=10_000)
    cache_write: Float | None = Field(default=None, ge=0, le=10_000)

    def cost(self, input_tokens: int, cached: int, written: int, output_tokens: int) -> float:
        """US dollars for an answer's usage; `cached` and `written` are
        among the `input_tokens`."""
        cached = min(cached, input_tokens)
        written = min(written, input_tokens - cached)
        plain = input_tokens - cached - written
        read_price = self.input if self.cached_input is None else self.cached_input
        write_price = self.input if self.cache_write is None else self.cache_write
        return (plain * self.input + cached * read_price + written * write_price
                + output_tokens * self.output) / 1e6  # fmt: skip


class ProxyBudget(Model):
    """A session's budget when its guard profile sets none (the guard's
    `budget`: usd needs `prices` for the models used)."""

    usd: Float | None = Field(default=None, gt=0, le=10**7)
    tokens: Int | None = Field(default=None, ge=1, le=10**13)


class ProxyTimeouts(Model):
    connect_seconds: Float = Field(default=10.0, gt=0, le=600)
    # Between two reads of the upstream's answer (a stream may run for long;
    # a silent one is cut after this).
    # 600: the OpenAI and Anthropic SDKs' own timeout (a long answer of a
    # reasoning model, not streamed, may be silent for minutes).
    read_seconds: Float = Field(default=600.0, gt=0, le=3600)


class LlmProxyConfig(Model):
    """Each API is served when its section is present (`openai: {}` takes
    the defaults); without either, nothing is."""

    openai: OpenAIApi | None = None
    anthropic: AnthropicApi | None = None
    profile: NonEmptyStr = "default"  # the guard profile the sessions run under
    # answer: the model is asked again with tools disabled and the guard's
    # message as a note, so the agent gets a final answer; stop: a final
    # answer with the guard's message is made up without calling the model.
    block_mode: Literal["answer", "stop"] = "answer"
    # A warn decision adds the guard's message as a note (tools stay on).
    warn_note: bool = True
    budget: ProxyBudget = ProxyBudget()
    prices: dict[NonEmptyStr, Price] = Field(default_factory=dict)
    timeouts: ProxyTimeouts = ProxyTimeouts()
    # 64 MiB: above OpenAI's 50 MB for a request with images (Anthropic's is 32 MB).
    max_body_bytes: Int = Field(default=64 * 1024 * 1024, ge=1024, le=MAX_BODY_BYTES)

    @field_validator("openai", "anthropic", mode="before")
    @classmethod
    def _empty_section(cls, value: object) -> object:
        return {} if value is None else value

    @model_validator(mode="after")
    def _priced(self) -> LlmProxyConfig:
        if self.budget.usd is not None and not self.prices:
            raise PydanticCustomError(
                LOCATED,
                "{message}",
                {
                    "message": "a budget in dollars needs prices (llm_proxy.prices: US dollars "
                    "per million input and output tokens, per model): without them every "
                    "answer would cost 0",
                    "at": ("budget", "usd"),
                },
            )
        return self

    def apis(self) -> list[tuple[str, ApiConfig]]:
        out: list[tuple[str, ApiConfig]] = []
        if self.openai is not None:
            out.append(("openai", self.openai))
        if self.anthropic is not None:
            out.append(("anthropic", self.anthropic))
        return out
