"""The LLM proxy against what agents really send that the plain tool loop
does not: the same request again after an error, parallel calls of one
tool, one session over two histories, odd paths. Each test here was a loop
let through, a legitimate agent stopped, or a request sent where it should
not go, before the fix it names."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from yarl import URL

from gateway.llmproxy.anthropic import AnthropicStreamTap
from gateway.llmproxy.openai import OpenAI
from gateway.llmproxy.session import Anchors, Seen
from gateway.llmproxy.wire import in_call_order
from gateway.store import open_store
from tests.fakes.llm import FakeLLM, answer, repeat_tool_call, status, tool_call
from tests.fakes.llm.behaviours import respond
from tests.llm_proxy import WEATHER_TOOL, openai_client, proxy_daemon, raw_post, responses_agent

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
]


async def verdicts(route: str, bodies: list[dict[str, Any]], **headers: str) -> list[str]:
    """The guard's verdict on each request in turn: X-Botbouncer-Guard, else allow."""
    out = []
    for body in bodies:
        _, said, _, _ = await raw_post(route, body, **headers)
        out.append(said.get("X-Botbouncer-Guard", "allow"))
    return out


def call(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)}}  # fmt: skip


def weather_history(turns: int) -> dict[str, Any]:
    """A chat agent asking for the same weather `turns` times, each answered."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Brest?"}]
    for i in range(1, turns + 1):
        asked = call(f"call_{i}", "get_weather", {"city": "Brest"})
        messages.append({"role": "assistant", "content": None, "tool_calls": [asked]})
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": '{"sky":"grey"}'})
    return {"model": "m", "messages": messages, "tools": TOOLS}


async def test_a_blocked_request_sent_again_is_blocked_again() -> None:
    # Breaks if a request the guard blocked (tools disabled) goes out with
    # tools on when the agent's SDK sends it again after an upstream error:
    # every event of it was marked fed, so the retry had nothing new and
    # was forwarded untouched, the loop going on. A request that moves the
    # conversation on without a new tool call or result gets the block too
    # (test_an_agent_that_nudges_the_model_on_gets_no_tools_back); one that
    # brings new tool events is judged afresh.
    async with FakeLLM() as llm:
        llm.then(*(answer("fine") for _ in range(3)), status(500))
        llm.default = answer("fine")
        async with proxy_daemon(llm, "memory://", None) as (_, url):
            route = f"{url}/llm/openai/v1/chat/completions"
            headers = {"Authorization": "Bearer sk-test"}
            for turns in (1, 2, 3):
                assert (await raw_post(route, weather_history(turns), **headers))[0] == 200
            blocked = weather_history(4)
            code, said, _, _ = await raw_post(route, blocked, **headers)
            assert code == 500 and said["X-Botbouncer-Guard"] == "block identical_call"
            code, said, _, _ = await raw_post(route, blocked, **headers)  # the SDK's retry
            assert code == 200 and said["X-Botbouncer-Guard"] == "block identical_call"
            retried = llm.calls[-1].body
            moved_on = weather_history(4)
            moved_on["messages"] += [{"role": "assistant", "content": "Grey."},
                                     {"role": "user", "content": "And tomorrow?"}]  # fmt: skip
            code, said, _, _ = await raw_post(route, moved_on, **headers)
            assert code == 200 and said["X-Botbouncer-Guard"] == "block identical_call"
            assert llm.calls[-1].body["tool_choice"] == "none"
            other = {
                "role": "assistant",
                "content": None,
                "tool_calls": [call("call_n", "get_forecast", {"city": "Brest"})],
            }
            moved_on["messages"] += [other, {"role": "tool", "tool_call_id": "call_n",
                                             "content": "rain"}]  # fmt: skip
            code, said, _, _ = await raw_post(route, moved_on, **headers)
            assert code == 200 and "X-Botbouncer-Guard" not in said
    assert llm.calls[3].body["tool_choice"] == "none"  # the blocked request, answered 500
    assert retried["tool_choice"] == "none"
    assert retried["messages"][-1]["content"].startswith("botbouncer (loop guard): You called")
    assert "tool_choice" not in llm.calls[-1].body


def parallel_history(turns: int) -> dict[str, Any]:
    """Two jobs polled in one turn, in parallel: A queued (the same answer
    every time), B progressing."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Wait for jobs A and B."}]
    for t in range(1, turns + 1):
        calls = [call(f"call_{t}_{job}", "job_status", {"job": job}) for job in "AB"]
        messages.append({"role": "assistant", "content": None, "tool_calls": calls})
        for job in "AB":
            said = json.dumps({"job": job, "progress": 0 if job == "A" else 7 * t})
            messages.append({"role": "tool", "tool_call_id": f"call_{t}_{job}", "content": said})
    return {"model": "m", "messages": messages, "tools": TOOLS}


