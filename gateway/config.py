"""YAML -> validated, typed settings (docs/configuration.md).

A config file is read in four steps, each of which can only fail with a
`ConfigError` whose problems read `<key path>: <what is wrong>`:

1. YAML is parsed (duplicate keys are rejected: a silently ignored key is the
   kind of surprise docs/configuration.md rules out).
2. `${VAR}` / `${VAR:-default}` are interpolated in string values, so tokens
   never live in the file.
3. `defaults` is deep-merged under every bot, so a bot states only what differs.
4. pydantic validates; its errors are translated into short messages, and an
   error that a bot merely inherited from `defaults` is reported once, there.
"""

from __future__ import annotations

import ipaddress
import os
import re
import string
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeAlias
from urllib.parse import urlsplit

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

from gateway.redact import remember

__all__ = [
    "AdminsConfig",
    "BotConfig",
    "BreakerConfig",
    "Config",
    "ConfigError",
    "EchoBackend",
    "GuardConfig",
    "GuardProfile",
    "HttpConfig",
    "OpenAIBackend",
    "PairsPolicy",
    "Policy",
    "PythonBackend",
    "RateCapPolicy",
    "ReplyDecisionPolicy",
    "StoreConfig",
    "TurnsPolicy",
    "UnknownBotError",
    "WebhookBackend",
    "load_config",
    "parse_config",
]

DEFAULT_WARN_SOFT = (
    "⚠️ Bot turn limit reached ({n}/{limit}). "
    "A human must reply here to continue the bot-to-bot conversation."
)
DEFAULT_WARN_HARD = "🛑 Hard bot turn limit reached ({n}). A human must reply to continue."

STORE_SCHEMES = ("memory", "redis", "rediss", "redis+cluster")
TEMPLATE_FIELDS = ("n", "limit")
# What a reply_decision.prompt may use (gateway/classifier.py fills them in).
PROMPT_FIELDS = ("identity", "context", "author", "author_kind", "message")

# A custom pydantic error type: "this message belongs at <loc> + ctx['at']".
# Validators that look at several fields use it to blame the one key to change.
_LOCATED = "located"


# Upper bounds keep every count and millisecond an exact integer inside Redis
# Lua (whose numbers print as 1e+14 past 14 digits, which PEXPIRE refuses).
MAX_COUNT = 1_000_000
MAX_WINDOW_SECONDS = 30 * 86400
MAX_TTL_SECONDS = 10 * 365 * 86400
# A config file is a few kilobytes; these bounds make a huge file or a YAML
# alias bomb a quick, clear error instead of minutes of parsing or expanding.
MAX_FILE_BYTES = 1024 * 1024
MAX_VALUES = 100_000


class ConfigError(Exception):
    """Everything that is wrong with a config, one `<path>: <problem>` per line."""

    def __init__(self, problems: str | Iterable[str]) -> None:
        self.problems: list[str] = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))

    def __str__(self) -> str:
        return "\n".join(self.problems)


class UnknownBotError(KeyError):
    """`Config.bot()` was asked for a name no bot has."""

    def __str__(self) -> str:
        # KeyError would show the repr of its argument, quotes and all.
        return str(self.args[0]) if self.args else ""


# --------------------------------------------------------------------------
# Small reusable field types
# --------------------------------------------------------------------------


def _int_not_bool(value: Any) -> Any:
    # pydantic's lax mode reads `true` as 1; in a config that is always a typo.
    if isinstance(value, bool):
        raise PydanticCustomError("int_type", "must be an integer")
    return value


def _float_not_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise PydanticCustomError("float_type", "must be a number")
    return value


