"""The agent guard's HTTP API against what a reviewer found it broke: a
tool's large output, session names a path cannot serve, the state view
giving back what the agent sent, knowledge-base questions that differ only
in a number, and costs too small to round. Each test fails without the fix
it names."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.guard import normalize
from gateway.guard.client import AsyncGuardClient
from gateway.guard.engine import MemoryEngine
from gateway.guard.profiles import GuardConfig
from gateway.guard.requests import GuardInputError
from gateway.guard.service import Guard
from tests.test_guard_client import async_url  # noqa: F401  (a fixture)


async def test_a_tool_s_large_output_is_a_result_like_any_other(async_url: str) -> None:  # noqa: F811
    # Breaks if the guard's routes keep the daemon's 64 KiB body limit: a
    # 70 KB file read or written made the client raise GuardError (a 413),
    # and an agent catching GuardBlocked only crashed. Past the guard's own
    # 8 MiB, the client fails open: the guard's limit is not the agent's fault.
    text = "line of a large file\n" * 3_500  # 73 KB
    async with AsyncGuardClient(async_url, session="big-1") as guard:
        step = await guard.step("write_file", {"path": "a.txt", "text": text})
        assert step.decision == "allow"
        assert (await guard.result("write_file", True, text)).decision == "allow"
        too_large = {"error": "request body larger than 8388608 bytes"}
        assert guard._answer(413, too_large).decision == "allow"  # failed open: unguarded


@pytest.mark.parametrize("name", ["abc\n", "openapi.json", ".", ".."])
async def test_session_names_a_path_cannot_serve_are_refused(name: str) -> None:
    # Breaks if `$` lets a final newline by (a session "abc\n" apart from
    # "abc") or a name is taken that its own state route cannot reach (the
    # guard's OpenAPI document answers GET /v1/guard/openapi.json; clients
    # resolve `.` and `..` away).
    guard = Guard(GuardConfig(), MemoryEngine())
    with pytest.raises(GuardInputError):
        await guard.step(name, {"tool": "t", "args": {}})


async def test_the_state_view_gives_no_hash_of_what_the_agent_sent() -> None:
    # Breaks if recent_calls shows the detectors' own hash of the tool and its
    # arguments: a small argument (a PIN) was found by hashing all 10,000.
    guard = Guard(GuardConfig(), MemoryEngine())
    for pin in ("4821", "4821", "1111"):
        await guard.step("s", {"tool": "unlock", "args": {"pin": pin}})
        await guard.result("s", {"tool": "unlock", "ok": False, "output": "wrong pin"})
    state = await guard.state("s")
    assert state is not None
    calls = [c["call"] for c in state["recent_calls"]]
    assert calls == ["c1", "c1", "c2"]  # equal calls still show as equal
    assert normalize.signature("unlock", {"pin": "4821"}) not in str(state)
    assert isinstance(state["spent"]["tokens"], int)


@pytest.mark.parametrize(
    "questions",
    [
        ["status of order 1", "status of order 2", "status of order 3"],
        ["Refund policy for plan A?", "Refund policy for plan B?", "Refund policy for plan C?"],
        ["Who are you?", "What is this?", "How do I?"],
    ],
)
async def test_questions_that_differ_in_a_number_or_a_letter_are_other_topics(
    questions: list[str],
) -> None:
    # Breaks if a topic drops one-character words (digits, "plan B") or a
    # question of stop words alone is the empty topic every such question
    # shares: three different questions were a re-ask, blocked.
    guard = Guard(GuardConfig(), MemoryEngine())
    answers = [await guard.kb_query("kb", {"question": q}) for q in questions]
    assert [a.decision for a in answers] == ["allow"] * 3


async def test_a_cost_under_half_a_micro_dollar_still_counts() -> None:
    # Breaks if a cost is rounded to the nearest micro-dollar: 300 answers
    # at $0.0000004 counted nothing against a $0.0001 budget.
    guard = Guard(GuardConfig(), MemoryEngine())
    body: dict[str, Any] = {"cost_usd": 0.0000004, "budget_usd": 0.0001}
    answers = [await guard.usage("cheap", body) for _ in range(300)]
    assert answers[-1].reason == "budget_exhausted"
    exact = await guard.usage("exact", {"cost_usd": 0.15})
    assert exact.budget["usd_spent"] == 0.15  # float noise is not a micro-dollar more


async def test_a_count_written_as_a_whole_float_is_that_count() -> None:
    # Breaks if `tokens: 1200.0` (a float sum, or a language without
    # integers, writes it) is a 400: the agent's usage was not counted.
    # 1.5 tokens, or a count in a string, is still refused.
    guard = Guard(GuardConfig(), MemoryEngine())
    answer = await guard.usage("floaty", {"tokens": 1200.0, "budget_tokens": 2000.0})
    assert answer.budget["tokens_spent"] == 1200
    await guard.step("floaty", {"tool": "t", "input_tokens": 300.0})
    for wrong in ({"tokens": 1.5}, {"tokens": "12"}, {"tokens": True}):
        with pytest.raises(GuardInputError, match="tokens"):
            await guard.usage("floaty", wrong)