def test_parallel_results_follow_their_own_calls() -> None:
    # Breaks if the events of parallel calls are fed as the history lists
    # them (both calls, then both results): the guard gives a result to the
    # newest call of its tool still without one, so A's answer was taken
    # for B's.
    events = in_call_order(OpenAI().tool_events(parallel_history(1)))
    assert [(e.kind, e.call) for e in events] == [
        ("step", "call_1_A"), ("result", "call_1_A"), ("step", "call_1_B"), ("result", "call_1_B"),
    ]  # fmt: skip


async def test_parallel_polls_of_one_tool_are_judged_as_the_same_polls_one_a_turn() -> None:
    # Breaks if a result is recorded against the wrong one of two parallel
    # calls of one tool: the guard then saw one job's call answered with the
    # other's progress and blocked a legitimate wait (tool_cycle on the 3rd
    # turn). Polled in parallel or one call a turn, the verdicts are the same.
    async with FakeLLM() as llm:
        llm.default = answer("waiting")
        async with proxy_daemon(llm, "memory://", None) as (d, url):
            route = f"{url}/llm/openai/v1/chat/completions"
            bodies = [parallel_history(turns) for turns in range(1, 7)]
            said = await verdicts(route, bodies, **{"X-Botbouncer-Session": "jobs"})
            state = await d.guard.state("jobs")
    assert not [v for v in said if v.startswith("block")], said
    assert state is not None
    results = [c["result"] for c in state["recent_calls"]]
    assert None not in results
    assert len(set(results[0::2])) == 1  # job A: the same answer every time
    assert len(set(results[1::2])) == 6  # job B: a new one every time


