"""The real `openai` and `anthropic` SDKs talk to the fake LLM upstream:
agent loops with tool calls, whole and streamed, usage, errors as the SDKs'
own exceptions, and the recording of what they sent. OpenAI's Responses API
too, and the OpenAI Agents SDK on its default (Responses) model."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import anthropic
import openai
import pytest
from agents import (
    Agent,
    OpenAIResponsesModel,
    RunConfig,
    Runner,
    function_tool,
    set_tracing_disabled,
)

from tests.fakes.llm import (
    Call,
    FakeLLM,
    Reply,
    ToolCall,
    answer,
    no_choices,
    reasoning,
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
RESPONSES_TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
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


# --- OpenAI Responses -----------------------------------------------------------------


def summary(resp: Any) -> list[tuple[str, ...]]:
    """A Response's output as (type, text) and (type, call_id, name, arguments)."""
    out: list[tuple[str, ...]] = []
    for item in resp.output:
        if item.type == "message":
            out.append((item.type, "".join(c.text for c in item.content)))
        else:
            assert item.type == "function_call"
            out.append((item.type, item.call_id, item.name, item.arguments))
    return out


async def test_responses_whole_text_and_tool_calls(llm: FakeLLM, oai: openai.AsyncOpenAI) -> None:
    llm.then(
        answer("Paris is sunny."),
        tool_call("get_weather", {"city": "Paris"}, text="Let me look."),
        tool_call("get_weather", {"city": "Oslo"}, id="call_mine"),
    )
    r = await oai.responses.create(model="gpt-test", input="Weather?", instructions="Be brief.")
    assert r.output_text == "Paris is sunny."
    assert (r.object, r.status, r.model, r.instructions) == (
        "response",
        "completed",
        "gpt-test",
        "Be brief.",
    )
    assert r.id.startswith("resp_fake_") and r.created_at > 0 and r.error is None
    assert [o.type for o in r.output] == ["message"]
    message = r.output[0]
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_fake_") and message.status == "completed"
    assert r.usage is not None
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0
    assert r.usage.input_tokens_details.cached_tokens == 0
    assert r.usage.output_tokens_details.reasoning_tokens == 0

    r = await oai.responses.create(
        model="gpt-test", input="Weather in Paris?", tools=RESPONSES_TOOLS, temperature=0.5
    )
    assert [o.type for o in r.output] == ["message", "function_call"]
    assert r.output_text == "Let me look."
    fc = r.output[1]
    assert fc.type == "function_call" and fc.name == "get_weather"
    assert fc.call_id.startswith("call_fake_") and fc.id and fc.id.startswith("fc_fake_")
    assert json.loads(fc.arguments) == {"city": "Paris"} and fc.status == "completed"
    assert (r.temperature, r.tool_choice, r.parallel_tool_calls) == (0.5, "auto", True)
    assert [t.type == "function" and t.name for t in r.tools] == ["get_weather"]

    r = await oai.responses.create(model="gpt-test", input="Oslo?", tools=RESPONSES_TOOLS)
    assert summary(r) == [("function_call", "call_mine", "get_weather", '{"city":"Oslo"}')]
    assert r.output_text == ""

    assert llm.calls_to("responses") == llm.calls and llm.calls_to("openai") == []
    assert all(c.api == "responses" and c.path == "/v1/responses" for c in llm.calls)
    assert llm.calls[0].headers["authorization"] == "Bearer sk-test"
    assert llm.calls[0].input == [{"role": "user", "content": "Weather?"}]
    assert llm.calls[0].tools == [] and llm.calls[0].forbids_tools
    assert llm.calls[1].tools[0]["name"] == "get_weather" and not llm.calls[1].forbids_tools


RESPONSES_SCRIPTS = {
    "text": answer("The weather in Paris: 20 C, sunny."),
    "tool_call": tool_call(
        "get_weather", {"city": "Paris", "units": "metric"}, text="Let me look.", id="call_1"
    ),
    "tool_calls": tool_calls(
        ToolCall("get_weather", {"city": "Paris"}, id="call_a"),
        ToolCall("get_weather", {"city": "Oslo"}, id="call_b"),
    ),
}


