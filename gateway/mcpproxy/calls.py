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
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import mcp_types as mcp
from pydantic import ValidationError

from gateway.errors import BotbouncerError
from gateway.guard.normalize import signature
from gateway.guard.service import Answer, Guard

log = logging.getLogger("botbouncer.mcp_proxy")
NOTE = "botbouncer (loop guard): "
MAX_ROUNDS = 1024  # calls awaiting another round, at most (a client that never sends it)
RequestId = int | str | float  # float: an id such as 1.0, which a server may take (_odd_id)
# Where an id is the client's: one stdio connection (None), one MCP session or
# one HTTP exchange (gateway/mcpproxy/http.py); two clients both number their
# requests from 0.
Scope = str | None


def parse(raw: bytes | str) -> mcp.JSONRPCMessage | None:
    """A line's message, read with the SDK's types; when they refuse it, as
    a server that reads more leniently would (_lenient); None when neither
    can read it."""
    try:
        message = mcp.jsonrpc_message_adapter.validate_json(raw)
    except ValidationError:
        return _lenient(raw)
    if isinstance(message, mcp.JSONRPCNotification) and message.method == "tools/call":
        return _lenient(raw)  # an id the SDK's types drop (1.0) makes it no call for them
    return message


def _lenient(raw: bytes | str) -> mcp.JSONRPCMessage | None:
    """A message as servers that take more than the SDK's types read it: bytes
    that are not UTF-8 decoded with replacement characters (as the SDK's own
    stdio server decodes its input), lone surrogate escapes (`"\\ud83d"`, a
    string cut mid-emoji) kept as json.loads keeps them. A tool call the
    server runs is a step, whatever the proxy's own types make of it."""
    try:
        item = json.loads(raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw)
    except (ValueError, RecursionError):
        return None
    return _message(item)


def dump(message: mcp.JSONRPCMessage) -> bytes:
    """A message made here (a block's answer, a result with a warning added),
    compact; the id as the client gave it (_odd_id)."""
    return compact(message.model_dump(by_alias=True, exclude_none=True, warnings=False))


def compact(value: Any) -> bytes:
    """JSON as the SDKs write it (compact, UTF-8); with a lone surrogate in
    a string, which UTF-8 cannot hold, as an ASCII escape."""
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
    except UnicodeEncodeError:
        return json.dumps(value, separators=(",", ":")).encode()


def is_batch(raw: bytes) -> bool:
    """A JSON-RPC batch (an array of messages) rather than one message."""
    return raw.lstrip()[:1] == b"["


def dump_batch(messages: list[mcp.JSONRPCMessage]) -> bytes:
    return b"[" + b",".join(dump(m) for m in messages) + b"]"


