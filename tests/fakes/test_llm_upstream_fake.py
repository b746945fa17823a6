"""The real `openai` and `anthropic` SDKs talk to the fake LLM upstream:
agent loops with tool calls, whole and streamed, usage, errors as the SDKs'
own exceptions, and the recording of what they sent."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import anthropic
import openai
import pytest

from tests.fakes.llm import (
    Call,
    FakeLLM,
    Reply,
    ToolCall,
    answer,
    repeat_tool_call,
    respond,
    slow,
    status,
    tool_call,
    tool_calls,
)

WEATHER = {"Paris": "20 C, sunny", "Oslo": "5 C, rain"}

OPENAI_TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
ANTHROPIC_TOOLS: list[Any] = [
    {
        "name": "get_weather",
        "description": "The weather in a city",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
]


def run_tool(name: str, arguments: dict[str, Any]) -> str:
    assert name == "get_weather"
    return WEATHER[arguments["city"]]


def script_two_tool_calls_then_answer(llm: FakeLLM) -> None:
    llm.then(
        tool_call("get_weather", {"city": "Paris"}),
        tool_call("get_weather", {"city": "Oslo"}, text="Now Oslo."),
        answer("Paris: 20 C, sunny. Oslo: 5 C, rain."),
    )


@pytest.fixture
async def llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as fake:
        yield fake


@pytest.fixture
async def oai(llm: FakeLLM) -> AsyncIterator[openai.AsyncOpenAI]:
    client = openai.AsyncOpenAI(base_url=llm.base_url, api_key="sk-test", max_retries=0)
    yield client
    await client.close()


@pytest.fixture
async def claude(llm: FakeLLM) -> AsyncIterator[anthropic.AsyncAnthropic]:
    client = anthropic.AsyncAnthropic(
        base_url=llm.anthropic_base_url, api_key="sk-ant-test", max_retries=0
    )
    yield client
    await client.close()


# --- OpenAI ---------------------------------------------------------------------------


async def openai_agent(client: openai.AsyncOpenAI, question: str) -> tuple[str, list[Any]]:
    """The agent loop of OpenAI's function-calling guide: call; while the
    answer asks for tools, run them, append their results, call again."""
    messages: list[Any] = [{"role": "user", "content": question}]
    usages = []
    for _ in range(10):
        completion = await client.chat.completions.create(
            model="gpt-test", messages=messages, tools=OPENAI_TOOLS
        )
        usages.append(completion.usage)
        choice = completion.choices[0]
        if not choice.message.tool_calls:
            assert choice.finish_reason == "stop"
            return choice.message.content or "", usages
        assert choice.finish_reason == "tool_calls"
        messages.append(choice.message)
        for tc in choice.message.tool_calls:
            assert tc.type == "function"
            result = run_tool(tc.function.name, json.loads(tc.function.arguments))
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": result})
    raise AssertionError("the agent never finished")


async def openai_streaming_agent(
    client: openai.AsyncOpenAI, question: str
) -> tuple[str, list[Any]]:
    """The same loop streamed, each turn assembled from its deltas: text
    pieces, tool calls by index (id and name first, then argument fragments)."""
    messages: list[Any] = [{"role": "user", "content": question}]
    usages = []
    for _ in range(10):
        stream = await client.chat.completions.create(
            model="gpt-test",
            messages=messages,
            tools=OPENAI_TOOLS,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, calls, finish = "", dict[int, dict[str, str]](), None
        async for chunk in stream:
            if chunk.usage is not None:
                assert chunk.choices == []  # the usage chunk comes last, alone
                usages.append(chunk.usage)
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            text += delta.content or ""
            for tc in delta.tool_calls or []:
                acc = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                if tc.id:
                    acc["id"] = tc.id
                if tc.function and tc.function.name:
                    acc["name"] = tc.function.name
                if tc.function and tc.function.arguments:
                    acc["arguments"] += tc.function.arguments
            finish = chunk.choices[0].finish_reason or finish
        if not calls:
            assert finish == "stop"
            return text, usages
        assert finish == "tool_calls"
        messages.append(
            {
                "role": "assistant",
                "content": text or None,
                "tool_calls": [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {"name": c["name"], "arguments": c["arguments"]},
                    }
                    for c in calls.values()
                ],
            }
        )
        for c in calls.values():
            result = run_tool(c["name"], json.loads(c["arguments"]))
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": result})
    raise AssertionError("the agent never finished")


def assert_openai_recording(llm: FakeLLM, stream: bool) -> None:
    assert llm.count == 3
    assert [c.path for c in llm.calls] == ["/v1/chat/completions"] * 3
    assert all(c.api == "openai" and c.stream is stream for c in llm.calls)
    assert llm.calls[0].headers["authorization"] == "Bearer sk-test"
    assert llm.calls[0].body is not None and llm.calls[0].body["model"] == "gpt-test"
    assert [len(c.messages) for c in llm.calls] == [1, 3, 5]
    assert [c.tool_choice for c in llm.calls] == [None] * 3
    assert llm.calls[0].tools[0]["function"]["name"] == "get_weather"
    results = [content for _, content in llm.last.tool_results]
    assert results == ["20 C, sunny", "5 C, rain"]
    ids = [i for i, _ in llm.last.tool_results]
    assert all(i.startswith("call_fake_") for i in ids) and len(set(ids)) == 2
    assistant = llm.calls[2].messages[3]
    assert assistant["content"] == "Now Oslo."
    assert assistant["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": '{"city":"Oslo"}',
    }


async def test_openai_agent_loop(llm: FakeLLM, oai: openai.AsyncOpenAI) -> None:
    script_two_tool_calls_then_answer(llm)
    text, usages = await openai_agent(oai, "Weather in Paris and Oslo?")
    assert text == "Paris: 20 C, sunny. Oslo: 5 C, rain."
    assert all(u.total_tokens == u.prompt_tokens + u.completion_tokens > 1 for u in usages)
    assert usages[2].prompt_tokens > usages[0].prompt_tokens  # the conversation grew
    assert_openai_recording(llm, stream=False)


async def test_openai_streaming_agent_loop(llm: FakeLLM, oai: openai.AsyncOpenAI) -> None:
    script_two_tool_calls_then_answer(llm)
    text, usages = await openai_streaming_agent(oai, "Weather in Paris and Oslo?")
    assert text == "Paris: 20 C, sunny. Oslo: 5 C, rain."
    assert len(usages) == 3
    assert all(u.total_tokens == u.prompt_tokens + u.completion_tokens > 1 for u in usages)
    assert_openai_recording(llm, stream=True)
    assert llm.last.body is not None
    assert llm.last.body["stream_options"] == {"include_usage": True}


async def test_openai_stream_without_usage_and_parallel_calls(
    llm: FakeLLM, oai: openai.AsyncOpenAI
) -> None:
    llm.then(tool_calls(ToolCall("a", {"x": 1}, id="call_1"), ToolCall("b", "not json")))
    stream = await oai.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    chunks = [chunk async for chunk in stream]
    assert all(c.usage is None and len(c.choices) == 1 for c in chunks)
    parts = [tc for c in chunks for tc in c.choices[0].delta.tool_calls or []]
    firsts = [tc for tc in parts if tc.id]
    assert (firsts[0].index, firsts[0].id) == (0, "call_1")
    assert [tc.function.name for tc in firsts if tc.function] == ["a", "b"]
    args = ["".join(tc.function.arguments or "" for tc in parts if tc.index == i and tc.function)
            for i in (0, 1)]  # fmt: skip
    assert args == ['{"x":1}', "not json"]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


async def test_openai_errors_are_the_sdks_exceptions(llm: FakeLLM, oai: openai.AsyncOpenAI) -> None:
    llm.then(status(429, "slow down"), status(400, "bad tools"), status(500))
    ask: Any = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(openai.RateLimitError) as rate:
        await oai.chat.completions.create(**ask)
    assert rate.value.status_code == 429
    assert rate.value.body == {
        "message": "slow down",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }
    with pytest.raises(openai.BadRequestError, match="bad tools"):
        await oai.chat.completions.create(**ask, stream=True)
    with pytest.raises(openai.InternalServerError):
        await oai.chat.completions.create(**ask)
    assert [c.behaviour for c in llm.calls] == ["status(429)", "status(400)", "status(500)"]


async def test_openai_key_and_models(llm: FakeLLM, oai: openai.AsyncOpenAI) -> None:
    llm.models = ["gpt-a", "gpt-b"]
    page = await oai.models.list()
    assert [m.id for m in page.data] == ["gpt-a", "gpt-b"]
    llm.require_key("sk-other")
    with pytest.raises(openai.AuthenticationError):
        await oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert [(c.method, c.path, c.behaviour) for c in llm.calls] == [
        ("GET", "/v1/models", "models"),
        ("POST", "/v1/chat/completions", "unauthorized"),
    ]


# --- Anthropic ------------------------------------------------------------------------


async def anthropic_agent(client: anthropic.AsyncAnthropic, question: str) -> tuple[str, list[Any]]:
    """The agent loop of Anthropic's tool-use guide: while stop_reason is
    tool_use, run each tool_use block and send the tool_results back."""
    messages: list[Any] = [{"role": "user", "content": question}]
    usages = []
    for _ in range(10):
        message = await client.messages.create(
            model="claude-test", max_tokens=1024, messages=messages, tools=ANTHROPIC_TOOLS
        )
        usages.append(message.usage)
        if message.stop_reason != "tool_use":
            assert message.stop_reason == "end_turn"
            return "".join(b.text for b in message.content if b.type == "text"), usages
        messages.append({"role": "assistant", "content": message.content})
        results = [
            {"type": "tool_result", "tool_use_id": b.id, "content": run_tool(b.name, b.input)}
            for b in message.content
            if b.type == "tool_use"
        ]
        messages.append({"role": "user", "content": results})
    raise AssertionError("the agent never finished")


async def anthropic_streaming_agent(
    client: anthropic.AsyncAnthropic, question: str
) -> tuple[str, list[Any]]:
    """The same loop on messages.stream(): text printed as it comes, the
    final message (tool_use inputs joined from input_json_delta) from the SDK."""
    messages: list[Any] = [{"role": "user", "content": question}]
    usages = []
    for _ in range(10):
        async with client.messages.stream(
            model="claude-test", max_tokens=1024, messages=messages, tools=ANTHROPIC_TOOLS
        ) as stream:
            streamed = "".join([text async for text in stream.text_stream])
            message = await stream.get_final_message()
        usages.append(message.usage)
        text = "".join(b.text for b in message.content if b.type == "text")
        assert streamed == text
        if message.stop_reason != "tool_use":
            assert message.stop_reason == "end_turn"
            return text, usages
        messages.append({"role": "assistant", "content": message.content})
        results = [
            {"type": "tool_result", "tool_use_id": b.id, "content": run_tool(b.name, b.input)}
            for b in message.content
            if b.type == "tool_use"
        ]
        messages.append({"role": "user", "content": results})
    raise AssertionError("the agent never finished")


def assert_anthropic_recording(llm: FakeLLM, stream: bool) -> None:
    assert llm.count == 3
    assert [c.path for c in llm.calls] == ["/v1/messages"] * 3
    assert all(c.api == "anthropic" and c.stream is stream for c in llm.calls)
    assert llm.calls_to("anthropic") == llm.calls and llm.calls_to("openai") == []
    headers = llm.calls[0].headers
    assert headers["anthropic-version"]
    # the key: x-api-key in the older SDKs, Authorization: Bearer in anthropic 2.x
    key = headers.get("x-api-key") or headers["authorization"].removeprefix("Bearer ")
    assert key == "sk-ant-test"
    assert [len(c.messages) for c in llm.calls] == [1, 3, 5]
    assert llm.calls[0].tools[0]["name"] == "get_weather"
    results = [content for _, content in llm.last.tool_results]
    assert results == ["20 C, sunny", "5 C, rain"]
    assert all(i.startswith("toolu_fake_") for i, _ in llm.last.tool_results)
    assistant = llm.calls[2].messages[3]["content"]
    assert [b["type"] for b in assistant] == ["text", "tool_use"]
    assert assistant[1]["input"] == {"city": "Oslo"}


async def test_anthropic_agent_loop(llm: FakeLLM, claude: anthropic.AsyncAnthropic) -> None:
    script_two_tool_calls_then_answer(llm)
    text, usages = await anthropic_agent(claude, "Weather in Paris and Oslo?")
    assert text == "Paris: 20 C, sunny. Oslo: 5 C, rain."
    assert all(u.input_tokens > 0 and u.output_tokens > 0 for u in usages)
    assert_anthropic_recording(llm, stream=False)


async def test_anthropic_streaming_agent_loop(
    llm: FakeLLM, claude: anthropic.AsyncAnthropic
) -> None:
    script_two_tool_calls_then_answer(llm)
    text, usages = await anthropic_streaming_agent(claude, "Weather in Paris and Oslo?")
    assert text == "Paris: 20 C, sunny. Oslo: 5 C, rain."
    assert all(u.input_tokens > 0 and u.output_tokens > 0 for u in usages)
    assert_anthropic_recording(llm, stream=True)


async def test_anthropic_raw_stream_events(llm: FakeLLM, claude: anthropic.AsyncAnthropic) -> None:
    """create(stream=True): the events in order, a tool_use input joined by hand."""
    llm.then(tool_call("get_weather", {"city": "Paris", "units": "metric"}, text="Let me look."))
    stream = await claude.messages.create(
        model="claude-test",
        max_tokens=100,
        messages=[{"role": "user", "content": "Paris?"}],
        tools=ANTHROPIC_TOOLS,
        stream=True,
    )
    kinds, text, partial, tool = [], "", "", None
    async for event in stream:
        kinds.append(event.type)
        if event.type == "content_block_start" and event.content_block.type == "tool_use":
            tool = event.content_block
        elif event.type == "content_block_delta":
            if event.delta.type == "text_delta":
                text += event.delta.text
            elif event.delta.type == "input_json_delta":
                partial += event.delta.partial_json
        elif event.type == "message_delta":
            assert event.delta.stop_reason == "tool_use"
            assert event.usage.output_tokens > 0
    assert kinds[0] == "message_start" and "ping" not in kinds  # the SDK drops pings
    assert kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 2
    assert text == "Let me look."
    assert tool is not None and tool.name == "get_weather" and tool.id.startswith("toolu_")
    assert json.loads(partial) == {"city": "Paris", "units": "metric"}


async def test_anthropic_errors_are_the_sdks_exceptions(
    llm: FakeLLM, claude: anthropic.AsyncAnthropic
) -> None:
    llm.then(status(429, "slow down"), status(529, "busy"), status(400, "bad"))
    ask: Any = {"model": "c", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(anthropic.RateLimitError) as rate:
        await claude.messages.create(**ask)
    assert rate.value.status_code == 429
    assert rate.value.body == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "slow down"},
    }
    with pytest.raises(anthropic.APIStatusError) as busy:
        async with claude.messages.stream(**ask) as stream:
            await stream.get_final_message()
    assert busy.value.status_code == 529
    with pytest.raises(anthropic.BadRequestError, match="bad"):
        await claude.messages.create(**ask, stream=True)
    assert [c.behaviour for c in llm.calls] == ["status(429)", "status(529)", "status(400)"]


async def test_anthropic_key_version_and_models(
    llm: FakeLLM, claude: anthropic.AsyncAnthropic
) -> None:
    llm.models = ["claude-a"]
    page = await claude.models.list()
    assert [m.id for m in page.data] == ["claude-a"]
    llm.require_key("sk-ant-other")
    ask: Any = {"model": "c", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}]}
    with pytest.raises(anthropic.AuthenticationError):
        await claude.messages.create(**ask)
    llm.require_key(None)
    with pytest.raises(anthropic.BadRequestError, match="anthropic-version"):
        await claude.messages.create(**ask, extra_headers={"anthropic-version": anthropic.Omit()})
    assert [(c.path, c.api, c.behaviour) for c in llm.calls] == [
        ("/v1/models", "anthropic", "models"),
        ("/v1/messages", "anthropic", "unauthorized"),
        ("/v1/messages", "anthropic", "bad_request"),
    ]


# --- Both -----------------------------------------------------------------------------


async def test_the_looping_upstream_until_tools_are_forbidden(
    llm: FakeLLM, oai: openai.AsyncOpenAI, claude: anthropic.AsyncAnthropic
) -> None:
    """repeat_tool_call asks for the same call every time, until a request
    says tool_choice none (or offers no tools): then it answers in text."""
    llm.default = repeat_tool_call("get_weather", {"city": "Paris"})
    user: Any = [{"role": "user", "content": "Paris?"}]
    asked = []
    for _ in range(3):
        c = await oai.chat.completions.create(model="m", messages=user, tools=OPENAI_TOOLS)
        assert c.choices[0].message.tool_calls
        tc = c.choices[0].message.tool_calls[0]
        assert tc.type == "function"
        asked.append((tc.id, tc.function.name, tc.function.arguments))
        m = await claude.messages.create(
            model="c", max_tokens=10, messages=user, tools=ANTHROPIC_TOOLS
        )
        assert m.stop_reason == "tool_use" and m.content[0].type == "tool_use"
        assert m.content[0].input == {"city": "Paris"}
    assert {(name, arguments) for _, name, arguments in asked} == {
        ("get_weather", '{"city":"Paris"}')
    }
    assert len({i for i, _, _ in asked}) == 3  # a fresh id each time, as upstreams give

    c = await oai.chat.completions.create(
        model="m", messages=user, tools=OPENAI_TOOLS, tool_choice="none"
    )
    assert c.choices[0].finish_reason == "stop" and c.choices[0].message.tool_calls is None
    assert llm.last.tool_choice == "none" and llm.last.forbids_tools
    m = await claude.messages.create(
        model="c", max_tokens=10, messages=user, tools=ANTHROPIC_TOOLS, tool_choice={"type": "none"}
    )
    assert m.stop_reason == "end_turn" and m.content[0].type == "text"
    assert llm.last.tool_choice == {"type": "none"}
    m = await claude.messages.create(model="c", max_tokens=10, messages=user)  # no tools
    assert m.stop_reason == "end_turn" and llm.last.tools == []

    llm.default = repeat_tool_call("get_weather", {"city": "Paris"}, obey=False)
    c = await oai.chat.completions.create(model="m", messages=user, tool_choice="none")
    assert c.choices[0].finish_reason == "tool_calls"  # a stubborn upstream


async def test_respond_answers_from_the_request(
    llm: FakeLLM, oai: openai.AsyncOpenAI, claude: anthropic.AsyncAnthropic
) -> None:
    async def echo(call: Call) -> Reply | str:
        said = call.messages[-1]["content"]
        if said == "weather":
            return Reply(tool_calls=(ToolCall("get_weather", {"city": "Oslo"}),))
        return f"{call.api} heard {said}"

    llm.default = respond(echo)
    c = await oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert c.choices[0].message.content == "openai heard hi"
    m = await claude.messages.create(
        model="c", max_tokens=10, messages=[{"role": "user", "content": "weather"}]
    )
    assert m.stop_reason == "tool_use"
    llm.then(respond(lambda call: status(418, "teapot")))
    with pytest.raises(openai.APIStatusError) as teapot:
        await oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert teapot.value.status_code == 418
    assert [c.behaviour for c in llm.calls] == ["respond(echo)"] * 2 + ["respond(<lambda>)"]


async def test_slow_delays_either_api(
    llm: FakeLLM, oai: openai.AsyncOpenAI, claude: anthropic.AsyncAnthropic
) -> None:
    llm.default = slow(0.02, answer("late"))
    start = time.monotonic()
    c = await oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    m = await claude.messages.create(
        model="c", max_tokens=10, messages=[{"role": "user", "content": "x"}]
    )
    assert time.monotonic() - start >= 0.04
    assert c.choices[0].message.content == "late"
    assert m.content[0].type == "text" and m.content[0].text == "late"


async def test_sse_framing_on_the_wire(llm: FakeLLM) -> None:
    """What the SDKs hide: OpenAI's bare data lines ending in [DONE];
    Anthropic's named events (each naming its data's type), a ping among them."""
    llm.then(answer("one two"), tool_call("t", {"k": "v"}))
    ask = {"model": "m", "max_tokens": 5, "stream": True, "messages": []}
    async with aiohttp.ClientSession() as session:
        async with session.post(llm.url, json=ask) as resp:
            assert resp.content_type == "text/event-stream"
            raw = await resp.text()
        frames = raw.split("\n\n")
        assert frames[-2:] == ["data: [DONE]", ""]
        assert all(f.startswith("data: {") for f in frames[:-2])
        contents = [json.loads(f[6:])["choices"][0]["delta"].get("content") for f in frames[:-2]]
        assert contents == ["", "one ", "two", None]

        headers = {"anthropic-version": "2023-06-01"}
        async with session.post(llm.anthropic_url, json=ask, headers=headers) as resp:
            assert resp.content_type == "text/event-stream"
            raw = await resp.text()
    events = []
    for frame in raw.strip().split("\n\n"):
        name_line, data_line = frame.split("\n")
        name, data = name_line.removeprefix("event: "), json.loads(data_line.removeprefix("data: "))
        assert data["type"] == name
        events.append(name)
    assert events == [
        "message_start",
        "ping",
        "content_block_start",
        *["content_block_delta"] * 2,  # '{"k":"v"}' in 7-character fragments
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]


async def test_unknown_paths_are_recorded_and_refused(llm: FakeLLM) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{llm.base_url}/responses", json={}) as resp:
            assert resp.status == 404
            assert "Unknown request URL" in (await resp.json())["error"]["message"]
        headers = {"x-api-key": "k"}
        async with session.get(f"{llm.anthropic_base_url}/v1/files", headers=headers) as resp:
            assert resp.status == 404
            assert (await resp.json())["error"]["type"] == "not_found_error"
    assert [(c.method, c.path, c.api, c.behaviour) for c in llm.calls] == [
        ("POST", "/v1/responses", "openai", "not_found"),
        ("GET", "/v1/files", "anthropic", "not_found"),
    ]
