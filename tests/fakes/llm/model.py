"""What the fake LLM records and what it says, apart from any wire format.

A `Reply` is one model turn (text and/or tool calls); `openai_wire`,
`anthropic_wire` and `responses_wire` render it as a chat.completion, a
Messages API message or a Responses API response, whole or as an SSE
stream. A `Call` is one recorded request.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

Json = dict[str, Any]
Api = Literal["openai", "anthropic", "responses"]


@dataclass(frozen=True)
class ToolCall:
    """The model asks for tool `name` with `arguments` (a JSON object, or a
    string sent verbatim as the arguments text). `id` None: a fresh id per
    response (`call_fake_N` / `toolu_fake_N`), as a real upstream gives (the
    Responses API's `call_id`; its item id is `fc_fake_N` either way)."""

    name: str
    arguments: Json | str = field(default_factory=dict)
    id: str | None = None

    @property
    def arguments_json(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments, separators=(",", ":"))

    @property
    def input(self) -> Any:
        """The arguments as Anthropic's `tool_use.input` (an object)."""
        return json.loads(self.arguments) if isinstance(self.arguments, str) else self.arguments


@dataclass(frozen=True)
class Reply:
    """One model turn. `finish_reason` is in OpenAI's words ("stop", "length",
    "tool_calls", ...; None: "tool_calls" when there are tool calls, else
    "stop"); Anthropic's stop_reason is mapped from it. `usage` is
    (prompt/input tokens, completion/output tokens); None: estimated from the
    request's and the reply's sizes (about 4 characters a token). `cached`:
    how many of the input tokens were read from the provider's prompt cache
    (OpenAI: `cached_tokens` in the usage's details, of the prompt tokens;
    Anthropic: `cache_read_input_tokens`, beside `input_tokens`)."""

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str | None = None
    usage: tuple[int, int] | None = None
    cached: int = 0

    @property
    def finish(self) -> str:
        if self.finish_reason is not None:
            return self.finish_reason
        return "tool_calls" if self.tool_calls else "stop"

    @property
    def stop_reason(self) -> str:
        """Anthropic's name for `finish`."""
        names = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
        return names.get(self.finish, self.finish)

    def tokens(self, body: Json) -> tuple[int, int]:
        if self.usage is not None:
            return self.usage
        said = self.text + "".join(t.name + t.arguments_json for t in self.tool_calls)
        asked = {k: body.get(k) for k in ("system", "messages", "tools")}
        asked.update({k: body[k] for k in ("instructions", "input") if k in body})  # Responses
        return _estimate(json.dumps(asked)), _estimate(said)


def _estimate(text: str) -> int:
    return max(1, len(text) // 4)


@dataclass
class Call:
    """One request as the fake received it (refused ones too)."""

    body: Json | None  # the parsed JSON request body, None if it was not JSON (or a GET)
    headers: dict[str, str]  # keys lower-cased: headers["authorization"]
    behaviour: str  # Behaviour.name of what was answered, or "unauthorized" / "bad_request"
    path: str = "/v1/chat/completions"  # or /v1/messages, /v1/responses
    api: Api = "openai"
    method: str = "POST"
    raw: bytes = b""  # the request body's bytes as they came
    query: str = ""  # the query string as it came (`api-version=...`)

    @property
    def stream(self) -> bool:
        return bool(self.body and self.body.get("stream"))

    @property
    def tools(self) -> list[Json]:
        """The tools offered as sent: Chat Completions' {"type": "function",
        "function": {...}}, Anthropic's {"name", "input_schema"}, Responses'
        {"type": "function", "name", "parameters"}."""
        return list((self.body or {}).get("tools") or [])

    @property
    def tool_choice(self) -> Any:
        """The body's tool_choice as sent: "none" (OpenAI, Responses),
        {"type": "none"} (Anthropic), ...; None when absent."""
        return (self.body or {}).get("tool_choice")

    @property
    def forbids_tools(self) -> bool:
        """No tools offered, or tool_choice none (any API's spelling)."""
        choice = self.tool_choice
        none = choice == "none" or (isinstance(choice, dict) and choice.get("type") == "none")
        return none or not self.tools

    @property
    def messages(self) -> list[Json]:
        return list((self.body or {}).get("messages") or [])

    @property
    def input(self) -> list[Json]:
        """A Responses API body's `input` as a list of items (a string input is
        one user message: [{"role": "user", "content": <str>}]); [] when absent."""
        raw = (self.body or {}).get("input")
        if isinstance(raw, str):
            return [{"role": "user", "content": raw}]
        return [item for item in raw if isinstance(item, dict)] if isinstance(raw, list) else []

    @property
    def tool_results(self) -> list[tuple[str, Any]]:
        """(tool call id, content) of every tool result in the conversation:
        OpenAI's role "tool" messages, Anthropic's tool_result blocks, the
        Responses API's function_call_output items (call_id, output)."""
        found: list[tuple[str, Any]] = []
        for m in self.messages:
            if m.get("role") == "tool":
                found.append((m.get("tool_call_id", ""), m.get("content")))
            elif m.get("role") == "user" and isinstance(m.get("content"), list):
                for block in m["content"]:
                    if isinstance(block, dict) and block.get("type") == "tool_result":
                        found.append((block.get("tool_use_id", ""), block.get("content")))
        for item in self.input:
            if item.get("type") == "function_call_output":
                found.append((item.get("call_id", ""), item.get("output")))
        return found
