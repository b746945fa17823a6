"""Every client session for calls leaving the host comes from
gateway/outbound.py's `client_session`, which honours HTTP_PROXY, HTTPS_PROXY
and NO_PROXY. The LLM proxy, the MCP proxy and the alerts are shown going
through a proxy the environment names in their own tests
(`..._through_the_proxy_the_environment_names`); this keeps a new session
from being made another way."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from gateway.outbound import client_session

ROOT = Path(__file__).resolve().parent.parent
# The agent guard's client talks to the daemon, usually on the same host or
# network, as the agent configures it: no proxy from the environment there.
ALLOWED = {"gateway/outbound.py", "gateway/guard/client.py"}


def test_every_outgoing_session_is_made_by_client_session() -> None:
    made = {
        str(path.relative_to(ROOT))
        for folder in ("gateway", "adapters", "botbouncer")
        for path in (ROOT / folder).rglob("*.py")
        if re.search(r"\bClientSession\(", path.read_text())
    }
    assert made <= ALLOWED, sorted(made - ALLOWED)


async def test_the_environment_is_read_per_request_only_when_it_names_a_proxy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Breaks if every session trusts the environment: aiohttp then reads it
    # again on every request (0.2 ms) and looks for ~/.netrc in a thread, on
    # every model request and tool call the proxies forward.
    for name in list(os.environ):
        if name.lower() in ("http_proxy", "https_proxy", "all_proxy", "ws_proxy", "wss_proxy"):
            monkeypatch.delenv(name)
    async with client_session() as plain:
        assert not plain.trust_env
    monkeypatch.setenv("https_proxy", "http://proxy.example:3128")
    async with client_session() as proxied:
        assert proxied.trust_env
