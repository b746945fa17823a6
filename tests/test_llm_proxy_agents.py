"""The LLM API proxy under the OpenAI Agents SDK (`openai-agents`, import name
`agents`), the loop users actually run: `Runner.run` / `Runner.run_streamed`
over `OpenAIChatCompletionsModel`, and the looping agent also over the SDK's
default `OpenAIResponsesModel` (the Responses API), pointed at the daemon in
front of a fake upstream (tests/fakes/llm).

Why this SDK: it is OpenAI's own agent framework and a thin layer over the
`openai` client, so the requests it sends are the ones the proxy was
written for, and a failure
points at the proxy rather than at an adapter in between. Its Runner is the
loop agents are built on: a looping model must end in a final answer there,
with no change to the agent, and a legitimate long run must go through
byte for byte untouched.

Tracing is disabled (it would export to api.openai.com): nothing here leaves
127.0.0.1.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from agents import (
    Agent,
    FunctionTool,
    Model,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    RunConfig,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from aiohttp import web

from gateway.daemon import Daemon
from tests.fakes.llm import Behaviour, Exchange, FakeLLM, repeat_tool_call
from tests.llm_proxy import proxy_daemon

set_tracing_disabled(True)
NO_TRACING = RunConfig(tracing_disabled=True)
MAX_TURNS = 30
FINAL = "Brest is grey, 11 C; I will not look again."


def model_for(base_url: str, api: str = "chat", **client: Any) -> Model:
    """The SDK's model on the Chat Completions API, or (`api="responses"`) on
    the Responses API, the SDK's default."""
    oa = openai.AsyncOpenAI(base_url=base_url, api_key="sk-test", max_retries=0, **client)
    if api == "responses":
        return OpenAIResponsesModel(model="gpt-test", openai_client=oa)
    return OpenAIChatCompletionsModel(model="gpt-test", openai_client=oa)


def samples(daemon: Daemon, metric: str) -> dict[tuple[str, ...], float]:
    """A prometheus Counter's `_total` samples with a non-zero value, by label values."""
    counter = getattr(daemon.metrics, metric)
    out: dict[tuple[str, ...], float] = {}
    for family in counter.collect():
        for s in family.samples:
            if s.name.endswith("_total") and s.value:
                out[tuple(s.labels.values())] = s.value
    return out


# -- 1. a looping agent ends with an answer ------------------------------------


@pytest.mark.parametrize("api", ["chat", "responses"])
@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
async def test_agents_sdk_looping_agent_ends_with_an_answer(
    redis_url: str, key_prefix: str, streamed: bool, api: str
) -> None:
    """The model asks for get_weather("Brest") on every turn until it is told
    tools are off. Through the proxy the Runner's loop ends on its own with
    the model's answer, well before max_turns, the agent unchanged.

    What breaks it: the proxy not feeding the history's tool calls/results to
    the guard, not disabling tools on the block (the run then hits
    MaxTurnsExceeded), disabling them too early or on a warn (tool_choice
    "none" before the last call; fewer tool runs), feeding an event twice
    (the block comes a turn early), or breaking the SSE stream the SDK parses
    (run_streamed)."""
    ran: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        ran.append(city)
        return json.dumps({"city": city, "sky": "grey", "celsius": 11})

    async with FakeLLM() as llm:
        llm.default = repeat_tool_call("get_weather", {"city": "Brest"}, obey=True, otherwise=FINAL)
        async with proxy_daemon(llm, redis_url, key_prefix) as (daemon, url):
            agent = Agent(
                name="weather",
                instructions="Answer questions about the weather.",
                tools=[get_weather],
                model=model_for(f"{url}/llm/openai/v1", api),
            )
            question = "Weather in Brest?"
            if streamed:
                result: Any = Runner.run_streamed(
                    agent, question, max_turns=MAX_TURNS, run_config=NO_TRACING
                )
                events = [e async for e in result.stream_events()]
                assert events, "the streamed run produced no events"
            else:
                result = await Runner.run(
                    agent, question, max_turns=MAX_TURNS, run_config=NO_TRACING
                )
            actions = samples(daemon, "llm_requests")

    assert result.final_output == FINAL
    # The proxy judges a tool call when the agent sends back the history that
    # holds it, i.e. after the call has run. With results reported,
    # identical_call takes the 1st result as the baseline: calls 1-2 are
    # allowed, the 3rd warns (a note, tools still on, so the fake asks again),
    # the 4th blocks. That block is seen on the 5th request, which goes out
    # with tool_choice "none" and gets the answer: 4 tool runs, 5 model calls.
    assert ran == ["Brest"] * 4
    route = "/v1/responses" if api == "responses" else "/v1/chat/completions"
    assert [c.path for c in llm.calls] == [route] * 5
    assert llm.count == 5 == len(result.raw_responses)
    assert len(result.raw_responses) < MAX_TURNS
    assert llm.calls[-1].tool_choice == "none"
    assert all(c.tool_choice is None for c in llm.calls[:-1])
    # requests 1-3 forwarded, the 4th carried the warning, the 5th the block
    assert actions == {
        ("openai", "forwarded"): 3,
        ("openai", "noted"): 1,
        ("openai", "tools_disabled"): 1,
    }