def _ids(value: Any) -> Any:
    # Platform ids are strings in the core; YAML reads unquoted ids as ints.
    if value is None:
        return []
    if isinstance(value, list | tuple):
        return [str(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in value]
    return value


def _empty_to_none(value: Any) -> Any:
    # `${VAR:-}` of an unset variable yields "", which means "not configured".
    return None if value == "" else value


def _none_to_empty(value: Any) -> Any:
    # A section whose keys are all commented out (`turns:`) parses as null.
    return {} if value is None else value


Int = Annotated[int, BeforeValidator(_int_not_bool)]
Float = Annotated[float, BeforeValidator(_float_not_bool)]
NonEmptyStr = Annotated[str, StringConstraints(min_length=1)]
Ids = Annotated[tuple[NonEmptyStr, ...], BeforeValidator(_ids)]
OptionalStr = Annotated[str | None, BeforeValidator(_empty_to_none)]
OptionalSecret = Annotated[SecretStr | None, BeforeValidator(_empty_to_none)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _null_section_is_empty(cls, data: Any) -> Any:
        return _none_to_empty(data)


def _check_http_url(value: str | None) -> str | None:
    if value is not None:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError("must be an http:// or https:// URL")
    return value


def _check_template(template: str, fields: tuple[str, ...] = TEMPLATE_FIELDS) -> str:
    """A template may use only its known placeholders: anything else would fail
    at the worst moment (a warning while a loop is being stopped, a classifier
    call that then fails open on every message)."""
    names = [f"{{{f}}}" for f in fields]
    allowed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValueError(f"malformed template: {exc}") from None
    for _, name, spec, _ in parsed:
        if name is not None and name not in fields:
            shown = f"{{{name}}}" if name else "{}"
            raise ValueError(f"unknown placeholder {shown}; only {allowed} may be used")
        if spec and "{" in spec:
            raise ValueError(f"malformed template: nested placeholder in {{{name}:{spec}}}")
    try:
        template.format(**{f: 1 for f in fields})
    except (ValueError, IndexError, KeyError, AttributeError) as exc:
        raise ValueError(f"malformed template: {exc}") from None
    return template


# --------------------------------------------------------------------------
# Policy: the keys of `defaults`, overridable per bot
# --------------------------------------------------------------------------


class TurnsPolicy(_Model):
    """Consecutive bot-turn limits (docs/architecture.md)."""

    soft_limit: Int = Field(default=20, ge=1, le=MAX_COUNT)
    hard_limit: Int = Field(default=100, ge=1, le=MAX_COUNT)
    warn_soft: str = DEFAULT_WARN_SOFT
    warn_hard: str = DEFAULT_WARN_HARD

    @field_validator("warn_soft", "warn_hard")
    @classmethod
    def _template(cls, value: str) -> str:
        return _check_template(value)

    # soft_limit >= hard_limit is valid: the hard limit fires first and the
    # soft one never warns (only a hard stop). check-config notes it.


class PairsPolicy(_Model):
    """Sliding-window loop detection per pair of bots (docs/architecture.md)."""

    max_events: Int = Field(default=20, ge=1, le=MAX_COUNT)
    window_seconds: Float = Field(default=60.0, gt=0, le=MAX_WINDOW_SECONDS)
    cooldown_seconds: Float = Field(default=60.0, ge=0, le=MAX_WINDOW_SECONDS)


class RateCapPolicy(_Model):
    """Replies per (chat, bot) in a rolling window (docs/architecture.md)."""

    max_replies: Int = Field(default=6, ge=1, le=MAX_COUNT)
    window_seconds: Float = Field(default=120.0, gt=0, le=MAX_WINDOW_SECONDS)
    scope: Literal["groups", "all"] = "groups"


class ReplyDecisionPolicy(_Model):
    """The optional REPLY/SKIP classifier (docs/backends.md)."""

    enabled: bool = False
    endpoint: OptionalStr = Field(default=None, validate_default=True)
    api_key: OptionalSecret = None
    model: OptionalStr = Field(default=None, validate_default=True)
    timeout_seconds: Float = Field(default=5.0, gt=0)
    # A ceiling, not a target: a plain model stops after its one word, a
    # reasoning model spends hundreds of tokens before it (cut off first, it
    # answers nothing and every decision fails open).
    max_tokens: Int = Field(default=1024, ge=1)
    context_messages: Int = Field(default=8, ge=0, le=50)
    scope: Literal["groups", "all"] = "groups"
    identity: OptionalStr = None  # None: the bot's name, filled in by the classifier
    prompt: OptionalStr = None  # None: the classifier's built-in prompt

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, value: str | None) -> str | None:
        return None if value is None else _check_template(value, PROMPT_FIELDS)

    @field_validator("endpoint", "model")
    @classmethod
    def _required_when_enabled(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None and info.data.get("enabled") is True:
            raise ValueError("is required when enabled")
        if info.field_name == "endpoint":
            return _check_http_url(value)
        return value


BotMessages: TypeAlias = Literal["off", "mentions", "all"]


class Policy(_Model):
    """Every rule a bot is held to; `defaults:` is one, and each bot is one."""

    turns: TurnsPolicy = TurnsPolicy()
    pairs: PairsPolicy = PairsPolicy()
    bot_messages: BotMessages = "off"
    trusted_bots: Ids = ()
    respond_to: Literal["mentions", "all"] = "mentions"
    rate_cap: RateCapPolicy = RateCapPolicy()
    reply_decision: ReplyDecisionPolicy = ReplyDecisionPolicy()

    @field_validator("bot_messages", mode="before")
    @classmethod
    def _yaml_off(cls, value: Any) -> Any:
        # YAML 1.1 reads an unquoted `off` as false (and `on`/`yes` as true).
        if value is False:
            return "off"
        if value is True:
            raise ValueError(
                "must be one of: off, mentions, all (an unquoted on/yes/true reads as a "
                'boolean: write all or mentions, or quote the value: "all")'
            )
        return value


POLICY_KEYS = frozenset(Policy.model_fields)


# --------------------------------------------------------------------------
# Bots
# --------------------------------------------------------------------------


def _required_http_url(value: str) -> str:
    _check_http_url(value)
    return value


HttpUrl = Annotated[str, AfterValidator(_required_http_url)]


class BreakerConfig(_Model):
    """After `failures` consecutive failures, stop calling the backend for
    `cooldown_seconds` (each message is `backend_error` at once), then let one
    trial call through: success closes the breaker, failure reopens it."""

    failures: Int = Field(default=5, ge=1)
    cooldown_seconds: Float = Field(default=30.0, gt=0)


class EchoBackend(_Model):
    """Replies with the message's own text: for demos and tests."""

    type: Literal["echo"]


class _CalledBackend(_Model):
    """What every backend that is called out to has: a deadline, the recent
    context it is given, a circuit breaker and a bound on calls in flight."""

    timeout_seconds: Float = Field(default=10.0, gt=0)
    context_messages: Int = Field(default=8, ge=0, le=50)
    breaker: BreakerConfig = BreakerConfig()
    # Calls in flight at once, per bot; more wait for a place, and the wait
    # counts against timeout_seconds. Bounds what a slow backend can pile up.
    max_concurrent: Int = Field(default=32, ge=1, le=10_000)


class WebhookBackend(_CalledBackend):
    """POSTs the message and recent context as JSON; the answer is the reply."""

    type: Literal["webhook"]
    url: HttpUrl
    headers: dict[str, SecretStr] = {}  # e.g. Authorization: "Bearer ${WEBHOOK_TOKEN}"


class OpenAIBackend(_CalledBackend):
    """The bot is an LLM on an OpenAI-compatible chat-completions endpoint."""

    type: Literal["openai"]
    endpoint: HttpUrl  # the completions URL, or a base URL ending in /v1
    api_key: OptionalSecret = None
    model: NonEmptyStr
    system_prompt: str = "You are {name}, a bot in a group chat. Answer briefly and helpfully."
    max_tokens: Int = Field(default=512, ge=1)
    temperature: Float | None = Field(default=None, ge=0, le=2)
    timeout_seconds: Float = Field(default=30.0, gt=0)  # a model takes longer

    @field_validator("system_prompt")
    @classmethod
    def _system_prompt(cls, value: str) -> str:
        return _check_template(value, ("name",))


class PythonBackend(_CalledBackend):
    """An async callable `module:function` taking the message (and the context)."""

    type: Literal["python"]
    callable: str

    @field_validator("callable")
    @classmethod
    def _callable(cls, value: str) -> str:
        module, _, name = value.partition(":")
        if not (module and name and all(p.isidentifier() for p in module.split("."))
                and all(p.isidentifier() for p in name.split("."))):  # fmt: skip
            raise ValueError("must be 'package.module:function'")
        return value


# A discriminated union on `type`: each new backend is one more member here.
BackendConfig: TypeAlias = Annotated[
    EchoBackend | WebhookBackend | OpenAIBackend | PythonBackend, Field(discriminator="type")
]
BACKEND_TYPES: tuple[str, ...] = ("echo", "webhook", "openai", "python")
# Field names holding a discriminated union, with their tags: pydantic puts the
# tag into an error's location (`backend.echo.url`), the user never wrote it.
_TAGGED_FIELDS: dict[str, tuple[str, ...]] = {"backend": BACKEND_TYPES}


class AdminsConfig(_Model):
    """Who may run admin commands besides the platform's own administrators."""

    user_ids: Ids = ()
    role_ids: Ids = ()


Platform: TypeAlias = Literal["discord", "telegram", "http"]

_SECRET_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,256}$")


class TelegramRateLimit(_Model):
    """How fast the bot sends, kept under Telegram's flood limits by PTB's
    AIORateLimiter; 0 lifts a limit (for a Bot API server without them)."""

    overall_per_second: Float = Field(default=30.0, ge=0, le=MAX_COUNT)
    group_per_minute: Float = Field(default=20.0, ge=0, le=MAX_COUNT)


class TelegramConfig(_Model):
    """Telegram only: long polling unless `webhook_url` is set. In webhook mode
    Telegram POSTs updates to `webhook_url`, which must reach the daemon's
    `POST /v1/webhooks/<bot name>`, and every update must carry `secret_token`."""

    webhook_url: OptionalStr = None
    secret_token: OptionalSecret = None
    rate_limit: TelegramRateLimit = TelegramRateLimit()

    @field_validator("webhook_url")
    @classmethod
    def _webhook_url(cls, value: str | None) -> str | None:
        return _check_http_url(value)

    @field_validator("secret_token")
    @classmethod
    def _secret(cls, value: SecretStr | None) -> SecretStr | None:
        # Telegram's own rule; never echo the value.
        if value is not None and not _SECRET_TOKEN.match(value.get_secret_value()):
            raise ValueError("must be 1-256 characters of A-Z, a-z, 0-9, _ and -")
        return value

    @model_validator(mode="after")
    def _pair(self) -> TelegramConfig:
        if self.webhook_url is not None and self.secret_token is None:
            raise ValueError(
                "webhook_url needs secret_token: without it anyone who finds the URL "
                "can post updates"
            )
        if self.secret_token is not None and self.webhook_url is None:
            raise ValueError("secret_token is only used with webhook_url")
        return self


class BotConfig(Policy):
    """One bot behind the gateway: its identity, platform, backend and policy.

    The policy fields are already merged: `defaults` with this bot's overrides.
    """

    name: NonEmptyStr
    platform: Platform
    token: OptionalSecret = Field(default=None, validate_default=True)
    api_base: OptionalStr = None
    backend: BackendConfig
    admins: AdminsConfig = AdminsConfig()
    # Discord only: where the gateway websocket is when api_base points at a
    # proxy (default: what GET {api_base}/gateway/bot answers), sharding for
    # bots in many guilds, and guilds to register slash commands in at once.
    gateway_url: OptionalStr = None
    shard_count: Int | None = Field(default=None, ge=1, le=MAX_COUNT)
    shard_ids: tuple[Annotated[Int, Field(ge=0)], ...] | None = None
    guild_ids: Ids = ()
    telegram: TelegramConfig = TelegramConfig()

    @field_validator("gateway_url", "shard_count", "shard_ids", "guild_ids", "telegram")
    @classmethod
    def _platform_only(cls, value: Any, info: ValidationInfo) -> Any:
        owner = "Telegram" if info.field_name == "telegram" else "Discord"
        platform = info.data.get("platform")
        unset = value in (None, ()) or value == TelegramConfig()
        if not unset and platform is not None and platform != owner.lower():
            raise ValueError(f"is a {owner} setting; this bot's platform is {platform}")
        return value

    @field_validator("admins")
    @classmethod
    def _admins(cls, value: AdminsConfig, info: ValidationInfo) -> AdminsConfig:
        platform = info.data.get("platform")
        if value.role_ids and platform is not None and platform != "discord":
            raise ValueError(f"role_ids: {platform} has no roles; list people under user_ids")
        return value

    @field_validator("gateway_url")
    @classmethod
    def _gateway_url(cls, value: str | None) -> str | None:
        if value is not None:
            parts = urlsplit(value)
            if parts.scheme not in ("ws", "wss") or not parts.netloc:
                raise ValueError(f"must be a ws:// or wss:// URL, not {mask_password(value)!r}")
        return value

    @model_validator(mode="after")
    def _shards(self) -> BotConfig:
        if self.shard_ids is not None:
            if self.shard_count is None:
                raise ValueError("shard_ids needs shard_count")
            bad = [i for i in self.shard_ids if i >= self.shard_count]
            if bad:
                raise ValueError(
                    f"shard_ids: {bad[0]} is not below shard_count ({self.shard_count})"
                )
        return self

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        # The name is a path segment of the ingress URL and an author id.
        if value != value.strip() or "/" in value:
            raise ValueError("must not contain '/' or start or end with whitespace")
        return value

    @field_validator("token")
    @classmethod
    def _token(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        platform = info.data.get("platform")
        if value is None and platform in ("discord", "telegram"):
            raise ValueError(f"is required for platform {platform}")
        return value

    @field_validator("api_base")
    @classmethod
    def _api_base(cls, value: str | None) -> str | None:
        return _check_http_url(value)


# --------------------------------------------------------------------------
# Process-wide settings
# --------------------------------------------------------------------------


class StoreConfig(_Model):
    """Where state lives (docs/architecture.md)."""

    url: str = "memory://"
    state_ttl_seconds: Int = Field(default=604800, ge=60, le=MAX_TTL_SECONDS)
    settings_ttl_seconds: Int = Field(default=7776000, ge=60, le=MAX_TTL_SECONDS)
    # How long one Redis call may take before the message is decided on this
    # process's memory instead (and the store reports itself degraded).
    timeout_seconds: Float = Field(default=0.5, gt=0, le=10)
    # Chats this process's memory holds (memory://, and Redis's local fallback);
    # past it the least recently used is forgotten. The ingress takes no token,
    # so without a bound anyone who reaches it could grow the daemon for the
    # state TTL. 100,000 chats of a few messages each are ~330 MB; were every
    # one at its bounds (50 decisions, 128 dedupe ids, full context) ~5 GB.
    max_chats: Int = Field(default=100_000, ge=1, le=10_000_000)
    # Redis that does not answer at start: by default an ERROR naming the URL
    # and the daemon starts on this process's memory (degraded) until Redis
    # answers; true refuses to start instead (for operators who would rather
    # a mistyped URL stop the rollout than run each replica on its own).
    require_at_start: bool = False

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        # Never echo the URL itself: it may carry a Redis password.
        options = ", ".join(f"{s}://" for s in STORE_SCHEMES)
        scheme, sep, _ = value.partition("://")
        if not sep:
            raise ValueError(f"must be a URL starting with one of: {options}")
        if scheme.lower() not in STORE_SCHEMES:
            raise ValueError(f"unsupported scheme {scheme!r}; use one of: {options}")
        try:
            urlsplit(value).port  # noqa: B018 - parses and range-checks the port
        except ValueError:
            raise ValueError("has an invalid port") from None
        return value

    @property
    def scheme(self) -> str:
        return self.url.partition("://")[0].lower()

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        for name, value in super().__repr_args__():
            yield name, (mask_password(value) if name == "url" else value)


def mask_password(url: Any) -> Any:
    if not isinstance(url, str):
        return url
    url = re.sub(r"(://[^/@]*?:)[^/@]*@", r"\1***@", url)
    # redis-py also takes the password as a query parameter
    return re.sub(r"([?&]password=)[^&#]*", r"\1***", url, flags=re.IGNORECASE)


_HOSTNAME = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?$")


def _split_listen(value: str) -> tuple[str, int]:
    """ "host:port" or "[v6]:port" -> (host, port); ValueError says what is wrong."""
    if value.startswith("["):
        host, sep, port_text = value[1:].partition("]:")
        if not sep:
            raise ValueError('must be "host:port"; IPv6 as "[::1]:8080"')
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{host!r} is not an IPv6 address") from None
    else:
        host, sep, port_text = value.rpartition(":")
        if not sep or not host:
            raise ValueError('must be "host:port", e.g. "127.0.0.1:8080"')
        if ":" in host:
            raise ValueError('an IPv6 address must be in brackets, e.g. "[::1]:8080"')
        if not _HOSTNAME.match(host):
            raise ValueError(f"{host!r} is not a valid host name or address")
    if not port_text.isascii() or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"port must be a number from 1 to 65535, got {port_text!r}")
    return host, int(port_text)


class HttpConfig(_Model):
    """The aiohttp server: ingress, admin, guard, health and metrics (docs/http-api.md)."""

    listen: str = "127.0.0.1:8080"
    admin_token: OptionalSecret = None  # None: the admin API answers 403
    # What one client can hold of the server (gateway/httpserve.py): a request
    # head must arrive within header_timeout_seconds (of the connection's start
    # or the head's first byte), its whole body within body_timeout_seconds of
    # the head; a keep-alive connection idle for idle_timeout_seconds is closed
    # (longer than the 60 s of common proxies and load balancers, so they close
    # first); past max_connections open at once a new one gets a 503 and is
    # closed. A 64 KB body at the deadline is ~2 KB/s, slower than any real
    # client; 1,000 connections at the worst (a 64 KB body each) are ~100 MB.
    header_timeout_seconds: Float = Field(default=10.0, gt=0, le=3600)
    body_timeout_seconds: Float = Field(default=30.0, gt=0, le=3600)
    idle_timeout_seconds: Float = Field(default=75.0, gt=0, le=86400)
    max_connections: Int = Field(default=1000, ge=1, le=MAX_COUNT)

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        _split_listen(value)
        return value

    @property
    def host(self) -> str:
        """The host to bind, without IPv6 brackets."""
        return _split_listen(self.listen)[0]

    @property
    def port(self) -> int:
        return _split_listen(self.listen)[1]


class ShutdownConfig(_Model):
    """What SIGTERM/SIGINT waits for before it cancels the rest."""

    grace_seconds: Float = Field(default=10.0, ge=0)


# --------------------------------------------------------------------------
# The agent guard (docs/agent-guard.md): profiles of detector limits
# --------------------------------------------------------------------------

Ratio = Annotated[float, BeforeValidator(_float_not_bool), Field(gt=0, le=1)]
Times = Annotated[int, BeforeValidator(_int_not_bool), Field(ge=1, le=MAX_COUNT)]


def _regex(value: str) -> str:
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"is not a valid regular expression: {exc}") from None
    return value


