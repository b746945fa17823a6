"""The agent guard's detectors, each tripped at exactly its step, and the
legitimate sequences that must trip nothing - on memory (lupa) and on a real
Redis, with one injected clock."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.config import GuardConfig, parse_config
from gateway.guard import normalize
from gateway.guard.engine import MemoryEngine, RedisEngine
from gateway.guard.service import REASONS, Answer, Guard, GuardInputError, ProfileConflict
from gateway.store.redis import RedisStore
from tests.conftest import delete_prefix


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def guard_config(yaml_guard: str = "") -> GuardConfig:
    text = yaml_guard + "bots: [{name: a, platform: http, backend: {type: echo}}]\n"
    return parse_config(text).guard


@pytest.fixture(params=["memory", "redis"])
async def engine_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def make(engine_kind: str, request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    """make(config) -> a Guard on this test's engine, with a shared clock."""
    clock = Clock()
    stores: list[RedisStore] = []

    def build(config: GuardConfig | None = None) -> Guard:
        config = config or guard_config()
        if engine_kind == "memory":
            return Guard(config, MemoryEngine(clock), clock)
        url = request.getfixturevalue("redis_url")
        prefix = request.getfixturevalue("key_prefix")
        store = RedisStore.from_url(url, prefix=prefix)
        stores.append(store)
        return Guard(config, RedisEngine(store), clock)

    build.clock = clock  # type: ignore[attr-defined]
    yield build
    for store in stores:
        await delete_prefix(store, store.prefix)
        await store.close()


@pytest.fixture
def guard(make: Any) -> Guard:
    return make()  # type: ignore[no-any-return]


def seen(answers: list[Answer]) -> list[tuple[str, str]]:
    return [(a.decision, a.reason) for a in answers]


async def steps(guard: Guard, calls: list[tuple[str, Any]], session: str = "s") -> list[Answer]:
    return [await guard.step(session, {"tool": t, "args": a}) for t, a in calls]


ALLOW = ("allow", "ok")

# -- 1. identical call ---------------------------------------------------------


async def test_identical_call_warns_at_the_second_and_blocks_at_the_third(guard: Guard) -> None:
    got = await steps(guard, [("search", {"q": "x", "n": 1})] * 4)
    assert seen(got) == [
        ALLOW,
        ("warn", "identical_call"),
        ("block", "identical_call"),
        ("block", "identical_call"),  # a blocked call is not made, so it stays blocked
    ]
    assert got[2].evidence == {"tool": "search", "repeats": 3}
    assert got[2].status == 429 and got[1].status == 200
    assert "search" in got[2].message and "same arguments" in got[2].message
    # argument order does not make a call different
    again = await guard.step("s2", {"tool": "t", "args": {"a": 1, "b": 2}})
    assert again.decision == "allow"
    assert (await guard.step("s2", {"tool": "t", "args": {"b": 2, "a": 1}})).decision == "warn"


async def test_with_results_a_repeat_counts_after_an_unchanged_result(guard: Guard) -> None:
    """The first result is the baseline: same call after the same result warns
    at the 3rd call, blocks at the 4th; a changed result starts over."""
    out = []
    for _ in range(4):
        out.append(await guard.step("s", {"tool": "status", "args": {"job": 7}}))
        await guard.result("s", {"tool": "status", "ok": True, "output": {"state": "queued"}})
    assert seen(out) == [
        ALLOW,
        ALLOW,
        ("warn", "identical_call"),
        ("block", "identical_call"),
    ]


async def test_exempt_tools_are_never_counted(make: Any) -> None:
    guard = make(guard_config("guard: {profiles: {default: {exempt_tools: [now]}}}\n"))
    got = await steps(guard, [("now", {})] * 6)
    assert seen(got) == [ALLOW] * 6
    assert got[-1].steps["used"] == 0


# -- 2. cycle ------------------------------------------------------------------


