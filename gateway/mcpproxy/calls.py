"""What the MCP proxy does to the messages it relays (docs/mcp-proxy.md): a
`tools/call` request is a guard step before it is forwarded and its answer a
guard result; a call the guard blocks is answered here, with a
CallToolResult whose `isError` is true and whose text is the guard's message,
and the server never sees it. Every other message, and every message this
leaves alone, is relayed as the bytes it came as.

Both transports (gateway/mcpproxy/stdio.py, http.py) hand each message to
`ToolCalls`, one per client connection: `from_client` for what the client
sends, `from_server_raw` for the lines (or bodies) the server sends, which
are relayed before they are read unless a warning waits to be added (a
JSON-RPC batch from the client goes to `from_client_batch`, which takes it
message by message). Messages are read with the
MCP SDK's own types (mcp_types); one that does not parse is not ours to
judge and passes untouched.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

import mcp_types as mcp
from pydantic import ValidationError

from gateway.errors import BotbouncerError
from gateway.guard.normalize import loads
from gateway.guard.service import Answer, Guard

log = logging.getLogger("botbouncer.mcp_proxy")
NOTE = "botbouncer (loop guard): "
RequestId = int | str


def parse(raw: bytes | str) -> mcp.JSONRPCMessage | None:
    try:
        return mcp.jsonrpc_message_adapter.validate_json(raw)
    except ValidationError:
        return None


def dump(message: mcp.JSONRPCMessage) -> bytes:
    return message.model_dump_json(by_alias=True, exclude_none=True).encode()


def is_batch(raw: bytes) -> bool:
    """A JSON-RPC batch (an array of messages) rather than one message."""
    return raw.lstrip()[:1] == b"["


def dump_batch(messages: list[mcp.JSONRPCMessage]) -> bytes:
    return b"[" + b",".join(dump(m) for m in messages) + b"]"


def _items(raw: bytes) -> list[Any] | None:
    """A batch's messages, or None when it is not one we can read (nested
    deeper than the guard takes, among others)."""
    try:
        items = loads(raw)
    except ValueError:
        return None
    return items if isinstance(items, list) and items else None


def _message(item: Any) -> mcp.JSONRPCMessage | None:
    try:
        return mcp.jsonrpc_message_adapter.validate_python(item)
    except ValidationError:
        return None


def _messages(raw: bytes) -> list[mcp.JSONRPCMessage | None]:
    """A line's message, or a batch's messages (None for one we cannot read)."""
    if is_batch(raw):
        return [_message(item) for item in _items(raw) or []]
    return [parse(raw)]


@dataclass
class ClientBatch:
    """What becomes of a client's batch: `forward` the bytes to send the
    server (as they came when nothing in it was blocked, the rest of it
    when some was, None when nothing is left) and the answers given here."""

    forward: bytes | None
    answers: list[mcp.JSONRPCMessage]


def result_text(result: mcp.CallToolResult) -> str:
    """A result as the guard compares it: its text content, else its structured content."""
    texts = [b.text for b in result.content if isinstance(b, mcp.TextContent)]
    if texts:
        return "\n".join(texts)
    if result.structured_content is not None:
        return json.dumps(result.structured_content, sort_keys=True, default=str)
    return ""


@dataclass
class Pending:
    tool: str
    step: Answer | None  # None when the guard could not take the step


class ToolCalls:
    """The tool calls of one client connection, between its request and its answer."""

    def __init__(self, guard: Guard, session: str, profile: str, warn_note: bool = True) -> None:
        self.guard = guard
        self.session = session
        self.profile = profile
        self.warn_note = warn_note
        self.pending: dict[RequestId, Pending] = {}
        self.recording: set[asyncio.Task[None]] = set()  # results being recorded
        self.note: str | None = None  # a result's warning, for the next result

    async def from_client(self, message: mcp.JSONRPCMessage) -> mcp.JSONRPCMessage | None:
        """None: forward the message as it came; else the answer to send back
        to the client instead of forwarding it."""
        if isinstance(message, mcp.JSONRPCNotification):
            if message.method == "notifications/cancelled" and message.params:
                # The client gave up on it: an answer that still comes is not its result.
                self.pending.pop(message.params.get("requestId"), None)  # type: ignore[arg-type]
            return None
        if not isinstance(message, mcp.JSONRPCRequest) or message.method != "tools/call":
            return None
        try:
            params = mcp.CallToolRequestParams.model_validate(message.params or {})
        except ValidationError:
            return None  # the server says what is wrong with it
        await self.settle()  # judged on every result before it
        answer = await self._check("step", {"tool": params.name, "args": params.arguments or {}})
        if answer is not None and answer.decision == "block":
            log.info("mcp proxy session=%s block %s: %s not called", self.session,
                     answer.reason, params.name)  # fmt: skip
            result = mcp.CallToolResult(
                content=[mcp.TextContent(type="text", text=NOTE + answer.message)], is_error=True
            )
            return mcp.JSONRPCResponse(
                jsonrpc="2.0",
                id=message.id,
                result=result.model_dump(by_alias=True, exclude_none=True, mode="json"),
            )
        self.pending[message.id] = Pending(params.name, answer)
        return None

    async def _from_server(self, message: mcp.JSONRPCMessage) -> mcp.JSONRPCMessage | None:
        """None: forward the message as it came; else the message to send instead.

        The result is recorded after this returns (`_track`): the answer
        goes to the client first, and the next call's step waits for the
        record (`settle`). A warning the result raises reaches the model with
        the next successful result."""
        taken = self._take(message)
        if taken is None:
            return None
        call, body, result = taken
        self._track(self._result(body))
        if result is None or result.is_error or not self.warn_note:
            return None
        note = call.step.message if call.step is not None and call.step.decision == "warn" else None
        note, self.note = note or self.note, None
        if note is None:
            return None
        # The model reads the warning beside the result it asked for.
        assert isinstance(message, mcp.JSONRPCResponse)
        block = {"type": "text", "text": NOTE + note}
        content = [*message.result.get("content", []), block]
        return mcp.JSONRPCResponse(
            jsonrpc="2.0", id=message.id, result={**message.result, "content": content}
        )

    async def from_server_raw(self, raw: bytes) -> bytes | None:
        """A line (or body) of the server's: None to relay it as it came, else
        the bytes to relay instead.

        While no answer can be changed (no warning waits to be added to one)
        it is relayed unread: it is read and its result recorded after, in a
        task the next step waits for like any other record, so what the
        proxy does with an answer costs the client no time."""
        if not self.warn_note or (self.note is None and not self._warned()):
            self._track(self._relayed(raw))
            return None
        if is_batch(raw):
            return await self._from_server_batch(raw)
        message = parse(raw)
        instead = await self._from_server(message) if message is not None else None
        return dump(instead) if instead is not None else None

    def _warned(self) -> bool:
        """Some call awaiting its answer was warned (its answer gets the warning)."""
        return any(p.step is not None and p.step.decision == "warn" for p in self.pending.values())

    async def _relayed(self, raw: bytes) -> None:
        """Record what an answer relayed unread holds (from_server_raw)."""
        for message in _messages(raw):
            taken = self._take(message) if message is not None else None
            if taken is not None:
                await self._result(taken[1])

    def _take(
        self, message: mcp.JSONRPCMessage
    ) -> tuple[Pending, dict[str, Any], mcp.CallToolResult | None] | None:
        """The call a message answers (no longer pending), the guard result it
        makes and, when it is a CallToolResult, that; None when it answers no
        tool call of ours or is not a result the guard can read."""
        if not isinstance(message, mcp.JSONRPCResponse | mcp.JSONRPCError):
            return None
        if message.id is None:
            return None
        call = self.pending.pop(message.id, None)
        if call is None:
            return None
        if isinstance(message, mcp.JSONRPCError):
            return call, {"tool": call.tool, "ok": False, "output": message.error.message}, None
        try:
            result = mcp.CallToolResult.model_validate(message.result)
        except ValidationError:
            return None
        body = {"tool": call.tool, "ok": not result.is_error, "output": result_text(result)}
        return call, body, result

    async def from_client_batch(self, raw: bytes) -> ClientBatch:
        """A JSON-RPC batch from the client (the protocol's 2025-03-26
        revision has them, and servers on it must take them): every message
        in it is what it would be on its own, in order, so a tools/call in a
        batch is a step like any other and a blocked one is answered here."""
        items = _items(raw)
        if items is None:
            return ClientBatch(raw, [])
        kept: list[Any] = []
        answers: list[mcp.JSONRPCMessage] = []
        for item in items:
            message = _message(item)
            answer = await self.from_client(message) if message is not None else None
            if answer is None:
                kept.append(item)
            else:
                answers.append(answer)
        if not answers:
            return ClientBatch(raw, [])
        rest = json.dumps(kept, ensure_ascii=False, separators=(",", ":")).encode()
        return ClientBatch(rest if kept else None, answers)

    async def _from_server_batch(self, raw: bytes) -> bytes | None:
        """A JSON-RPC batch from the server: None to forward it as it came,
        else the batch to send instead (each message as _from_server has it)."""
        items = _items(raw)
        if items is None:
            return None
        out: list[Any] = []
        changed = False
        for item in items:
            message = _message(item)
            instead = await self._from_server(message) if message is not None else None
            if instead is None:
                out.append(item)
            else:
                out.append(instead.model_dump(by_alias=True, exclude_none=True, mode="json"))
                changed = True
        return (
            json.dumps(out, ensure_ascii=False, separators=(",", ":")).encode() if changed else None
        )

    def _track(self, record: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(record)
        self.recording.add(task)
        task.add_done_callback(self.recording.discard)

    async def _result(self, body: dict[str, Any]) -> None:
        answer = await self._check("result", body)
        if answer is not None and answer.decision == "warn":
            self.note = answer.message

    async def settle(self) -> None:
        """Until every result handed on has been recorded."""
        while self.recording:
            await asyncio.gather(*self.recording)

    async def _check(self, op: str, body: dict[str, Any]) -> Answer | None:
        """The guard's answer, or None when it has none to give (the store
        failed, a tool name it does not take): the call then goes on unguarded."""
        try:
            if op == "step":
                return await self.guard.step(self.session, body, self.profile)
            return await self.guard.result(self.session, body, self.profile)
        except BotbouncerError as exc:
            log.warning("mcp proxy session=%s: %s of %.60r not checked: %s", self.session, op,
                        body.get("tool"), exc)  # fmt: skip
            return None