class WarnBlock(_Model):
    """Warn at the `warn_at`-th occurrence, block at the `block_at`-th."""

    warn_at: Times
    block_at: Times

    @model_validator(mode="after")
    def _order(self) -> WarnBlock:
        if self.warn_at > self.block_at:
            raise ValueError("warn_at must not be greater than block_at")
        return self


class CycleGuard(WarnBlock):
    warn_at: Times = 2  # full repetitions of the pattern
    block_at: Times = 3
    min_period: Int = Field(default=2, ge=2, le=32)
    max_period: Int = Field(default=8, ge=2, le=32)
    history: Int = Field(default=64, ge=4, le=256)

    @model_validator(mode="after")
    def _periods(self) -> CycleGuard:
        if self.min_period > self.max_period:
            raise ValueError("min_period must not be greater than max_period")
        return self


class FixationGuard(_Model):
    window: Int = Field(default=4, ge=2, le=16)  # the tool's last calls compared
    similarity: Ratio = 0.70  # pairwise Jaccard of their input tokens


class ExplorationGuard(_Model):
    min_calls: Times = 8
    min_ratio: Ratio = 0.40  # unique (tool, input) pairs / calls


class SubagentGuard(_Model):
    tools: tuple[NonEmptyStr, ...] = ()  # tools that delegate to a sub-agent
    max_calls: Times = 3
    similarity: Ratio = 0.65  # two responses this alike in a row: no progress