async def test_a_two_step_cycle_warns_at_two_repetitions_blocks_at_three(guard: Guard) -> None:
    ab = [("open", {"id": 1}), ("search", {"q": "x"})]
    got = await steps(guard, ab * 3)
    # still in the cycle after the warning: warned again until the block
    assert seen(got) == [ALLOW, ALLOW, ALLOW, ("warn", "tool_cycle"), ("warn", "tool_cycle"),
                         ("block", "tool_cycle")]  # fmt: skip
    assert got[3].evidence == {"pattern": ["open", "search"], "period": 2, "repetitions": 2}
    assert got[5].evidence["repetitions"] == 3
    assert "open → search" in got[5].message


async def test_a_three_step_cycle_warns_at_six_and_blocks_at_nine(make: Any) -> None:
    """A 3-cycle has 3 distinct calls in 8, so with the default profile low
    exploration blocks it first, at the 8th call; with exploration judged later,
    the cycle detector blocks at the 9th (3 full repetitions)."""
    abc = [("plan", {}), ("search", {"q": "x"}), ("read", {"u": 1})]
    got = await steps(make(), abc * 3)
    assert seen(got)[:8] == [ALLOW] * 5 + [("warn", "tool_cycle")] * 2 + [
        ("block", "low_exploration")]  # fmt: skip
    assert got[7].also == ["tool_cycle"]
    later = make(guard_config("guard: {profiles: {default: {exploration: {min_calls: 12}}}}\n"))
    got = await steps(later, abc * 3, session="s2")
    assert seen(got) == [ALLOW] * 5 + [("warn", "tool_cycle")] * 3 + [("block", "tool_cycle")]
    assert got[8].evidence == {"pattern": ["plan", "search", "read"], "period": 3,
                               "repetitions": 3}  # fmt: skip


async def test_a_cycle_whose_results_change_is_progress(guard: Guard) -> None:
    out = []
    for i in range(4):
        for tool in ("fetch", "parse"):
            out.append(await guard.step("s", {"tool": tool, "args": {}}))
            await guard.result("s", {"tool": tool, "ok": True, "output": f"{tool} {i}"})
    assert seen(out) == [ALLOW] * 8


# -- 3. fixation ---------------------------------------------------------------

REPHRASED = [
    "cheap flights paris london march",
    "cheap flights paris london march tickets",
    "cheap flights paris london march deals",
    "cheap flights paris london march fares",
]


async def test_four_rephrasings_of_one_query_are_blocked_at_the_fourth(guard: Guard) -> None:
    got = await steps(guard, [("web_search", {"query": q}) for q in REPHRASED])
    assert seen(got) == [ALLOW, ALLOW, ALLOW, ("block", "input_fixation")]
    assert got[3].evidence == {"tool": "web_search", "calls": 4, "similarity": 0.71}


# -- 4. low exploration --------------------------------------------------------


async def test_few_distinct_calls_among_eight_are_blocked(guard: Guard) -> None:
    got = await steps(guard, [(t, {}) for t in "ABACABCA"])
    assert seen(got) == [ALLOW] * 7 + [("block", "low_exploration")]
    assert got[7].evidence == {"unique": 3, "calls": 8, "ratio": 0.38}
    assert got[7].also == []


# -- 5. failure streak, 6. no progress -----------------------------------------


async def test_a_failing_tool_warns_at_three_failures_and_blocks_at_five(guard: Guard) -> None:
    results = []
    for i in range(5):
        await guard.step("s", {"tool": "deploy", "args": {"try": i}})
        results.append(await guard.result("s", {"tool": "deploy", "ok": False,
                                                "output": f"error {i}"}))  # fmt: skip
    assert seen(results) == [ALLOW, ALLOW, ("warn", "failure_streak"), ("warn", "failure_streak"),
                             ("block", "failure_streak")]  # fmt: skip
    nxt = await guard.step("s", {"tool": "deploy", "args": {"try": 99}})
    assert (nxt.decision, nxt.reason, nxt.evidence["failures"]) == ("block", "failure_streak", 5)
    # a success resets the streak
    await guard.step("t", {"tool": "deploy", "args": {"try": 1}})
    for ok in (False, False, True, False):
        last = await guard.result("t", {"tool": "deploy", "ok": ok, "output": str(ok)})
    assert last.decision == "allow"


