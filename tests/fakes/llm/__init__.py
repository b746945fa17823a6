"""A scriptable fake LLM upstream for tests: OpenAI Chat Completions,
Anthropic Messages and OpenAI Responses, whole and streamed, that the real
`openai` and `anthropic` SDKs, the OpenAI Agents SDK (and any plain HTTP
client) talk to.

    async with FakeLLM() as llm:
        llm.then(answer("SKIP"), status(500), hang())   # one behaviour per model call
        llm.default = answer("REPLY")                    # once the queue is empty
        ... openai.AsyncOpenAI(base_url=llm.base_url, api_key=...)   # POST /v1/chat/completions
        ...     .responses.create(...)                               # POST /v1/responses
        ... anthropic.AsyncAnthropic(base_url=llm.anthropic_base_url, api_key=...)  # /v1/messages
        assert llm.count == 4 and llm.calls[0].body["model"] == "..."

The three APIs share the one queue; every behaviour answers in the shape of
the API the request came in on (`call.api`: "openai", "anthropic",
"responses"), and as an SSE stream when the body says `stream: true`
(OpenAI: `data: {chunk}` lines and `data: [DONE]`, a usage chunk with
stream_options.include_usage; Anthropic: message_start ... message_stop;
Responses: response.created ... response.completed, named events with a
sequence_number, no [DONE]). A Responses reply is a response whose output
is a message (output_text) and/or function_call items (call_id
`call_fake_N` or the ToolCall's id); Call.input and Call.tool_results read
its `input` items (function_call_output). Tests that script two upstreams
independently start two FakeLLMs.

Behaviours: answer(text), tool_call(name, arguments), tool_calls(ToolCall...),
repeat_tool_call(name, arguments) (the looping agent's upstream: heeds
tool_choice none, in any API, unless obey=False), say(Reply), respond(fn)
(fn(call) returns a Reply, a text or a Behaviour), status(code, message),
slow(seconds, then), hang(), close(), malformed(), no_choices() (Responses:
an empty output), reasoning(word) (Responses: cut off by max_output_tokens
as status "incomplete").

Every request is recorded in `llm.calls` (path, method, api, headers, body,
behaviour), refused ones too: a model call without the key set by
`require_key` gets 401, one whose body is not a JSON object (or, Anthropic,
one without the anthropic-version header) 400; neither consumes a queued
behaviour. GET /v1/models answers `llm.models` in the asking API's shape
(Anthropic when it sends anthropic-version or x-api-key); any other path is
recorded and answered 404.

Mind the SDKs' retries (2 by default, on 408/409/429/5xx and dropped
connections): each one takes a behaviour; pass max_retries=0 to see one.
"""

from tests.fakes.llm.behaviours import (
    Behaviour,
    Exchange,
    answer,
    close,
    hang,
    malformed,
    no_choices,
    reasoning,
    repeat_tool_call,
    respond,
    say,
    slow,
    status,
    tool_call,
    tool_calls,
)
from tests.fakes.llm.model import Api, Call, Json, Reply, ToolCall
from tests.fakes.llm.server import FakeLLM

__all__ = [
    "Api",
    "Behaviour",
    "Call",
    "Exchange",
    "FakeLLM",
    "Json",
    "Reply",
    "ToolCall",
    "answer",
    "close",
    "hang",
    "malformed",
    "no_choices",
    "reasoning",
    "repeat_tool_call",
    "respond",
    "say",
    "slow",
    "status",
    "tool_call",
    "tool_calls",
]