class RetryGuard(_Model):
    max_retries: Times = 2  # per session, per task, per window
    window_seconds: Float = Field(default=3600.0, gt=0, le=MAX_WINDOW_SECONDS)
    # task -> a regex the input must match for a retry to make sense
    prechecks: dict[NonEmptyStr, Annotated[str, AfterValidator(_regex)]] = Field(
        default_factory=dict
    )


class HandoffGuard(_Model):
    max_handoffs: Times = 6
    max_visits: Times = 2


class KnowledgeGuard(_Model):
    max_queries: Times = 2  # per session, per topic, per window
    window_seconds: Float = Field(default=900.0, gt=0, le=MAX_WINDOW_SECONDS)


class ContextGuard(_Model):
    growth: Float = Field(default=1.35, gt=1, le=100)  # step-to-step growth factor
    growth_steps: Times = 3  # consecutive growths before the warning
    max_total_tokens: Int | None = Field(default=None, ge=1, le=10**13)


# The guard counts dollars in millionths (integers inside Redis Lua): a
# smaller budget would round to 0, which is "no budget".
MIN_BUDGET_USD = 0.000001
BUDGET_TOO_SMALL = "must be at least 0.000001 (one micro-dollar, the unit the guard counts in)"


def _budget_usd(value: float | None) -> float | None:
    if value is not None and value < MIN_BUDGET_USD:
        raise ValueError(BUDGET_TOO_SMALL)
    return value


