"""`mcp_proxy:` settings of `botbouncer mcp-proxy` (docs/mcp-proxy.md); its
command line (--profile) overrides them."""

from __future__ import annotations

from gateway.fields import Model, NonEmptyStr


class McpProxyConfig(Model):
    profile: NonEmptyStr = "default"  # the guard profile the sessions run under
    # A warning from the guard is added to the tool's (successful) result as
    # one more text block, for the model to read beside it.
    warn_note: bool = True