async def test_the_same_result_three_times_warns_no_progress(guard: Guard) -> None:
    results = []
    for i in range(3):
        await guard.step("s", {"tool": "lookup", "args": {"id": i}})
        results.append(await guard.result("s", {"tool": "lookup", "output": {"found": 0}}))
    assert seen(results) == [ALLOW, ALLOW, ("warn", "no_progress")]
    assert results[2].evidence == {"tool": "lookup", "same_results": 3}


async def test_failures_of_calls_side_by_side_are_judged_as_one_after_another(
    guard: Guard,
) -> None:
    # Breaks if a failure named by its call's arguments is taken for the
    # tool's newest call: five pages fetched side by side, each answering
    # the same 404, were "the same call failing the same way five times",
    # warned, then a retry of one page blocked as a failure_streak. One
    # after another the same five trip no failure streak.
    pages = [{"url": f"https://example.org/{p}"} for p in ("alpha", "bravo", "charlie", "delta")]
    failed = {"tool": "fetch", "ok": False, "output": "HTTPError: 404 Not Found"}

    async def side_by_side(session: str) -> list[Answer]:
        out = [await guard.step(session, {"tool": "fetch", "args": a}) for a in pages]
        out += [await guard.result(session, {**failed, "args": a}) for a in pages]
        return [*out, await guard.step(session, {"tool": "fetch", "args": pages[-1]})]

    async def in_turn(session: str) -> list[Answer]:
        out = []
        for a in pages:
            out.append(await guard.step(session, {"tool": "fetch", "args": a}))
            out.append(await guard.result(session, {**failed, "args": a}))
        return [*out, await guard.step(session, {"tool": "fetch", "args": pages[-1]})]

    def streaks(answers: list[Answer]) -> list[tuple[str, str]]:
        return [seen([a])[0] for a in answers if "failure" in a.reason]

    assert streaks(await side_by_side("p")) == streaks(await in_turn("q")) == []


@pytest.mark.parametrize("said", ["ok", "Done.", {"ok": True}, '{"status": "success"}'])
async def test_an_acknowledgement_again_is_no_sign_of_no_progress(guard: Guard, said: Any) -> None:
    # Breaks if an answer that only acknowledges the call counts toward
    # no_progress: an agent writing five files, each answered `ok`, was told
    # at the third that calling again would change nothing and to move on.
    out = []
    for i in range(5):
        await guard.step("s", {"tool": "write_file", "args": {"path": f"notes/{i}.md"}})
        out.append(await guard.result("s", {"tool": "write_file", "output": said}))
    assert seen(out) == [ALLOW] * 5
    state = await guard.state("s")
    assert state is not None and state["tools"]["write_file"]["same_result_streak"] == 0
    # what says more than that still counts: nothing found, three times
    for i in range(3):
        await guard.step("s", {"tool": "search", "args": {"q": "tides", "page": 5 + i}})
        last = await guard.result("s", {"tool": "search", "output": "ok, 0 results"})
    assert (last.decision, last.reason) == ("warn", "no_progress")


def test_what_acknowledges_a_call() -> None:
    for said in ("ok", " OK. ", "Done!", "success", {"ok": True}, {"status": "ok"},
                 '{"success": true}', {"ok": True, "result": "done"}):  # fmt: skip
        assert normalize.acknowledges(said), said
    # a yes/no tool's answer is an answer: `true` again and again is no progress
    for said in ("ok, 0 results", "[]", "", None, False, 1, {}, {"ok": False},
                 True, "true", {"result": True}, '{"result": true}', {"ok": "ok"},
                 {"status": "ok", "path": "a.md"}, '{"found": 0}', ["ok"], "not ok",
                 '{"ok": "{\\"ok\\": true}"}'):  # fmt: skip
        assert not normalize.acknowledges(said), said


# -- 7. sub-agents -------------------------------------------------------------