def _items(raw: bytes) -> list[Any] | None:
    """A batch's messages, or None when it is not one json can read. A
    message nested deeper than the guard takes is still read: it is judged
    on its own, as it would be outside a batch."""
    try:
        items = json.loads(raw.decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        log.warning("mcp proxy: a batch of %d bytes that json cannot read passed unread",
                    len(raw))  # fmt: skip
        return None
    return items if isinstance(items, list) and items else None


def _message(item: Any) -> mcp.JSONRPCMessage | None:
    try:
        message = mcp.jsonrpc_message_adapter.validate_python(item)
    except ValidationError:
        return _odd_id(item)
    except RecursionError:
        return None
    if isinstance(message, mcp.JSONRPCNotification) and message.method == "tools/call":
        return _odd_id(item)  # the SDK's types drop an id such as 1.0: no call for them
    return message


def _odd_id(item: Any) -> mcp.JSONRPCMessage | None:
    """A `tools/call`, or an answer to one, whose id the SDK's types refuse
    but a server may take: a number such as 1.0 (JavaScript's 1). The id is
    kept as written, so the answer finds its call (1 == 1.0) and a block is
    answered to it; None for anything else."""
    if not isinstance(item, dict) or not isinstance(rid := item.get("id"), float):
        return None
    message: mcp.JSONRPCMessage
    try:
        if item.get("method") == "tools/call":
            params = item.get("params")
            message = mcp.JSONRPCRequest.model_construct(
                jsonrpc="2.0", id=rid, method="tools/call", params=params
            )
        elif isinstance(item.get("result"), dict):
            message = mcp.JSONRPCResponse.model_construct(
                jsonrpc="2.0", id=rid, result=item["result"]
            )
        elif "error" in item:
            error = mcp.ErrorData.model_validate(item["error"])
            message = mcp.JSONRPCError.model_construct(jsonrpc="2.0", id=rid, error=error)
        else:
            return None
    except ValidationError:
        return None
    return message


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


def result_text(result: dict[str, Any]) -> str:
    """A result (a CallToolResult as JSON) as the guard compares it: its text
    content, else its structured content."""
    content = result.get("content")
    blocks = content if isinstance(content, list) else []
    texts = [
        b["text"]
        for b in blocks
        if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
    ]
    if texts:
        return "\n".join(texts)
    structured = result.get("structuredContent")
    if structured is not None:
        return json.dumps(structured, sort_keys=True, default=str)
    return ""


@dataclass
class Pending:
    tool: str
    step: Answer | None  # None when the guard could not take the step, or took none
    args: Any = None


class ToolCalls:
    """The tool calls of one client connection, between its request and its answer."""

    def __init__(self, guard: Guard, session: str, profile: str, warn_note: bool = True) -> None:
        self.guard = guard
        self.session = session
        self.profile = profile
        self.warn_note = warn_note
        self.pending: dict[tuple[Scope, RequestId], Pending] = {}
        self.recording: set[asyncio.Task[None]] = set()  # results being recorded
        self.note: str | None = None  # a result's warning, for the next result
        # Calls (signature) the server asked input for: their next round is no new step.
        self.rounds: set[str] = set()

    async def from_client(
        self, message: mcp.JSONRPCMessage, scope: Scope = None
    ) -> mcp.JSONRPCMessage | None:
        """None: forward the message as it came; else the answer to send back
        to the client instead of forwarding it. `scope`: whose ids (Scope)."""
        if isinstance(message, mcp.JSONRPCNotification):
            if message.method == "notifications/cancelled" and message.params:
                # The client gave up on it: an answer that still comes is not its result.
                rid = message.params.get("requestId")
                # Only an id names a call: a list would not even hash, true is 1.
                if isinstance(rid, int | str | float) and not isinstance(rid, bool):
                    self.pending.pop((scope, rid), None)
            return None
        if not isinstance(message, mcp.JSONRPCRequest) or message.method != "tools/call":
            return None
        # Read as servers read it: the tool's name and its arguments. A field
        # the SDK's types would refuse (a `task` of the wrong shape, say) is
        # the server's to judge, and no reason to let the call by unguarded.
        params = message.params if isinstance(message.params, dict) else {}
        tool = params.get("name")
        if not isinstance(tool, str) or not tool:
            return None  # no tool to run: the server says what is wrong with it
        args = params.get("arguments")
        if "requestState" in params or "inputResponses" in params:
            round_of = signature(tool, args)
            if round_of in self.rounds:
                # Another round of a call the server asked input for (the
                # protocol's multi-round tool calls): the same run of the
                # tool, stepped on its first round; its final answer is its result.
                self.rounds.discard(round_of)
                self.pending[scope, message.id] = Pending(tool, None, args)
                return None
        await self.settle()  # judged on every result before it
        answer = await self._check("step", {"tool": tool, "args": {} if args is None else args})
        if answer is not None and answer.decision == "warn":
            log.info("mcp proxy session=%s warn %s: %s", self.session, answer.reason, tool)
        if answer is not None and answer.decision == "block":
            log.warning("mcp proxy session=%s block %s: %s not called", self.session,
                        answer.reason, tool)  # fmt: skip
            result = mcp.CallToolResult(
                content=[mcp.TextContent(type="text", text=NOTE + answer.message)], is_error=True
            )
            blocked: mcp.JSONRPCMessage = mcp.JSONRPCResponse.model_construct(
                jsonrpc="2.0",
                id=message.id,  # as the client wrote it (_odd_id)
                result=result.model_dump(by_alias=True, exclude_none=True, mode="json"),
            )
            return blocked
        self.pending[scope, message.id] = Pending(tool, answer, args)
        return None

    async def _from_server(
        self, message: mcp.JSONRPCMessage, scope: Scope
    ) -> mcp.JSONRPCMessage | None:
        """None: forward the message as it came; else the message to send instead.

        The result is recorded after this returns (`_track`): the answer
        goes to the client first, and the next call's step waits for the
        record (`settle`). A warning the result raises reaches the model with
        the next result, as does one that finds no content to join (a
        JSON-RPC error)."""
        taken = self._take(message, scope)
        if taken is None:
            return None
        call, body = taken
        self._track(self._result(body))
        if not self.warn_note:
            return None
        note = call.step.message if call.step is not None and call.step.decision == "warn" else None
        note, self.note = note or self.note, None
        if note is None:
            return None
        if not isinstance(message, mcp.JSONRPCResponse):
            self.note = note  # a JSON-RPC error: nothing to add it to, the next result takes it
            return None
        result = message.result
        content = result.get("content")
        if not isinstance(content, list):
            self.note = note
            return None
        # The model reads the warning beside the result it asked for, a
        # failure too: a failing call's warning is the one most worth reading.
        block = {"type": "text", "text": NOTE + note}
        content = [*content, block]
        noted: mcp.JSONRPCMessage = mcp.JSONRPCResponse.model_construct(
            jsonrpc="2.0", id=message.id, result={**result, "content": content}
        )  # the id as it came (_odd_id)
        return noted

    async def from_server_raw(self, raw: bytes, scope: Scope = None) -> bytes | None:
        """A line (or body) of the server's: None to relay it as it came, else
        the bytes to relay instead.

        While no answer can be changed (no warning waits to be added to one)
        it is relayed unread: it is read and its result recorded after, in a
        task the next step waits for like any other record, so what the
        proxy does with an answer costs the client no time."""
        if not self.warn_note or (self.note is None and not self._warned()):
            self._track(self._relayed(raw, scope))
            return None
        if is_batch(raw):
            return await self._from_server_batch(raw, scope)
        message = parse(raw)
        instead = await self._from_server(message, scope) if message is not None else None
        return dump(instead) if instead is not None else None

    def _warned(self) -> bool:
        """Some call awaiting its answer was warned (its answer gets the warning)."""
        return any(p.step is not None and p.step.decision == "warn" for p in self.pending.values())

    async def _relayed(self, raw: bytes, scope: Scope) -> None:
        """Record what an answer relayed unread holds (from_server_raw). Every
        call it answers is taken before any is recorded: an answer relayed
        after it (the proxy's failure for the calls of a refused request)
        finds only the calls this one did not answer."""
        taken = [self._take(m, scope) if m is not None else None for m in _messages(raw)]
        for answer in taken:
            if answer is not None:
                await self._result(answer[1])

    def _take(
        self, message: mcp.JSONRPCMessage, scope: Scope
    ) -> tuple[Pending, dict[str, Any]] | None:
        """The call a message answers (no longer pending) and the guard result
        it makes; None when it answers no tool call of ours, or is not the
        call's result: a request for input (another round comes, with the
        result), a task the call became."""
        if not isinstance(message, mcp.JSONRPCResponse | mcp.JSONRPCError):
            return None
        if message.id is None:
            return None
        call = self.pending.pop((scope, message.id), None)
        if call is None:
            return None
        # The call's arguments name which call it answers: calls of one tool
        # may run side by side, their answers in any order.
        args = {} if call.args is None else call.args
        if isinstance(message, mcp.JSONRPCError):
            return call, {"tool": call.tool, "ok": False, "output": message.error.message,
                          "args": args}  # fmt: skip
        result = message.result
        if not isinstance(result, dict):
            return None
        if result.get("resultType") == "input_required":  # another round comes: not the result
            if len(self.rounds) >= MAX_ROUNDS:
                self.rounds.clear()
            self.rounds.add(signature(call.tool, call.args))
            return None
        if "task" in result and "content" not in result:  # CreateTaskResult
            return None
        # Read as clients read it: a result the SDK's types refuse (no
        # `content`, as the TypeScript client allows) is still one.
        return call, {"tool": call.tool, "ok": result.get("isError") is not True,
                      "output": result_text(result), "args": args}  # fmt: skip

    async def from_client_batch(self, raw: bytes, scope: Scope = None) -> ClientBatch:
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
            answer = await self.from_client(message, scope) if message is not None else None
            if answer is None:
                kept.append(item)
            else:
                answers.append(answer)
        if not answers:
            return ClientBatch(raw, [])
        return ClientBatch(compact(kept) if kept else None, answers)

    async def _from_server_batch(self, raw: bytes, scope: Scope) -> bytes | None:
        """A JSON-RPC batch from the server: None to forward it as it came,
        else the batch to send instead (each message as _from_server has it)."""
        items = _items(raw)
        if items is None:
            return None
        out: list[Any] = []
        changed = False
        for item in items:
            message = _message(item)
            instead = await self._from_server(message, scope) if message is not None else None
            if instead is None:
                out.append(item)
            else:
                out.append(instead.model_dump(by_alias=True, exclude_none=True, warnings=False))
                changed = True
        return compact(out) if changed else None

    def forget(self, scope: Scope, ids: Sequence[RequestId] | None = None) -> None:
        """The calls of a scope whose answers can no longer come (an HTTP
        exchange that ended; with `ids`, only those calls): no longer pending
        once the answers it did relay are recorded (they are read after the
        relay, in tasks)."""
        relayed = list(self.recording)

        async def forget() -> None:
            await asyncio.gather(*relayed, return_exceptions=True)  # settle() says how they ended
            for key in [k for k in self.pending if k[0] == scope and (ids is None or k[1] in ids)]:
                del self.pending[key]

        self._track(forget())

    def unanswered(self, raw: bytes, scope: Scope) -> None:
        """The calls of a request whose answers cannot come (its exchange
        was cut short; or the server refused it, or could not be reached, and
        the failure recorded for it named no call, an id it could not read):
        forgotten."""
        ids = [m.id for m in _messages(raw) if isinstance(m, mcp.JSONRPCRequest)]
        if any((scope, rid) in self.pending for rid in ids):
            self.forget(scope, ids)

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
