"""Process-wide settings: where state lives, the HTTP server, shutdown."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from gateway import defaults
from gateway.fields import MAX_COUNT, MAX_TTL_SECONDS, Float, Int, Model, OptionalSecret

STORE_SCHEMES = ("memory", "redis", "rediss", "redis+cluster", "redis+sentinel", "rediss+sentinel")


class StoreConfig(Model):
    """Where state lives (docs/architecture.md)."""

    url: str = "memory://"
    state_ttl_seconds: Int = Field(default=defaults.STATE_TTL_SECONDS, ge=60, le=MAX_TTL_SECONDS)
    settings_ttl_seconds: Int = Field(
        default=defaults.SETTINGS_TTL_SECONDS, ge=60, le=MAX_TTL_SECONDS
    )
    # How long one Redis call may take before the message is decided on this
    # process's memory instead (and the store reports itself degraded).
    timeout_seconds: Float = Field(default=0.5, gt=0, le=10)
    # Chats this process's memory holds (memory://, and Redis's local fallback);
    # past it the least recently used is forgotten. The ingress takes no token,
    # so without a bound anyone who reaches it could grow the daemon for the
    # state TTL. 100,000 chats of a few messages each are ~330 MB; were every
    # one at its bounds (50 decisions, 128 dedupe ids, full context) ~5 GB.
    max_chats: Int = Field(default=defaults.MAX_CHATS, ge=1, le=10_000_000)
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
        # A scheme is case-insensitive; the store is chosen by the lowercase one.
        value = scheme.lower() + value[len(scheme) :]
        if scheme.lower().endswith("+sentinel"):
            from gateway.store.redis import SentinelUrl  # the one parser of these URLs

            SentinelUrl.parse(value)  # its ValueError names the part, never the password
            return value
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
    # redis-py also takes the password as a query parameter; a Sentinel URL
    # the sentinels' own as sentinel_password=
    return re.sub(r"([?&](?:sentinel_)?password=)[^&#]*", r"\1***", url, flags=re.IGNORECASE)


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


class HttpConfig(Model):
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


class ShutdownConfig(Model):
    """What SIGTERM/SIGINT waits for before it cancels the rest."""

    grace_seconds: Float = Field(default=10.0, ge=0)