SUB = "guard: {profiles: {default: {subagents: {tools: [researcher]}}}}\n"


async def test_a_fourth_delegation_to_a_sub_agent_is_blocked(make: Any) -> None:
    guard = make(guard_config(SUB))
    out = []
    for i in range(4):
        out.append(await guard.step("s", {"tool": "researcher", "args": {"task": f"part {i}"}}))
        await guard.result("s", {"tool": "researcher", "output": f"finding number {i} " * i})
    assert seen(out) == [ALLOW, ALLOW, ALLOW, ("block", "subagent_call_limit")]


async def test_a_sub_agent_answering_the_same_twice_is_blocked(make: Any) -> None:
    guard = make(guard_config(SUB))
    await guard.step("s", {"tool": "researcher", "args": {"task": "a"}})
    first = await guard.result(
        "s", {"tool": "researcher", "output": "the report covers revenue costs and margins"}
    )
    await guard.step("s", {"tool": "researcher", "args": {"task": "b"}})
    second = await guard.result(
        "s", {"tool": "researcher", "output": "the report covers revenue, costs and margins!"}
    )
    assert seen([first, second]) == [ALLOW, ("block", "subagent_repeated_response")]
    nxt = await guard.step("s", {"tool": "researcher", "args": {"task": "c"}})
    assert (nxt.decision, nxt.reason) == ("block", "subagent_repeated_response")


# -- 8. retries ----------------------------------------------------------------

RETRY = 'guard: {profiles: {default: {retry: {prechecks: {invoice: "INV-\\\\d+"}}}}}\n'


async def test_a_retry_that_cannot_succeed_is_blocked_at_once(make: Any) -> None:
    guard = make(guard_config(RETRY))
    hopeless = await guard.retry("s", {"task": "invoice", "input": "please pay", "error": "x"})
    assert (hopeless.decision, hopeless.reason) == ("block", "input_missing_prerequisite_signal")
    ok = await guard.retry("s", {"task": "invoice", "input": "pay INV-42", "error": "x"})
    assert ok.decision == "allow"


async def test_a_task_is_retried_at_most_twice_an_hour(make: Any) -> None:
    guard = make()
    got = [await guard.retry("s", {"task": "summarise", "input": "x"}) for _ in range(3)]
    assert seen(got) == [ALLOW, ALLOW, ("block", "retry_limit")]
    assert got[2].evidence == {"task": "summarise", "retries": 2, "max": 2,
                               "window_seconds": 3600}  # fmt: skip
    other = await guard.retry("s", {"task": "translate", "input": "x"})
    assert other.decision == "allow"  # per task
    make.clock.now += 3601
    assert (await guard.retry("s", {"task": "summarise", "input": "x"})).decision == "allow"


# -- 9. handoffs ---------------------------------------------------------------


async def test_handing_back_to_an_agent_a_third_time_is_blocked(guard: Guard) -> None:
    hops = [("billing", "subscriptions"), ("subscriptions", "billing"),
            ("billing", "subscriptions"), ("subscriptions", "billing")]  # fmt: skip
    got = [await guard.handoff("s", {"source": s, "target": t}) for s, t in hops]
    assert seen(got) == [ALLOW, ALLOW, ALLOW, ("block", "handoff_revisit")]
    assert got[3].evidence["chain"] == [
        "billing", "subscriptions", "billing", "subscriptions", "billing"
    ]  # fmt: skip
    assert "billing → subscriptions → billing" in got[3].message


async def test_a_seventh_handoff_is_blocked(guard: Guard) -> None:
    agents = ["triage", "a", "b", "c", "d", "e", "f", "g"]
    got = [
        await guard.handoff("s", {"source": agents[i], "target": agents[i + 1]}) for i in range(7)
    ]
    assert seen(got) == [ALLOW] * 6 + [("block", "handoff_limit")]
    assert got[6].evidence["handoffs"] == 6


# -- 10. knowledge base ---------------------------------------------------------