class BudgetGuard(_Model):
    usd: Annotated[Float | None, AfterValidator(_budget_usd)] = Field(default=None, gt=0, le=10**7)
    tokens: Int | None = Field(default=None, ge=1, le=10**13)
    warn_at: Ratio = 0.8


class StepGuard(_Model):
    max_steps: Times = 50
    max_per_tool: Times = 25


class SessionBounds(_Model):
    """What one session keeps, so that its stored value and the cost of a
    check stay flat however long it runs and however many names the agent
    invents (docs/operations.md). Past a bound the least recently used tool,
    task or topic is forgotten (its counts start over if it comes back); the
    one an agent loops on is in use, so it stays."""

    max_tools: Int = Field(default=32, ge=1, le=1024)  # counts, streaks, fixation windows
    max_tasks: Int = Field(default=32, ge=1, le=1024)  # retried tasks and their windows
    max_topics: Int = Field(default=64, ge=1, le=1024)  # knowledge-base topics
    max_chain: Int = Field(default=64, ge=2, le=1024)  # newest agents of the hand-off chain
    max_tokens: Int = Field(default=64, ge=8, le=256)  # token hashes kept per call


class GuardProfile(_Model):
    """The limits one agent session is held to."""

    identical: WarnBlock = WarnBlock(warn_at=2, block_at=3)
    exempt_tools: tuple[NonEmptyStr, ...] = ()
    cycle: CycleGuard = CycleGuard()
    fixation: FixationGuard = FixationGuard()
    exploration: ExplorationGuard = ExplorationGuard()
    failures: WarnBlock = WarnBlock(warn_at=3, block_at=5)
    no_progress_at: Times = 3  # the same result from one tool this many times in a row
    subagents: SubagentGuard = SubagentGuard()
    retry: RetryGuard = RetryGuard()
    handoff: HandoffGuard = HandoffGuard()
    knowledge: KnowledgeGuard = KnowledgeGuard()
    context: ContextGuard = ContextGuard()
    budget: BudgetGuard = BudgetGuard()
    steps: StepGuard = StepGuard()
    session: SessionBounds = SessionBounds()

    @model_validator(mode="after")
    def _chain(self) -> GuardProfile:
        # Revisits are counted in the chain kept: a shorter one hides them.
        if self.session.max_chain < 2 * self.handoff.max_visits:
            raise ValueError("session.max_chain must be at least 2 * handoff.max_visits")
        return self


