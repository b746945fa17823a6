"""Every client session for calls leaving the host comes from
gateway/outbound.py's `client_session`, which honours HTTP_PROXY, HTTPS_PROXY
and NO_PROXY. The LLM proxy, the MCP proxy and the alerts are shown going
through a proxy the environment names in their own tests
(`..._through_the_proxy_the_environment_names`); this keeps a new session
from being made another way."""

from __future__ import annotations

import re
from pathlib import Path

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