@pytest.mark.parametrize("script", RESPONSES_SCRIPTS)
async def test_responses_streamed_says_what_the_whole_response_says(
    llm: FakeLLM, oai: openai.AsyncOpenAI, script: str
) -> None:
    """create(stream=True): the events in order, numbered, each delta on the
    item its output_item.added opened; response.completed carries the same
    output and usage as the whole answer (and responses.stream()'s final one)."""
    behaviour = RESPONSES_SCRIPTS[script]
    llm.then(behaviour, behaviour, behaviour)
    ask: Any = {"model": "gpt-test", "input": "Weather in Paris?", "tools": RESPONSES_TOOLS}
    whole = await oai.responses.create(**ask)
    stream = await oai.responses.create(**ask, stream=True)
    events = [event async for event in stream]

    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed" and kinds.count("response.completed") == 1
    assert [e.sequence_number for e in events] == list(range(len(events)))
    started = events[0].response
    assert started.status == "in_progress" and started.output == [] and started.usage is None
    final = events[-1].response
    assert final.id == started.id and final.status == "completed"
    assert summary(final) == summary(whole)
    assert len(summary(whole)) == (1 if script == "text" else 2)
    assert final.usage == whole.usage and final.usage is not None and final.usage.total_tokens > 1

    opened = {e.item.id: e.output_index for e in events if e.type == "response.output_item.added"}
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [i.id for i in done] == list(opened) == [i.id for i in final.output]
    text, arguments = "", dict[str, str]()
    for e in events:
        if e.type == "response.output_text.delta":
            assert opened[e.item_id] == e.output_index and e.content_index == 0
            text += e.delta
        elif e.type == "response.function_call_arguments.delta":
            assert opened[e.item_id] == e.output_index
            arguments[e.item_id] = arguments.get(e.item_id, "") + e.delta
        elif e.type == "response.function_call_arguments.done":
            assert arguments[e.item_id] == e.arguments
        elif e.type == "response.output_text.done":
            assert e.text == text
    assert text == whole.output_text
    calls = [o for o in final.output if o.type == "function_call"]
    assert [arguments[c.id or ""] for c in calls] == [c.arguments for c in calls]
    if script == "tool_call":  # '{"city":"Paris","units":"metric"}' in 7-character fragments
        assert kinds.count("response.function_call_arguments.delta") == 5
        assert kinds.count("response.content_part.added") == 1

    async with oai.responses.stream(**ask) as helper:
        streamed = "".join(
            [e.delta async for e in helper if e.type == "response.output_text.delta"]
        )
        final_response = await helper.get_final_response()
    assert streamed == whole.output_text
    assert summary(final_response) == summary(whole) and final_response.usage == whole.usage
    assert [c.stream for c in llm.calls] == [False, True, True]


async def test_responses_function_calling_loop_until_tools_are_forbidden(
    llm: FakeLLM, oai: openai.AsyncOpenAI
) -> None:
    """The loop of OpenAI's function-calling guide (input_list += response.output,
    then a function_call_output per call) against repeat_tool_call: the fake
    reads each turn's tool results from the input items; tool_choice "none"
    gets a text answer."""
    llm.default = repeat_tool_call("get_weather", {"city": "Paris"})
    input_list: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
    call_ids = []
    for _ in range(3):
        response = await oai.responses.create(
            model="gpt-test", tools=RESPONSES_TOOLS, input=input_list
        )
        input_list += response.output
        calls = [item for item in response.output if item.type == "function_call"]
        assert len(calls) == 1 and response.output_text == ""
        for item in calls:
            call_ids.append(item.call_id)
            result = run_tool(item.name, json.loads(item.arguments))
            input_list.append(
                {"type": "function_call_output", "call_id": item.call_id, "output": result}
            )
    assert len(set(call_ids)) == 3 and all(i.startswith("call_fake_") for i in call_ids)
    assert llm.last.tool_results == [(call_ids[0], "20 C, sunny"), (call_ids[1], "20 C, sunny")]
    assert [len(c.input) for c in llm.calls] == [1, 3, 5]
    assert llm.calls[1].input[1]["type"] == "function_call"
    assert llm.calls[1].input[1]["call_id"] == call_ids[0]

    response = await oai.responses.create(
        model="gpt-test", tools=RESPONSES_TOOLS, input=input_list, tool_choice="none"
    )
    assert [o.type for o in response.output] == ["message"]
    assert response.output_text == "I will stop calling tools now."
    assert response.tool_choice == "none"
    assert llm.last.tool_choice == "none" and llm.last.forbids_tools
    assert [i for i, _ in llm.last.tool_results] == call_ids
    assert (await oai.responses.create(model="m", input="x")).output_text.startswith("I will")

    llm.default = repeat_tool_call("get_weather", {"city": "Paris"}, obey=False)
    stream = await oai.responses.create(
        model="m", tools=RESPONSES_TOOLS, input="x", tool_choice="none", stream=True
    )
    final = [e async for e in stream][-1]
    assert final.type == "response.completed"
    assert [o.type for o in final.response.output] == ["function_call"]  # a stubborn upstream


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
async def test_responses_agents_sdk_default_model(
    llm: FakeLLM, oai: openai.AsyncOpenAI, streamed: bool
) -> None:
    """The OpenAI Agents SDK's default model, OpenAIResponsesModel: a tool
    call, the tool run, then the answer ends the run."""
    set_tracing_disabled(True)
    ran: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        ran.append(city)
        return WEATHER[city]

    agent = Agent(
        name="weather",
        instructions="Answer about the weather.",
        tools=[get_weather],
        model=OpenAIResponsesModel(model="gpt-test", openai_client=oai),
    )
    llm.then(tool_call("get_weather", {"city": "Paris"}), answer("Paris: 20 C, sunny."))
    config = RunConfig(tracing_disabled=True)
    if streamed:
        run = Runner.run_streamed(agent, "Weather in Paris?", run_config=config)
        kinds = [event.type async for event in run.stream_events()]
        assert "raw_response_event" in kinds
        result: Any = run
    else:
        result = await Runner.run(agent, "Weather in Paris?", run_config=config)
    assert result.final_output == "Paris: 20 C, sunny."
    assert ran == ["Paris"]
    assert llm.count == 2 and llm.calls_to("responses") == llm.calls
    assert all(c.stream is streamed for c in llm.calls)
    first, second = llm.calls
    assert first.body is not None and first.body["instructions"] == "Answer about the weather."
    assert first.body["model"] == "gpt-test" and first.tools[0]["name"] == "get_weather"
    assert first.input == [{"role": "user", "content": "Weather in Paris?"}]
    assert first.tool_results == []
    (call_id, output), = second.tool_results  # fmt: skip
    assert call_id.startswith("call_fake_") and output == "20 C, sunny"
    usage = result.context_wrapper.usage
    assert usage.requests == 2 and usage.input_tokens > 0 and usage.output_tokens > 0