_PROFILE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class GuardConfig(_Model):
    """`guard:`: a `default` profile and named ones; a named profile states
    only what differs from `default`."""

    session_ttl_seconds: Int = Field(default=86400, ge=60, le=MAX_TTL_SECONDS)
    # Sessions this process keeps when it runs the guard itself (memory store,
    # or Redis unreachable); past it the least recently used is forgotten.
    max_sessions: Int = Field(default=10_000, ge=1, le=MAX_COUNT)
    profiles: dict[str, GuardProfile] = Field(default_factory=lambda: {"default": GuardProfile()})

    @field_validator("profiles", mode="before")
    @classmethod
    def _inherit(cls, value: Any) -> Any:
        if value is None:
            return {"default": {}}
        if not isinstance(value, Mapping):
            return value
        base = value.get("default") or {}
        out: dict[Any, Any] = {"default": base}
        for name, profile in value.items():
            if name != "default":
                merged = _deep_merge(base, profile) if isinstance(profile, Mapping) else profile
                out[name] = {} if profile is None else merged
        return out

    @field_validator("profiles")
    @classmethod
    def _names(cls, value: dict[str, GuardProfile]) -> dict[str, GuardProfile]:
        for name in value:
            if not _PROFILE_NAME.match(name):
                raise ValueError(f"profile name {name!r}: use 1-64 of A-Z a-z 0-9 _ . -")
        return value


def _deep_merge(base: Mapping[Any, Any], override: Mapping[Any, Any]) -> dict[Any, Any]:
    """`override` wins leaf by leaf; a null section in it does not erase `base`."""
    merged = dict(base)
    for key, value in override.items():
        old = merged.get(key)
        if isinstance(old, Mapping) and isinstance(value, Mapping):
            merged[key] = _deep_merge(old, value)
        elif isinstance(old, Mapping) and value is None:
            continue
        else:
            merged[key] = value
    return merged


def _merge_defaults(data: Any) -> Any:
    if not isinstance(data, Mapping):
        return data
    defaults, bots = data.get("defaults"), data.get("bots")
    if not isinstance(defaults, Mapping) or not isinstance(bots, list):
        return data
    # Only policy keys: an unknown key in defaults is reported there, once.
    inherited = {k: v for k, v in defaults.items() if k in POLICY_KEYS}
    return {
        **data,
        "bots": [_deep_merge(inherited, b) if isinstance(b, Mapping) else b for b in bots],
    }


class Config(_Model):
    """The whole validated configuration."""

    store: StoreConfig = StoreConfig()
    http: HttpConfig = HttpConfig()
    shutdown: ShutdownConfig = ShutdownConfig()
    guard: GuardConfig = GuardConfig()
    defaults: Policy = Policy()
    bots: list[BotConfig] = Field(default_factory=list, validate_default=True)

    @model_validator(mode="before")
    @classmethod
    def _apply_defaults(cls, data: Any) -> Any:
        return _merge_defaults(_none_to_empty(data))

    @field_validator("bots", mode="before")
    @classmethod
    def _bots_null(cls, value: Any) -> Any:
        return [] if value is None else value

    @field_validator("bots")
    @classmethod
    def _bots(cls, bots: list[BotConfig]) -> list[BotConfig]:
        if not bots:
            raise ValueError("at least one bot is required")
        first: dict[str, int] = {}
        for i, bot in enumerate(bots):
            if bot.name in first:
                raise PydanticCustomError(
                    _LOCATED,
                    "{message}",
                    {
                        "message": f"duplicate bot name {bot.name!r}"
                        f" (also bots[{first[bot.name]}])",
                        "at": (i, "name"),
                    },
                )
            first[bot.name] = i
        return bots

    @classmethod
    def default(cls) -> Config:
        """Built-in settings for running without a config file."""
        return cls.model_validate(
            {"bots": [{"name": "bot", "platform": "http", "backend": {"type": "echo"}}]}
        )

    def bot(self, name: str) -> BotConfig:
        for bot in self.bots:
            if bot.name == name:
                return bot
        configured = ", ".join(b.name for b in self.bots)
        raise UnknownBotError(f"no bot named {name!r} (configured: {configured})")