def searches(prefix: str, queries: list[str]) -> dict[str, Any]:
    """A history of one search per turn, each call's id its own."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"{prefix}: find things"}]
    for i, query in enumerate(queries):
        asked = call(f"call_{prefix}_{i}", "search", {"q": query})
        messages.append({"role": "assistant", "content": None, "tool_calls": [asked]})
        messages.append({"role": "tool", "tool_call_id": asked["id"], "content": f"on {query}"})
    return {"model": "m", "messages": messages, "tools": TOOLS}


async def test_two_histories_under_one_session_are_each_fed_once() -> None:
    # Breaks if the session keeps only the last history's events: an agent
    # and the sub-agent it runs, in turn under one X-Botbouncer-Session, had
    # each switch feed the other's whole history again, counting distinct
    # calls many times over until a false tool_call_limit.
    async with FakeLLM() as llm:
        llm.default = answer("ok")
        async with proxy_daemon(llm, "memory://", None) as (d, url):
            route = f"{url}/llm/openai/v1/chat/completions"
            session = {"X-Botbouncer-Session": "run-42"}
            done: list[str] = []
            for turn in range(1, 9):
                done.append(f"city {turn}")
                _, said, _, _ = await raw_post(route, searches("main", done), **session)
                assert "block" not in said.get("X-Botbouncer-Guard", "")
                sub = searches(f"sub{turn}", [f"topic {turn}"])
                _, said, _, _ = await raw_post(route, sub, **session)
                assert "block" not in said.get("X-Botbouncer-Guard", "")
            state = await d.guard.state("run-42")
    assert state is not None and state["steps"] == 8 + 8


SUPPORT = {"role": "system", "content": "You are Acme's support assistant."}
GREETING = "Hello! How can I assist you today?"


def chat(turns: list[str]) -> dict[str, Any]:
    """A support chat that opened with "Hi" and the stock greeting."""
    messages = [SUPPORT, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": GREETING}]  # fmt: skip
    return {"model": "m", "messages": messages + [{"role": "user", "content": t} for t in turns]}


async def test_two_chats_answered_alike_are_never_one_session() -> None:
    # Breaks if a conversation is named by its first answer's text: two users
    # of one chatbot who both say "Hi" get the same greeting word for word,
    # were one session, and one's spending was the other's 429.
    async with FakeLLM() as llm:
        llm.default = answer("Sure.", usage=(4000, 500))
        async with proxy_daemon(llm, "memory://", None, budget={"tokens": 20000}) as (_, url):
            route = f"{url}/llm/openai/v1/chat/completions"
            key = {"Authorization": "Bearer sk-acme"}
            alice = ["My order 1234 has not arrived."]
            for i in range(5):
                code, said, _, _ = await raw_post(route, chat(alice), **key)
                assert code == 200 and "X-Botbouncer-Session" not in said
                alice.append(f"Still nothing ({i})")
            code, said, _, _ = await raw_post(route, chat(["How do I reset my password?"]), **key)
    assert code == 200 and "X-Botbouncer-Session" not in said


async def test_prompt_caching_marks_do_not_move_a_conversation_to_another_session() -> None:
    # Breaks if the opening the fingerprint reads keeps Anthropic's
    # cache_control marks, which the caching pattern moves from turn to
    # turn: the first answer's usage went to a session never used again.
    async with FakeLLM() as llm:
        llm.then(tool_call("read", {"path": "a.py"}, id="toolu_A1", usage=(5000, 100)))
        llm.default = answer("done", usage=(5000, 100))
        async with proxy_daemon(llm, "memory://", None) as (d, url):
            route = f"{url}/llm/anthropic/v1/messages"
            headers = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
            cached = {"type": "ephemeral"}
            ask = {"type": "text", "text": "Fix the bug in a.py"}
            first = [{"role": "user", "content": [{**ask, "cache_control": cached}]}]
            await raw_post(route, {"model": "c", "max_tokens": 9, "messages": first}, **headers)
            used = {"type": "tool_use", "id": "toolu_A1", "name": "read", "input": {"path": "a.py"}}
            result = {"type": "tool_result", "tool_use_id": "toolu_A1", "content": "print(1)",
                      "cache_control": cached}  # fmt: skip
            second = [{"role": "user", "content": [ask]}, {"role": "assistant", "content": [used]},
                      {"role": "user", "content": [result]}]  # fmt: skip
            _, said, _, _ = await raw_post(
                route, {"model": "c", "max_tokens": 9, "messages": second}, **headers
            )
            state = await d.guard.state(said["X-Botbouncer-Session"])
    assert state is not None and state["spent"]["tokens"] == 2 * 5100


async def test_block_mode_stop_in_a_conversation_the_upstream_keeps_asks_the_model() -> None:
    # Breaks if block_mode stop answers a Responses request that continues a
    # stored response with an answer written here: the upstream never held
    # that response, and the agent's next turn was refused there. The model
    # is asked with tools off instead.
    async with FakeLLM() as llm:
        llm.default = repeat_tool_call("get_weather", {"city": "Brest"}, otherwise="Grey.")
        async with proxy_daemon(llm, "memory://", None, block_mode="stop") as (_, url):
            client = openai_client(f"{url}/llm/openai/v1")
            answer_text, ran = await responses_agent(client, "Brest?", chained=True)
    assert (answer_text, ran) == ("Grey.", 4)
    assert llm.calls[-1].tool_choice == "none"


async def test_paths_reach_the_upstream_as_sent_and_never_above_its_base() -> None:
    # Breaks if the proxy forwards the decoded path: an escaped `?` or `#`
    # in a file id became a query or cut the path, `%2E%2E` climbed out of
    # the upstream's base path (with a configured key attached), and
    # `/v1/./chat/completions` reached the model route unguarded.
    async with FakeLLM() as llm:
        llm.default = answer("fine")
        async with proxy_daemon(llm, "memory://", None) as (_, url):
            got = []
            async with aiohttp.ClientSession() as http:
                for path in ("/v1/files/file-abc%3Fpurpose=x", "/v1/files/a%23b/content",
                             "/v1/%2E%2E/%2E%2E/admin/keys", "/v1/../admin"):  # fmt: skip
                    target = URL(f"{url}/llm/openai{path}", encoded=True)
                    async with http.get(target) as resp:
                        got.append((resp.status, llm.calls[-1].path if llm.calls else None))
                dotted = URL(f"{url}/llm/openai/v1/./chat/completions", encoded=True)
                for _ in range(5):
                    async with http.post(dotted, json=weather_history(5)) as resp:
                        guard = resp.headers.get("X-Botbouncer-Guard")
    assert got[0] == (404, "/v1/files/file-abc?purpose=x")  # one segment, as the fake decodes it
    assert got[1] == (404, "/v1/files/a#b/content")
    assert [status for status, _ in got[2:]] == [400, 400]
    assert len([c for c in llm.calls if "admin" in c.path]) == 0
    assert guard == "block identical_call"


FEW_SHOT = [
    {"role": "system", "content": "You are a weather bot. Use get_weather."},
    {"role": "user", "content": "Weather in Oslo?"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "111", "type": "function",
     "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
    {"role": "tool", "tool_call_id": "111", "content": '{"sky": "snow"}'},
    {"role": "assistant", "content": "It snows in Oslo."},
]  # fmt: skip


@pytest.mark.parametrize("store", ["memory", "redis"])
async def test_conversations_sharing_a_few_shot_example_are_sessions_of_their_own(
    store: str, redis_url: str, key_prefix: str
) -> None:
    # Breaks if a session is named by the first answer with tool calls that a
    # history holds, whoever gave it: a prompt holding an example of a tool
    # call (few-shot, the same in every conversation) made every user's
    # conversation one session, and from the third user on a single call was
    # blocked as the same call again. On Redis, two replicas take the
    # requests in turn: each finds the session the other's answer named.
    def model(call: Any) -> Any:
        last = call.messages[-1]
        if last["role"] == "user":  # the real question: look the weather up
            return tool_call("get_weather", {"city": last["content"].split()[-1].rstrip("?")})
        return answer("Grey.")

    url_of = "memory://" if store == "memory" else redis_url
    prefix = None if store == "memory" else key_prefix
    async with FakeLLM() as llm:
        llm.default = respond(model)
        async with (
            proxy_daemon(llm, url_of, prefix) as (_, one),
            proxy_daemon(llm, url_of, prefix) as (_, two),
        ):
            replicas = [one] if store == "memory" else [one, two]
            names, verdicts = [], []
            for user in range(5):
                messages = [*FEW_SHOT, {"role": "user", "content": f"Weather in city{user}?"}]
                for turn in range(3):
                    client = openai_client(f"{replicas[turn % len(replicas)]}/llm/openai/v1")
                    raw = await client.chat.completions.with_raw_response.create(
                        model="m", messages=messages, tools=[WEATHER_TOOL]
                    )
                    verdicts.append(raw.headers.get("X-Botbouncer-Guard"))
                    said = raw.parse().choices[0].message
                    messages.append(said.model_dump(exclude_none=True))
                    if not said.tool_calls:
                        names.append(raw.headers.get("X-Botbouncer-Session"))
                        break
                    for c in said.tool_calls:
                        messages.append({"role": "tool", "tool_call_id": c.id, "content": "grey"})
    assert verdicts == [None] * 10  # two requests a user, none warned or blocked
    assert len(set(names)) == 5 and None not in names


async def test_a_block_in_a_shared_prompt_s_session_leaves_other_conversations_alone() -> None:
    # Breaks if a held block applies to any request of its session that feeds
    # nothing new: a conversation begun before the proxy was in place, its
    # prompt's few-shot example naming its session, was blocked; then every
    # new conversation on that prompt (its example already fed there) had its
    # tools off from its first request on.
    looping = [*FEW_SHOT, {"role": "user", "content": "Weather in Brest?"}]
    for i in range(4):
        asked = call(f"call_x{i}", "get_weather", {"city": "Brest"})
        looping += [{"role": "assistant", "content": None, "tool_calls": [asked]},
                    {"role": "tool", "tool_call_id": f"call_x{i}", "content": "grey"}]  # fmt: skip
    async with FakeLLM() as llm:
        llm.default = answer("fine")
        async with proxy_daemon(llm, "memory://", None) as (_, url):
            route = f"{url}/llm/openai/v1/chat/completions"
            _, said, _, _ = await raw_post(route, {"model": "m", "messages": looping})
            assert said["X-Botbouncer-Guard"] == "block identical_call"
            fresh = [*FEW_SHOT, {"role": "user", "content": "Weather in Paris?"}]
            _, said, _, _ = await raw_post(route, {"model": "m", "messages": fresh})
    assert "X-Botbouncer-Guard" not in said
    assert "tool_choice" not in llm.calls[-1].body


async def test_an_agent_that_nudges_the_model_on_gets_no_tools_back() -> None:
    # Breaks if a blocked session's next request that feeds nothing new goes
    # out with tools on: an agent that answers a final answer with "please
    # continue" (as autonomous coding agents do) had the model call the same
    # tool again, ran it, was blocked, nudged again: the tool ran every other
    # request, for ever. DELETE /v1/guard/<session> gives the tools back.
    async with FakeLLM() as llm:
        llm.default = repeat_tool_call("get_weather", {"city": "Brest"}, otherwise="Grey.")
        async with proxy_daemon(llm, "memory://", None) as (_, url):
            client = openai_client(f"{url}/llm/openai/v1")
            messages: list[dict[str, Any]] = [{"role": "user", "content": "Brest? Go on alone."}]
            ran, session = 0, None

            async def turn() -> bool:
                nonlocal ran, session
                raw = await client.chat.completions.with_raw_response.create(
                    model="m", messages=messages, tools=[WEATHER_TOOL]
                )
                session = raw.headers.get("X-Botbouncer-Session") or session
                said = raw.parse().choices[0].message
                messages.append(said.model_dump(exclude_none=True))
                for c in said.tool_calls or []:
                    ran += 1
                    messages.append({"role": "tool", "tool_call_id": c.id, "content": "grey"})
                if not said.tool_calls:
                    messages.append({"role": "user", "content": "Please continue the task."})
                return bool(said.tool_calls)

            for _ in range(20):
                await turn()
            assert ran == 4  # the 4th ran before the proxy saw it; none after
            async with (
                aiohttp.ClientSession() as http,
                http.delete(f"{url}/v1/guard/{session}") as resp,
            ):
                assert resp.status in (200, 204), await resp.text()
            assert await turn()  # the session started over: tools on again


async def test_a_chained_responses_agent_nudging_on_gets_no_tools_back() -> None:
    # Breaks if a held block reaches only requests that carry their history:
    # a Responses agent continuing stored responses (previous_response_id)
    # sends only its nudge, no tool events at all, and had the tools back,
    # the same call running every other request.
    tools = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]
    async with FakeLLM() as llm:
        llm.default = repeat_tool_call("get_weather", {"city": "Brest"}, otherwise="Grey.")
        async with proxy_daemon(llm, "memory://", None) as (_, url):
            route = f"{url}/llm/openai/v1/responses"
            asked = [{"role": "user", "content": "Brest? Go on."}]
            body: dict[str, Any] = {"model": "m", "tools": tools, "input": asked}
            ran = 0
            for _ in range(12):
                _, _, raw, _ = await raw_post(route, body)
                said = json.loads(raw)
                calls = [i for i in said["output"] if i["type"] == "function_call"]
                ran += len(calls)
                new: list[Any] = [{"type": "function_call_output", "call_id": c["call_id"],
                                   "output": "grey"} for c in calls]  # fmt: skip
                new = new or [{"role": "user", "content": "Please continue the task."}]
                body = {"model": "m", "tools": tools, "previous_response_id": said["id"],
                        "input": new}  # fmt: skip
    assert ran == 4  # the 4th ran before the proxy saw it; none after


async def test_a_conversation_in_use_keeps_its_session_past_the_state_ttl() -> None:
    # Breaks if the record of which answer named a session is stored once and
    # never renewed: a conversation in use for longer than the state TTL was
    # found by the replica that relayed its first answer (from memory) and no
    # longer by the others, which named a session of their own: two sessions,
    # each with its own budget.
    store = open_store("memory://", state_ttl_seconds=2)
    now = [0.0]
    relayed = Anchors(store, clock=lambda: now[0])
    relayed.hold("llm-a")
    await relayed.keep("llm-a")
    for _ in range(2):
        await asyncio.sleep(1.2)  # past the TTL in all: found only if renewed
        now[0] += Anchors.REFRESH
        assert await relayed.known(["llm-a"]) == "llm-a"
        await asyncio.gather(*relayed._renewing)
    assert await Anchors(store).known(["llm-a"]) == "llm-a"  # another replica finds it


async def test_an_error_of_the_http_layer_comes_in_the_api_s_shape() -> None:
    # Breaks if the daemon's HTTP layer answers the proxy's routes as it
    # answers its own: a body that is no gzip it says it is got a bare
    # {"error": "..."}, neither OpenAI's error object nor Anthropic's.
    headers = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
    routes = ("/llm/openai/v1/chat/completions", "/llm/anthropic/v1/messages",
              "/v1/guard/run-1/step")  # fmt: skip
    got = {}
    async with (
        FakeLLM() as llm,
        proxy_daemon(llm, "memory://", None) as (_, url),
        aiohttp.ClientSession() as http,
    ):
        for route in routes:
            async with http.post(url + route, data=b"not gzip", headers=headers) as resp:
                got[route] = (resp.status, await resp.json())
    status, openai_error = got[routes[0]]
    assert status == 400 and openai_error["error"]["code"] == "invalid_request"
    assert openai_error["error"]["message"].startswith("malformed request")
    status, anthropic_error = got[routes[1]]
    assert status == 400 and anthropic_error["type"] == "error"
    assert anthropic_error["error"]["message"].startswith("malformed request")
    status, own = got[routes[2]]  # the daemon's own routes: as before
    assert status == 400 and own["error"].startswith("malformed request")
    assert llm.count == 0


async def test_a_query_reaches_the_upstream_as_sent() -> None:
    # Breaks if the query is decoded and encoded again: `?flag` reached the
    # upstream as `?flag=`, which a server may read otherwise.
    async with FakeLLM() as llm:
        llm.default = answer("fine")
        async with (
            proxy_daemon(llm, "memory://", None) as (_, url),
            aiohttp.ClientSession() as http,
        ):
            sent = "flag&api-version=2024-10-21&q=a%2Bb"
            target = URL(f"{url}/llm/openai/v1/chat/completions?{sent}", encoded=True)
            async with http.post(target, json=weather_history(1)) as resp:
                assert resp.status == 200
    assert llm.calls[-1].query == sent


async def test_a_session_under_another_profile_is_not_asked_again_by_the_sdks() -> None:
    # Breaks if the 409 for a session held under another guard profile lets
    # the SDKs retry it (they retry 409 unless told not to): the same answer
    # three times over, a second and more later.
    async with FakeLLM() as llm:
        llm.default = answer("fine")
        async with proxy_daemon(llm, "memory://", None) as (d, url):
            limits = d.guard._limits["default"]
            await d.guard.engine.run("taken", "usage", limits, {"usd": 0, "tok": 0}, "other", None)
            route = f"{url}/llm/openai/v1/chat/completions"
            code, said, body, _ = await raw_post(
                route, weather_history(1), **{"X-Botbouncer-Session": "taken"}
            )
    assert code == 409 and said["x-should-retry"] == "false"
    assert said["X-Botbouncer-Error"] == "guard_conflict"  # Anthropic's shape has no code
    error = json.loads(body)["error"]
    assert error["code"] == "guard_conflict" and "X-Botbouncer-Session" in error["message"]
    assert "?profile=" not in error["message"]  # the guard API's advice, not an SDK's
    assert d.metrics.llm_requests.labels("openai", "guard_conflict")._value.get() == 1
    assert llm.count == 0


async def test_a_long_history_and_a_short_one_in_turn_are_each_fed_once() -> None:
    # Breaks if the keys kept of the history before the last are cut oldest
    # last: a main agent's history of 140 calls (280 events) beside a
    # sub-agent's had its oldest events fed again at every switch.
    def history(prefix: str, calls: int) -> list[Any]:
        return OpenAI().tool_events(searches(prefix, [f"q{i}" for i in range(calls)]))

    seen = Seen(open_store("memory://"))
    fed_counts = []
    for events in (history("main", 140), history("sub", 1), history("main", 141),
                   history("sub", 2), history("main", 142)):  # fmt: skip
        fed = await seen.new("s", events)
        fed_counts.append(len(fed.new))
        await seen.remember("s", events, fed)
    assert fed_counts == [280, 2, 2, 2, 2]


async def test_four_long_histories_in_turn_are_each_fed_once() -> None:
    # Breaks if the keys kept of the histories before the last hold only
    # one more: an orchestrator and three sub-agents under one session
    # header, each 150 calls long, had their oldest events fed again at
    # every switch (1,143 steps counted for 450 calls that ran).
    seen = Seen(open_store("memory://"))
    fed_counts = []
    for calls in (150, 151, 152):
        for agent in "abcd":
            events = OpenAI().tool_events(searches(agent, [f"q{i}" for i in range(calls)]))
            fed = await seen.new("s", events)
            fed_counts.append(len(fed.new))
            await seen.remember("s", events, fed)
    assert fed_counts == [300] * 4 + [2] * 8


async def test_a_verdict_held_for_a_retry_ends_with_the_session() -> None:
    # Breaks if the verdict kept for a retry of a blocked request outlives
    # the guard session (DELETE /v1/guard/<session>): the same request was
    # refused for good, while the guard had nothing left to say.
    async with FakeLLM() as llm:
        llm.default = answer("fine")
        async with proxy_daemon(llm, "memory://", None) as (d, url):
            route = f"{url}/llm/openai/v1/chat/completions"
            session = {"X-Botbouncer-Session": "run-9"}
            for turns in (1, 2, 3, 4):
                _, said, _, _ = await raw_post(route, weather_history(turns), **session)
            assert said["X-Botbouncer-Guard"] == "block identical_call"
            await d.guard.reset("run-9")  # what DELETE /v1/guard/run-9 does
            _, said, _, _ = await raw_post(route, weather_history(4), **session)
    assert "X-Botbouncer-Guard" not in said
    assert "tool_choice" not in llm.calls[-1].body


async def test_custom_tool_calls_of_chat_completions_are_guarded() -> None:
    # Breaks if the proxy reads only function tool calls: a custom
    # (free-form) tool called the same way again and again was never fed.
    def custom_history(turns: int) -> dict[str, Any]:
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Sales by region?"}]
        for i in range(1, turns + 1):
            query = {"name": "run_sql", "input": "SELECT region, sum(x) FROM s"}
            asked = {"id": f"call_{i}", "type": "custom", "custom": query}
            messages.append({"role": "assistant", "content": None, "tool_calls": [asked]})
            messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": "0 rows"})
        tools = [{"type": "custom", "custom": {"name": "run_sql"}}]
        return {"model": "m", "messages": messages, "tools": tools}

    async with FakeLLM() as llm:
        llm.default = answer("fine")
        async with proxy_daemon(llm, "memory://", None) as (_, url):
            route = f"{url}/llm/openai/v1/chat/completions"
            bodies = [custom_history(turns) for turns in (1, 2, 3, 4)]
            said = await verdicts(route, bodies, **{"X-Botbouncer-Session": "sql"})
    assert said == ["allow", "allow", "warn identical_call", "block identical_call"]


def test_prompt_caching_marks_leave_an_openai_opening_as_it_was() -> None:
    # Breaks if the OpenAI dialect's opening keeps cache_control marks (sent
    # through gateways to Claude models), which move from turn to turn: the
    # first tool-calling answer's usage went to a session never used again.
    plain = [{"type": "text", "text": "Fix a.py"}]
    marked = [{**plain[0], "cache_control": {"type": "ephemeral"}}]
    opening = OpenAI().opening
    assert opening({"messages": [{"role": "user", "content": marked}]}) == opening(
        {"messages": [{"role": "user", "content": plain}]}
    )


def test_a_stream_s_input_count_is_not_undone_by_a_later_zero() -> None:
    # Breaks if message_delta's input count replaces message_start's when it
    # is lower: a compatible server that sends 0 (or null) there made a
    # 20,000-token prompt cost nothing against the budget.
    tap = AnthropicStreamTap()
    start = {"type": "message_start", "message": {"usage": {
        "input_tokens": 100, "cache_read_input_tokens": 20_000, "output_tokens": 1}}}  # fmt: skip
    delta = {"type": "message_delta", "usage": {"input_tokens": 0, "output_tokens": 250}}
    stream = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in (start, delta))
    tap.feed(stream.encode())
    tap.done()
    assert (tap.usage.input_tokens, tap.usage.output_tokens) == (20_100, 250)


SHOT = {"type": "computer_screenshot", "image_url": "data:image/png;base64,iVBORw0KGgo="}


def computer_use(turns: int, item: str = "computer_call") -> dict[str, Any]:
    """A Responses computer-use (or shell) agent clicking the same spot
    `turns` times, the screen the same each time."""
    kinds = {"computer_call": ("action", {"type": "click", "x": 10, "y": 20}, SHOT),
             "shell_call": ("action", {"commands": ["make test"]}, "1 failed")}  # fmt: skip
    field, value, output = kinds[item]
    inputs: list[dict[str, Any]] = [{"role": "user", "content": "Open the settings page."}]
    for i in range(1, turns + 1):
        inputs.append({"type": item, "id": f"cu_{i}", "call_id": f"call_{i}", field: value,
                       "status": "completed"})  # fmt: skip
        inputs.append({"type": item + "_output", "call_id": f"call_{i}", "output": output})
    return {"model": "computer-use-preview", "input": inputs, "tools": [{"type": "computer"}]}


@pytest.mark.parametrize("item", ["computer_call", "shell_call"])
async def test_a_responses_computer_or_shell_loop_is_stopped(item: str) -> None:
    # Breaks if the Responses dialect reads only function and custom tool
    # calls: a computer-use agent clicking the same spot on the same screen
    # (the Agents SDK's ComputerTool) or a shell agent rerunning the same
    # failing command was never warned or blocked, and without the session
    # header had no session at all.
    async with FakeLLM() as llm:
        llm.default = answer("fine")
        async with proxy_daemon(llm, "memory://", None) as (_, url):
            route = f"{url}/llm/openai/v1/responses"
            said = await verdicts(route, [computer_use(turns, item) for turns in (1, 2, 3, 4)])
    assert said == ["allow", "allow", "warn identical_call", "block identical_call"]
    assert llm.calls[-1].tool_choice == "none"