# -- 2. a legitimate multi-tool agent is left alone ----------------------------

CUSTOMER = "c-42"
LAST_PAGE = 5
ANSWER = "Customer c-42: 5 pages of orders, o-17 shipped, 120 loyalty points."

# The scripted model's plan: one tool call per turn, 10 distinct tools, with
# list_orders paged through 1..5 as its next_page says; then the answer.
PLAN: list[tuple[str, dict[str, Any]]] = [
    ("get_customer", {"customer_id": CUSTOMER}),
    *[("list_orders", {"page": p}) for p in range(1, LAST_PAGE + 1)],
    ("get_order", {"order_id": "o-17"}),
    ("track_shipment", {"order_id": "o-17"}),
    ("get_invoice", {"order_id": "o-17"}),
    ("check_stock", {"sku": "sku-9"}),
    ("list_returns", {"customer_id": CUSTOMER}),
    ("get_loyalty_points", {"customer_id": CUSTOMER}),
    ("get_address", {"customer_id": CUSTOMER}),
    ("list_payment_methods", {"customer_id": CUSTOMER}),
]
CREATED = 1_700_000_000


def _turn_bytes(turn: int) -> bytes:
    """The scripted model's whole answer at `turn` (0-based), rendered once:
    fixed id, created and usage, a fixed tool call id; after the plan, text."""
    if turn < len(PLAN):
        name, args = PLAN[turn]
        message: dict[str, Any] = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": f"call_scripted_{turn:02d}",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args)},
                }
            ],
        }
        finish = "tool_calls"
    else:
        message, finish = {"role": "assistant", "content": ANSWER}, "stop"
    completion = {
        "id": f"chatcmpl-scripted-{turn:02d}",
        "object": "chat.completion",
        "created": CREATED,
        "model": "gpt-test",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 100 + turn, "completion_tokens": 12, "total_tokens": 112 + turn},
    }
    return json.dumps(completion).encode()


TURNS = [_turn_bytes(t) for t in range(len(PLAN) + 1)]


def scripted_model() -> Behaviour:
    """Answers the turn the history is at, counted by its tool results."""

    async def run(ex: Exchange) -> web.StreamResponse:
        assert not ex.call.stream
        turn = len(ex.call.tool_results)
        return web.Response(body=TURNS[turn], content_type="application/json")

    return Behaviour("scripted_model()", run)


def support_tools(ran: list[tuple[str, dict[str, Any]]]) -> list[FunctionTool]:
    """Ten distinct tools recording their calls in `ran`; deterministic results."""

    def done(name: str, out: dict[str, Any], **args: Any) -> str:
        ran.append((name, args))
        return json.dumps(out, sort_keys=True)

    @function_tool
    def get_customer(customer_id: str) -> str:
        """A customer's profile."""
        return done("get_customer", {"id": customer_id, "name": "Ada"}, customer_id=customer_id)

    @function_tool
    def list_orders(page: int) -> str:
        """One page of the customer's orders; next_page is null on the last one."""
        orders = [f"o-{page}{i}" for i in range(3)]
        next_page = page + 1 if page < LAST_PAGE else None
        return done(
            "list_orders", {"page": page, "orders": orders, "next_page": next_page}, page=page
        )

    @function_tool
    def get_order(order_id: str) -> str:
        """One order."""
        return done("get_order", {"id": order_id, "total": 42.5}, order_id=order_id)

    @function_tool
    def track_shipment(order_id: str) -> str:
        """Where an order's parcel is."""
        return done("track_shipment", {"id": order_id, "status": "shipped"}, order_id=order_id)

    @function_tool
    def get_invoice(order_id: str) -> str:
        """An order's invoice."""
        return done("get_invoice", {"invoice": "inv-17", "paid": True}, order_id=order_id)

    @function_tool
    def check_stock(sku: str) -> str:
        """Units in stock."""
        return done("check_stock", {"sku": sku, "units": 7}, sku=sku)

    @function_tool
    def list_returns(customer_id: str) -> str:
        """A customer's returns."""
        return done("list_returns", {"returns": []}, customer_id=customer_id)

    @function_tool
    def get_loyalty_points(customer_id: str) -> str:
        """A customer's loyalty points."""
        return done("get_loyalty_points", {"points": 120}, customer_id=customer_id)

    @function_tool
    def get_address(customer_id: str) -> str:
        """A customer's delivery address."""
        return done("get_address", {"city": "Brest"}, customer_id=customer_id)

    @function_tool
    def list_payment_methods(customer_id: str) -> str:
        """A customer's payment methods."""
        return done("list_payment_methods", {"methods": ["card"]}, customer_id=customer_id)

    return [
        get_customer,
        list_orders,
        get_order,
        track_shipment,
        get_invoice,
        check_stock,
        list_returns,
        get_loyalty_points,
        get_address,
        list_payment_methods,
    ]