async def test_a_question_asked_of_the_kb_a_third_time_is_blocked(make: Any) -> None:
    guard = make()
    asks = [
        ("What is the refund policy for annual plans?", 0.41),
        ("refund policy annual plans", 0.38),
        ("Annual plans: what's the refund policy?", None),
    ]
    got = [await guard.kb_query("s", {"question": q, "confidence": c}) for q, c in asks]
    assert seen(got) == [ALLOW, ALLOW, ("block", "kb_requery")]
    assert got[2].evidence["best_confidence"] == 0.41
    assert "0.41" in got[2].message
    assert (await guard.kb_query("s", {"question": "How do I export data?"})).decision == "allow"
    make.clock.now += 901
    assert (await guard.kb_query("s", {"question": asks[0][0]})).decision == "allow"


# -- 11. context drift ----------------------------------------------------------


async def test_three_sharp_context_growths_in_a_row_warn(guard: Guard) -> None:
    sizes = [1000, 1400, 1900, 2600, 2700]
    got = [
        await guard.step("s", {"tool": f"t{i}", "args": {}, "input_tokens": n})
        for i, n in enumerate(sizes)
    ]
    assert seen(got) == [ALLOW, ALLOW, ALLOW, ("warn", "context_growth"), ALLOW]
    assert got[3].evidence == {"sizes": [1000, 1400, 1900, 2600], "growth_steps": 3}


async def test_total_tokens_over_the_cap_block(make: Any) -> None:
    guard = make(
        guard_config("guard: {profiles: {default: {context: {max_total_tokens: 5000}}}}\n")
    )
    got = [
        await guard.step("s", {"tool": f"t{i}", "args": {}, "input_tokens": 2000}) for i in range(3)
    ]
    assert seen(got) == [ALLOW, ALLOW, ("block", "token_cap")]
    assert got[2].evidence == {"total_tokens": 6000, "max": 5000}


# -- 12. budget ----------------------------------------------------------------


async def test_a_budget_warns_at_80_percent_and_blocks_at_100(guard: Guard) -> None:
    first = await guard.usage("s", {"cost_usd": 0.5, "tokens": 100, "budget_usd": 1.0})
    assert first.budget == {"usd_spent": 0.5, "usd_limit": 1.0, "usd_remaining": 0.5,
                            "tokens_spent": 100, "tokens_limit": None,
                            "tokens_remaining": None}  # fmt: skip
    warned = await guard.usage("s", {"cost_usd": 0.31})
    assert (warned.decision, warned.reason) == ("warn", "budget_warning")
    assert warned.evidence == {"percent": 81}
    step = await guard.step("s", {"tool": "search", "args": {}})
    assert (step.decision, step.reason) == ("warn", "budget_warning")
    assert step.budget["usd_remaining"] == 0.19  # in every answer
    spent = await guard.usage("s", {"cost_usd": 0.2})
    assert (spent.decision, spent.reason) == ("block", "budget_exhausted")
    after = await guard.step("s", {"tool": "other", "args": {}})
    assert (after.decision, after.reason, after.budget["usd_remaining"]) == (
        "block", "budget_exhausted", 0.0)  # fmt: skip


async def test_a_token_budget_from_the_profile(make: Any) -> None:
    guard = make(guard_config("guard: {profiles: {default: {budget: {tokens: 1000}}}}\n"))
    got = [await guard.usage("s", {"tokens": 400}) for _ in range(3)]
    assert seen(got) == [ALLOW, ("warn", "budget_warning"), ("block", "budget_exhausted")]
    assert got[0].budget["tokens_remaining"] == 600


# -- 13. ceilings ----------------------------------------------------------------

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
         "juliet", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo",
         "sierra", "tango", "uniform", "victor", "whiskey", "xray", "yankee", "zulu"]  # fmt: skip


async def test_the_fifty_first_step_is_blocked(guard: Guard) -> None:
    got = await steps(guard, [(f"tool{i}", {}) for i in range(51)])
    assert seen(got) == [ALLOW] * 50 + [("block", "step_limit")]
    assert got[50].steps == {"used": 50, "max": 50}