# --------------------------------------------------------------------------
# Environment interpolation
# --------------------------------------------------------------------------

_REFERENCE = re.compile(
    r"\$(?:(?P<dollar>\$)|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}"
    r"|(?P<bad>\{))"
)

KeyPath: TypeAlias = tuple[str | int, ...]


def _interpolate(node: Any, env: Mapping[str, str], path: KeyPath, problems: list[str]) -> Any:
    if isinstance(node, str):
        return _interpolate_str(node, env, path, problems)
    if isinstance(node, dict):
        return {k: _interpolate(v, env, (*path, str(k)), problems) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolate(v, env, (*path, i), problems) for i, v in enumerate(node)]
    return node


def _interpolate_str(text: str, env: Mapping[str, str], path: KeyPath, problems: list[str]) -> str:
    def replace(match: re.Match[str]) -> str:
        if match["dollar"]:
            return "$"
        if match["bad"]:
            problems.append(
                f"{_format_path(path)}: malformed reference: use ${{VAR}}, ${{VAR:-default}}"
                " or $$ for a literal $"
            )
            return ""
        name = match["name"]
        value = env.get(name)
        if match["default"] is not None:
            return value if value else match["default"]
        if value is None:
            problems.append(f"{_format_path(path)}: environment variable {name} is not set")
            return ""
        return value

    return _REFERENCE.sub(replace, text)


# --------------------------------------------------------------------------
# Error translation
# --------------------------------------------------------------------------


def _format_path(path: Iterable[str | int]) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            # A key that is empty, blank or holds a line break or a control
            # character is quoted: one problem stays one readable line.
            shown = part if part.isprintable() and part.strip() else repr(part)
            out += f".{shown}" if out else shown
    return out or "(top level)"


def _choices(expected: str) -> str:
    return ", ".join(re.findall(r"'([^']*)'", expected))


_SIMPLE_MESSAGES = {
    "extra_forbidden": "unknown key",
    "missing": "is required",
    "int_parsing": "must be an integer",
    "int_type": "must be an integer",
    "int_from_float": "must be an integer",
    "float_parsing": "must be a number",
    "float_type": "must be a number",
    "finite_number": "must be a finite number",
    "bool_parsing": "must be true or false",
    "bool_type": "must be true or false",
    "string_type": "must be a string",
    "string_too_short": "must not be empty",
    "list_type": "must be a list",
    "tuple_type": "must be a list",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping",
    "model_attributes_type": "must be a mapping",
}


def _translate(err: ErrorDetails) -> tuple[KeyPath, str]:
    kind = err["type"]
    ctx: dict[str, Any] = dict(err.get("ctx") or {})
    loc: list[str | int] = []
    for part in err["loc"]:
        prev = loc[-1] if loc else None
        if isinstance(prev, str) and prev in _TAGGED_FIELDS and part in _TAGGED_FIELDS[prev]:
            continue
        loc.append(part)

    if kind == _LOCATED:
        return (*loc, *ctx["at"]), str(ctx["message"])
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        field = loc[-1] if loc else None
        tags = _TAGGED_FIELDS.get(field, ()) if isinstance(field, str) else ()
        discriminator = str(ctx.get("discriminator", "'type'")).strip("'")
        choices = ", ".join(tags) or _choices(str(ctx.get("expected_tags", "")))
        return (*loc, discriminator), f"must be one of: {choices}"
    if kind in _SIMPLE_MESSAGES:
        return tuple(loc), _SIMPLE_MESSAGES[kind]
    bounds = {
        "greater_than_equal": (">=", "ge"),
        "greater_than": (">", "gt"),
        "less_than_equal": ("<=", "le"),
        "less_than": ("<", "lt"),
    }
    if kind in bounds:
        op, key = bounds[kind]
        bound = ctx.get(key)
        if isinstance(bound, float) and bound.is_integer():
            bound = int(bound)  # "must be > 0", not "> 0.0"
        return tuple(loc), f"must be {op} {bound}"
    if kind == "literal_error":
        return tuple(loc), f"must be one of: {_choices(str(ctx.get('expected', '')))}"
    if kind == "too_short":
        return tuple(loc), f"must have at least {ctx.get('min_length')} item(s)"
    msg = err["msg"]
    for prefix in ("Value error, ", "Assertion failed, "):
        msg = msg.removeprefix(prefix)
    return tuple(loc), msg


def _resolves(node: Any, path: KeyPath) -> bool:
    for part in path:
        if isinstance(part, str):
            found = isinstance(node, Mapping) and part in node
        else:
            found = isinstance(node, list) and 0 <= part < len(node)
        if not found:
            return False
        node = node[part]
    return True