async def test_responses_errors_key_and_empty_answers(
    llm: FakeLLM, oai: openai.AsyncOpenAI
) -> None:
    llm.then(status(429, "slow down"), status(400, "bad tools"), no_choices())
    with pytest.raises(openai.RateLimitError) as rate:
        await oai.responses.create(model="m", input="hi")
    assert rate.value.body == {
        "message": "slow down",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }
    with pytest.raises(openai.BadRequestError, match="bad tools"):
        await oai.responses.create(model="m", input="hi", stream=True)
    empty = await oai.responses.create(model="m", input="hi")
    assert (empty.status, empty.output, empty.output_text) == ("completed", [], "")
    llm.require_key("sk-other")
    with pytest.raises(openai.AuthenticationError):
        await oai.responses.create(model="m", input="hi")
    assert [(c.api, c.behaviour) for c in llm.calls] == [
        ("responses", "status(429)"),
        ("responses", "status(400)"),
        ("responses", "no_choices()"),
        ("responses", "unauthorized"),
    ]


async def test_responses_cut_off_by_max_output_tokens(
    llm: FakeLLM, oai: openai.AsyncOpenAI
) -> None:
    """reasoning(): under max_output_tokens an incomplete response (streamed:
    ending in response.incomplete, as the API does); else the word."""
    llm.default = reasoning("REPLY")
    cut = await oai.responses.create(model="m", input="hi", max_output_tokens=50)
    assert cut.status == "incomplete" and cut.output_text == ""
    assert cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens"
    stream = await oai.responses.create(model="m", input="hi", max_output_tokens=50, stream=True)
    last = [e async for e in stream][-1]
    assert last.type == "response.incomplete" and last.response.status == "incomplete"
    full = await oai.responses.create(model="m", input="hi", max_output_tokens=1000)
    assert full.status == "completed" and full.incomplete_details is None
    assert full.output_text.startswith("<think>") and full.output_text.endswith("\nREPLY")


async def test_responses_sse_framing_on_the_wire(llm: FakeLLM) -> None:
    """Named events, each naming its data's type, numbered from 0, no [DONE]."""
    llm.then(answer("one two"))
    ask = {"model": "m", "input": "hi", "stream": True}
    async with (
        aiohttp.ClientSession() as session,
        session.post(llm.responses_url, json=ask) as resp,
    ):
        assert resp.content_type == "text/event-stream"
        raw = await resp.text()
    assert raw.endswith("\n\n") and "[DONE]" not in raw
    events = []
    for number, frame in enumerate(raw.strip().split("\n\n")):
        name_line, data_line = frame.split("\n")
        name, data = name_line.removeprefix("event: "), json.loads(data_line.removeprefix("data: "))
        assert data["type"] == name and data["sequence_number"] == number
        events.append((name, data.get("delta")))
    assert events == [
        ("response.created", None),
        ("response.in_progress", None),
        ("response.output_item.added", None),
        ("response.content_part.added", None),
        ("response.output_text.delta", "one "),
        ("response.output_text.delta", "two"),
        ("response.output_text.done", None),
        ("response.content_part.done", None),
        ("response.output_item.done", None),
        ("response.completed", None),
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
        async with session.post(f"{llm.base_url}/embeddings", json={}) as resp:
            assert resp.status == 404
            assert "Unknown request URL" in (await resp.json())["error"]["message"]
        headers = {"x-api-key": "k"}
        async with session.get(f"{llm.anthropic_base_url}/v1/files", headers=headers) as resp:
            assert resp.status == 404
            assert (await resp.json())["error"]["type"] == "not_found_error"
    assert [(c.method, c.path, c.api, c.behaviour) for c in llm.calls] == [
        ("POST", "/v1/embeddings", "openai", "not_found"),
        ("GET", "/v1/files", "anthropic", "not_found"),
    ]