async def test_one_tool_at_most_twenty_five_times(guard: Guard) -> None:
    got = await steps(guard, [("lookup", {"word": w}) for w in WORDS])
    assert seen(got) == [ALLOW] * 25 + [("block", "tool_call_limit")]
    assert got[25].evidence == {"tool": "lookup", "calls": 25, "max": 25}


# -- legitimate sequences: nothing trips ------------------------------------------


async def test_a_paginated_search_reporting_results_trips_nothing(guard: Guard) -> None:
    out = []
    query = "best independent bookshops open on sunday in central london"
    for page in range(1, 13):
        args = {"query": query, "page": page}
        out.append(await guard.step("s", {"tool": "search", "args": args}))
        out.append(await guard.result("s", {"tool": "search", "output": [f"hit {page}"]}))
    assert seen(out) == [ALLOW] * 24


async def test_verify_after_edit_trips_nothing(guard: Guard) -> None:
    out = []
    for i in range(8):
        out.append(await guard.step("s", {"tool": "edit_file", "args": {
            "path": "app.py", "patch": f"fix attempt {i}: {WORDS[i]}"}}))  # fmt: skip
        out.append(await guard.result("s", {"tool": "edit_file", "output": "ok"}))
        out.append(await guard.step("s", {"tool": "run_tests", "args": {"path": "tests/"}}))
        out.append(await guard.result("s", {"tool": "run_tests", "ok": True,
                                            "output": f"{7 - i} failing"}))  # fmt: skip
    assert {a.reason for a in out} == {"ok"}


async def test_polling_a_job_until_it_finishes_trips_nothing(guard: Guard) -> None:
    out = []
    for pct in range(0, 101, 5):  # 21 polls
        out.append(await guard.step("s", {"tool": "job_status", "args": {"job": "j-1"}}))
        out.append(await guard.result("s", {"tool": "job_status", "output": {"done": pct}}))
    assert seen(out) == [ALLOW] * 42


async def test_parallel_calls_of_one_tool_each_get_the_result_that_names_them(
    guard: Guard,
) -> None:
    # Breaks if a result goes to the newest call of its tool still without
    # one, whatever arguments it names: two jobs polled side by side (A
    # queued, the same answer every time; B progressing), steps first and
    # their answers as they come, had A's answer taken for B's and B's
    # dropped, so the guard saw A B A B with unchanged results and blocked
    # a legitimate wait (tool_cycle).
    out = []
    for turn in range(1, 7):
        for job in "AB":
            out.append(await guard.step("s", {"tool": "job_status", "args": {"job": job}}))
        for job in "AB":
            said = {"job": job, "progress": 0 if job == "A" else 7 * turn}
            out.append(await guard.result("s", {"tool": "job_status", "output": said,
                                                "args": {"job": job}}))  # fmt: skip
    # (A step made while the call before it awaits its answer is compared
    # with no result for it: a period of two is warned, never blocked.)
    assert "block" not in {a.decision for a in out}, seen(out)
    state = await guard.state("s")
    assert state is not None
    results = [c["result"] for c in state["recent_calls"]]
    assert None not in results
    assert len(set(results[0::2])) == 1  # job A: the same answer every time
    assert len(set(results[1::2])) == 6  # job B: a new one every time
    # Without arguments a result still goes to the newest call of its tool
    # without one, and a second result for a call already answered to none.
    await guard.step("t", {"tool": "job_status", "args": {"job": "A"}})
    await guard.step("t", {"tool": "job_status", "args": {"job": "B"}})
    await guard.result("t", {"tool": "job_status", "output": "first"})
    await guard.result("t", {"tool": "job_status", "output": "second"})
    state = await guard.state("t")
    assert state is not None
    first, second = (c["result"] for c in state["recent_calls"])
    assert first is None and second is not None
    # Arguments no call of the tool was made with name no call.
    await guard.result("t", {"tool": "job_status", "output": "x", "args": {"job": "C"}})
    state = await guard.state("t")
    assert state is not None and state["recent_calls"][0]["result"] is None