Run = tuple[Any, list[tuple[str, dict[str, Any]]], list[bytes]]


async def support_run(base_url: str) -> Run:
    """The support agent's run at `base_url`: its result, the tool calls that
    ran, and the response bodies the openai client received, in order."""
    received: list[bytes] = []

    async def keep(response: Any) -> None:
        received.append(await response.aread())

    ran: list[tuple[str, dict[str, Any]]] = []
    http = openai.DefaultAsyncHttpxClient(event_hooks={"response": [keep]})
    async with http:
        agent = Agent(
            name="support",
            instructions="Look the customer up with the tools, then summarise.",
            tools=support_tools(ran),
            model=model_for(base_url, http_client=http),
        )
        result = await Runner.run(
            agent, f"Summarise customer {CUSTOMER}.", max_turns=MAX_TURNS, run_config=NO_TRACING
        )
    return result, ran, received


async def test_agents_sdk_legitimate_multi_tool_run_is_untouched(
    redis_url: str, key_prefix: str
) -> None:
    """Ten distinct tools, one paged through five times: 14 tool calls in 15
    model turns, each one new. The same agent runs straight against the fake
    and through the proxy; the proxy must be invisible to it.

    What breaks it: any guard false positive on this run (a warn note or
    tools disabled changes the forwarded body: a tool_cycle, input_fixation,
    low_exploration or identical_call misfire on the pages, or events fed
    twice), the proxy changing what the request says (a field added, dropped or
    changed, e.g. stream_options or tool_choice), or altering the answer's
    bytes on the way back (re-encoding it, a changed byte)."""
    async with FakeLLM() as direct_llm:
        direct_llm.default = scripted_model()
        direct, direct_ran, direct_bytes = await support_run(direct_llm.base_url)
    async with FakeLLM() as llm:
        llm.default = scripted_model()
        async with proxy_daemon(llm, redis_url, key_prefix) as (daemon, url):
            proxied, proxied_ran, proxied_bytes = await support_run(f"{url}/llm/openai/v1")
            checks = samples(daemon, "guard_checks")
            actions = samples(daemon, "llm_requests")

    # the run itself: every tool of the plan ran once, in order, the pages 1..5
    assert direct.final_output == proxied.final_output == ANSWER
    assert direct_ran == proxied_ran == PLAN
    pages = [args["page"] for name, args in proxied_ran if name == "list_orders"]
    assert pages == [1, 2, 3, 4, 5]
    assert len({name for name, _ in proxied_ran}) == 10
    turns = len(PLAN) + 1
    assert len(proxied.raw_responses) == turns == 15 < MAX_TURNS

    # the proxy added nothing: the fake got the same bodies, turn for turn
    assert direct_llm.count == llm.count == turns
    assert [c.body for c in llm.calls] == [c.body for c in direct_llm.calls]
    assert all(c.tool_choice is None for c in llm.calls)
    # and the client got the same bytes back
    assert proxied_bytes == direct_bytes == TURNS

    # the guard saw every call and result and never objected
    assert checks, "the guard was never asked"
    assert {decision for decision, _ in checks} == {"allow"}
    # each of the 14 calls and 14 results fed once, plus each answer's usage
    assert sum(n for (d, r), n in checks.items() if r == "ok") >= 2 * len(PLAN)
    assert actions == {("openai", "forwarded"): turns}