def _problems(exc: ValidationError, raw: Any) -> list[str]:
    """pydantic's errors as `<path>: <message>` lines, inherited ones dropped.

    A bad value in `defaults` is merged into every bot; it is reported at
    `defaults.<path>` and not again at `bots[i].<path>` unless that bot set the
    same key itself.
    """
    items = [_translate(err) for err in exc.errors(include_url=False, include_input=False)]
    from_defaults = {(loc[1:], msg) for loc, msg in items if loc[:1] == ("defaults",)}
    bots = raw.get("bots") if isinstance(raw, Mapping) else None
    problems: dict[str, None] = {}  # ordered, and a set: a huge list of bad items stays fast
    for loc, msg in items:
        if len(loc) >= 2 and loc[0] == "bots" and isinstance(loc[1], int):
            own = bots[loc[1]] if isinstance(bots, list) and loc[1] < len(bots) else None
            if (loc[2:], msg) in from_defaults and not _resolves(own, loc[2:]):
                continue
        problems[f"{_format_path(loc)}: {msg}"] = None
    return list(problems)


# --------------------------------------------------------------------------
# YAML and the loaders
# --------------------------------------------------------------------------


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys instead of keeping the last one."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if not isinstance(node, yaml.MappingNode):  # `!!map [1]`, `!!set 1`
            return super().construct_mapping(node, deep)  # "expected a mapping node"
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(
                key_node, yaml.ScalarNode
            ):
                continue
            key = self.construct_object(key_node)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (yaml.YAMLError, RecursionError):
            raise
        except Exception as exc:
            # A scalar PyYAML's constructors choke on (an int past Python's
            # 4300-digit limit, a 13th month, an empty `!!int`): a YAML error
            # at that scalar, not a traceback.
            kind = str(node.tag).rsplit(":", 1)[-1]
            problem = f"cannot read this value as {kind}"
            if isinstance(exc, ValueError | OverflowError):
                problem += f": {str(exc).split(';')[0]}"
            raise yaml.constructor.ConstructorError(None, None, problem, node.start_mark) from None


def _parse_yaml(text: str, source: str) -> Any:
    loader: _StrictLoader | None = None
    try:
        loader = _StrictLoader(text)  # a SafeLoader subclass; its reader checks characters
        return loader.get_single_data()
    except yaml.reader.ReaderError as exc:
        # e.g. a NUL or another control character, which YAML does not allow
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        what = f"U+{exc.character:04X}" if isinstance(exc.character, int) else "this character"
        raise ConfigError(
            f"{source}: line {line}, column {column}: character {what} is not allowed in YAML"
        ) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "invalid YAML"
        if mark is None:
            raise ConfigError(f"{source}: {problem}") from None
        raise ConfigError(
            f"{source}: line {mark.line + 1}, column {mark.column + 1}: {problem}"
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply") from None
    except Exception as exc:
        # PyYAML's own, outside any node: the scanner's chr() of an escape such
        # as "\UFFFFFFFF" past Unicode's end, ...: an error, never a traceback.
        where = ""
        if loader is not None:
            mark = loader.get_mark()
            where = f"line {mark.line + 1}, column {mark.column + 1}: "
        raise ConfigError(f"{source}: {where}cannot read this value: {exc}") from None
    finally:
        if loader is not None:
            loader.dispose()


def _check_acyclic(
    node: Any, path: KeyPath, stack: set[int], sizes: dict[int, int] | None = None
) -> int:
    """How many values `node` holds once its aliases are expanded.

    YAML anchors can build a list that contains itself, or ("billion laughs")
    a few lines whose aliases expand to billions of values; refuse both up
    front. Each shared node is walked once (`sizes`), so this is linear in
    the file, not in the expansion."""
    if not isinstance(node, dict | list):
        return 1
    sizes = {} if sizes is None else sizes
    known = sizes.get(id(node))
    if known is not None:
        return known
    if id(node) in stack:
        raise ConfigError(f"{_format_path(path)}: a recursive alias is not allowed")
    stack.add(id(node))
    total = 1
    items = node.items() if isinstance(node, dict) else enumerate(node)
    for key, value in items:
        total += _check_acyclic(
            value, (*path, key if isinstance(key, int) else str(key)), stack, sizes
        )
        if total > MAX_VALUES:
            raise ConfigError(
                f"{_format_path(path)}: holds more than {MAX_VALUES} values once its aliases"
                " are expanded; a configuration is far smaller"
            )
    stack.discard(id(node))
    sizes[id(node)] = total
    return total


def parse_config(
    text: str, source: str = "<config>", env: Mapping[str, str] | None = None
) -> Config:
    """Validate YAML text; `source` names it in YAML syntax errors."""
    data = _parse_yaml(text, source)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError("(top level): must be a mapping")
    try:
        _check_acyclic(data, (), set())
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply") from None
    problems: list[str] = []
    data = _interpolate(data, os.environ if env is None else env, (), problems)
    if problems:
        raise ConfigError(problems)
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_problems(exc, data)) from None


def load_config(path: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> Config:
    """Read, interpolate and validate a config file. Its secrets are remembered
    (gateway/redact.py), so that no later log line or error message shows them."""
    name = os.fspath(path)
    try:
        with Path(name).open("rb") as file:  # at most one byte past the limit: /dev/zero ends
            raw = file.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"{name}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{name}: is a directory, not a file") from None
    except PermissionError:
        raise ConfigError(f"{name}: permission denied") from None
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(
            f"{name}: larger than {MAX_FILE_BYTES // 1024} KiB; a configuration file is far smaller"
        )
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{name}: not UTF-8 text (bad byte at offset {exc.start})") from None
    config = parse_config(text, source=name, env=env)
    remember(config)
    return config