async def test_a_research_agent_calling_twenty_distinct_tools_trips_nothing(guard: Guard) -> None:
    out = []
    for i, word in enumerate(WORDS[:20]):
        out.append(await guard.step("s", {"tool": f"source_{word}", "args": {"topic": "tides"},
                                          "input_tokens": 1000 + 50 * i}))  # fmt: skip
        out.append(await guard.result("s", {"tool": f"source_{word}", "output": f"notes {i}"}))
    assert seen(out) == [ALLOW] * 40


# -- sessions, profiles, input ----------------------------------------------------


async def test_sessions_are_independent_and_reset_forgets(guard: Guard) -> None:
    for _ in range(2):
        await guard.step("one", {"tool": "x", "args": {}})
    assert (await guard.step("two", {"tool": "x", "args": {}})).decision == "allow"
    state = await guard.state("one")
    assert state is not None and state["steps"] == 2
    assert [e["tool"] for e in state["recent_calls"]] == ["x", "x"]
    assert state["tools"] == {"x": {"calls": 2, "failure_streak": 0, "same_result_streak": 0}}
    await guard.reset("one")
    assert await guard.state("one") is None
    assert (await guard.step("one", {"tool": "x", "args": {}})).decision == "allow"


async def test_a_session_keeps_its_profile(make: Any) -> None:
    guard = make(guard_config("guard: {profiles: {strict: {identical: {warn_at: 1, "
                              "block_at: 2}}}}\n"))  # fmt: skip
    first = await guard.step("s", {"tool": "x", "args": {}}, profile="strict")
    assert (first.decision, first.reason) == ("warn", "identical_call")
    with pytest.raises(ProfileConflict, match="runs under profile 'strict'"):
        await guard.step("s", {"tool": "y", "args": {}})
    with pytest.raises(GuardInputError, match="no profile named 'lax'"):
        await guard.step("t", {"tool": "y", "args": {}}, profile="lax")


async def test_sessions_expire(make: Any, engine_kind: str) -> None:
    guard = make(guard_config("guard: {session_ttl_seconds: 60}\n"))
    await guard.step("s", {"tool": "x", "args": {}})
    if engine_kind == "memory":
        make.clock.now += 61
        assert await guard.state("s") is None
    else:  # Redis keeps time itself: the key carries the TTL
        assert isinstance(guard.engine, RedisEngine)
        ttl = await guard.engine.store.client.pttl(guard.engine.key("s"))
        assert 0 < ttl <= 60_000


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ([], "body: must be a JSON object"),
        ({}, "tool: is required"),
        ({"tool": ""}, "tool: must not be empty"),
        ({"tool": "x", "input_tokens": 1.5}, "input_tokens: must be a whole number"),
        ({"tool": "x", "input_tokens": True}, "input_tokens: must be an integer"),
        ({"tool": "x", "argz": {}}, "argz: unknown field"),
    ],
)
async def test_bad_step_input_names_the_field(guard: Guard, body: Any, problem: str) -> None:
    with pytest.raises(GuardInputError) as err:
        await guard.step("s", body)
    assert str(err.value) == problem


async def test_a_bad_session_id_is_refused(guard: Guard) -> None:
    with pytest.raises(GuardInputError, match="session: use 1-128"):
        await guard.step("has space", {"tool": "x"})


def test_every_reason_has_a_description() -> None:
    assert len(REASONS) == 23 and all(REASONS.values())


async def test_concurrent_steps_for_one_session_allow_exactly_the_ceiling(make: Any) -> None:
    guard = make(guard_config("guard: {profiles: {default: {steps: {max_steps: 10}}}}\n"))
    got = await asyncio.gather(*(guard.step("s", {"tool": f"t{i}", "args": {}}) for i in range(20)))
    assert sorted(a.decision for a in got) == ["allow"] * 10 + ["block"] * 10
    assert {a.reason for a in got if a.decision == "block"} == {"step_limit"}


