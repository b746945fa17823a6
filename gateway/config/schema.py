"""The whole configuration: process settings, the guard, `defaults` and the bots."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from gateway.config.alerts import AlertTarget
from gateway.config.bots import BotConfig
from gateway.config.errors import LOCATED, UnknownBotError
from gateway.config.llmproxy import LlmProxyConfig
from gateway.config.mcpproxy import McpProxyConfig
from gateway.config.policy import POLICY_KEYS, Policy
from gateway.config.process import HttpConfig, ShutdownConfig, StoreConfig
from gateway.fields import Model, deep_merge, none_to_empty
from gateway.guard.profiles import GuardConfig

# discord.py's own API base (discord.http.Route.BASE), where a bot without api_base goes.
DISCORD_API = "https://discord.com/api/v10"


def _discord_base(api_base: str | None) -> str:
    return (api_base or DISCORD_API).rstrip("/")


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
        "bots": [deep_merge(inherited, b) if isinstance(b, Mapping) else b for b in bots],
    }


class Config(Model):
    """The whole validated configuration."""

    store: StoreConfig = StoreConfig()
    http: HttpConfig = HttpConfig()
    shutdown: ShutdownConfig = ShutdownConfig()
    guard: GuardConfig = GuardConfig()
    llm_proxy: LlmProxyConfig | None = None
    mcp_proxy: McpProxyConfig | None = None
    alerts: list[AlertTarget] = Field(default_factory=list)
    defaults: Policy = Policy()
    bots: list[BotConfig] = Field(default_factory=list, validate_default=True)

    @model_validator(mode="before")
    @classmethod
    def _apply_defaults(cls, data: Any) -> Any:
        return _merge_defaults(none_to_empty(data))

    @field_validator("bots", "alerts", mode="before")
    @classmethod
    def _bots_null(cls, value: Any) -> Any:
        return [] if value is None else value

    @field_validator("bots")
    @classmethod
    def _bots(cls, bots: list[BotConfig]) -> list[BotConfig]:
        first: dict[str, int] = {}
        for i, bot in enumerate(bots):
            if bot.name in first:
                raise PydanticCustomError(
                    LOCATED,
                    "{message}",
                    {
                        "message": f"duplicate bot name {bot.name!r}"
                        f" (also bots[{first[bot.name]}])",
                        "at": (i, "name"),
                    },
                )
            first[bot.name] = i
        # discord.py keeps its API base in a class attribute: one per process.
        discord = [(i, b) for i, b in enumerate(bots) if b.platform == "discord" and
                   b.mode == "proxy"]  # fmt: skip
        for i, bot in discord[1:]:
            _, head = discord[0]
            base, other = _discord_base(bot.api_base), _discord_base(head.api_base)
            if base != other:
                raise PydanticCustomError(
                    LOCATED,
                    "{message}",
                    {
                        "message": f"{base} differs from bot {head.name}'s {other}: discord.py "
                        "takes one API base per process, so run them in two daemons",
                        "at": (i, "api_base"),
                    },
                )
        return bots

    @field_validator("llm_proxy", "mcp_proxy", mode="before")
    @classmethod
    def _proxy_section(cls, value: Any) -> Any:
        return none_to_empty(value)  # `llm_proxy:` with every key commented out: on, defaults

    @model_validator(mode="after")
    def _something_to_guard(self) -> Config:
        # After the fields: a broken llm_proxy section is reported as itself,
        # not as "no bots" too.
        if not self.bots and self.llm_proxy is None and self.mcp_proxy is None:
            raise PydanticCustomError(
                LOCATED,
                "{message}",
                {
                    "message": "at least one bot is required "
                    "(or an llm_proxy or mcp_proxy section)",
                    "at": ("bots",),
                },
            )
        return self

    @model_validator(mode="after")
    def _proxy_profile(self) -> Config:
        for section, proxy in (("llm_proxy", self.llm_proxy), ("mcp_proxy", self.mcp_proxy)):
            if proxy is not None and proxy.profile not in self.guard.profiles:
                known = ", ".join(sorted(self.guard.profiles))
                raise PydanticCustomError(
                    LOCATED,
                    "{message}",
                    {
                        "message": f"no guard profile named {proxy.profile!r} (profiles: {known})",
                        "at": (section, "profile"),
                    },
                )
        return self

    @classmethod
    def default(cls) -> Config:
        """Built-in settings for running without a config file."""
        return cls.model_validate(
            {"bots": [{"name": "bot", "platform": "http", "backend": {"type": "echo"}}]}
        )

    def served(self) -> str:
        """What the daemon serves besides the guard, for check-config and the
        start-up log: `bots: a (http), b (discord); llm proxy: /llm/openai`."""
        parts = []
        if self.bots or self.llm_proxy is None:
            bots = ", ".join(f"{b.name} ({b.platform})" for b in self.bots)
            parts.append(f"bots: {bots or 'none'}")
        if self.llm_proxy is not None:
            paths = ", ".join(api.path for _, api in self.llm_proxy.apis())
            parts.append(f"llm proxy: {paths or 'none (neither openai nor anthropic is set)'}")
        return "; ".join(parts)

    def bot(self, name: str) -> BotConfig:
        for bot in self.bots:
            if bot.name == name:
                return bot
        configured = ", ".join(b.name for b in self.bots)
        raise UnknownBotError(f"no bot named {name!r} (configured: {configured})")