async def test_a_session_reads_back_as_documented_fields_without_the_agents_words(
    guard: Guard,
) -> None:
    """GET /v1/guard/{session}: readable names, and none of what the agent
    sent (its arguments, outputs and questions) in the answer."""
    secret_words = "zebracode quokkalaunch mooncrater"
    await guard.step("s", {"tool": "search", "args": {"q": secret_words}})
    await guard.result("s", {"tool": "search", "ok": False, "output": secret_words})
    await guard.retry("s", {"task": "fetch", "input": secret_words})
    await guard.handoff("s", {"source": "planner", "target": "coder"})
    await guard.kb_query("s", {"question": secret_words})
    await guard.usage("s", {"cost_usd": 0.25, "tokens": 1200})
    state = await guard.state("s")
    assert state is not None
    assert set(state) == {
        "profile", "created_at", "updated_at", "steps", "blocked", "tools", "recent_calls",
        "identical_run", "retries", "handoffs", "knowledge_topics", "context", "spent",
    }  # fmt: skip
    assert state["tools"]["search"] == {"calls": 1, "failure_streak": 1, "same_result_streak": 1}
    assert state["retries"] == {"fetch": {"in_window": 1}}
    assert state["handoffs"] == {"count": 1, "chain": ["planner", "coder"]}
    assert state["knowledge_topics"] == 1
    assert state["spent"] == {"usd": 0.25, "tokens": 1200}
    assert isinstance(state["created_at"], float) and state["created_at"] > 1e9
    text = json.dumps(state)
    for word in secret_words.split():
        assert word not in text


# -- feed: a batch in one call ------------------------------------------------------


def mixed_run() -> list[tuple[str, dict[str, Any]]]:
    """Steps and results that warn, fail and, at the end, block (identical)."""
    run: list[tuple[str, dict[str, Any]]] = []
    for i in range(3):
        run += [("step", {"tool": "search", "args": {"q": f"tides {i}"}}),
                ("result", {"tool": "search", "output": f"page {i}"})]  # fmt: skip
    run += [("step", {"tool": "deploy", "args": {}}),
            ("result", {"tool": "deploy", "ok": False, "output": "timeout"})]  # fmt: skip
    for _ in range(4):
        run += [("step", {"tool": "status", "args": {"id": 7}}),
                ("result", {"tool": "status", "output": "pending"})]  # fmt: skip
    return run


async def test_feed_answers_as_one_by_one_and_stops_at_the_first_block(guard: Guard) -> None:
    # Breaks if a batch checks differently from the same checks made one at a
    # time (shared findings, one use counter, state saved per check or not at
    # all), or goes on past a block.
    run = mixed_run()
    one_by_one: list[Answer] = []
    for op, body in run:
        check = guard.step if op == "step" else guard.result
        one_by_one.append(await check("alone", body))
        if one_by_one[-1].decision == "block":
            break
    assert one_by_one[-1].decision == "block" and len(one_by_one) < len(run)
    assert "warn" in {a.decision for a in one_by_one}
    batched = await guard.feed("batched", [guard.prepare(op, body) for op, body in run])
    assert [a.as_dict() | {"session": ""} for a in batched] == [
        a.as_dict() | {"session": ""} for a in one_by_one
    ]
    alone, together = await guard.state("alone"), await guard.state("batched")
    taken = [a for (op, _), a in zip(run, one_by_one, strict=False) if op == "step"]
    assert alone is not None and alone["steps"] == len(taken) - 1 == 7  # all but the blocked
    assert together == alone
    assert await guard.feed("batched", []) == []


async def test_feed_with_a_bad_check_saves_nothing(guard: Guard) -> None:
    # Breaks if a batch that errors part way keeps the checks before the error.
    from gateway.guard.service import Prepared

    good = guard.prepare("step", {"tool": "search", "args": {"q": "tides"}})
    with pytest.raises(RuntimeError, match="unknown_op"):
        await guard.feed("s", [good, Prepared("nonsense", {})])
    assert await guard.state("s") is None
    with pytest.raises(GuardInputError, match="tool"):
        guard.prepare("step", {"args": {}})
