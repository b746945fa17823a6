"""The guard's precision: what peers' own suites deliberately allow is never
blocked here, and the loops they catch are caught here too - on memory (lupa)
and on a real Redis. Each scenario is a peer's test in botbouncer's terms
(docs/agent-guard.md, "What counts as progress")."""

# ruff: noqa: F811 - the fixtures imported from test_guard are parameters here
from __future__ import annotations

import json
from typing import Any

from gateway.guard.service import Answer, Guard
from tests.test_guard import REPHRASED, engine_kind, guard, guard_config, make  # noqa: F401

OK_OR_WARN = {"allow", "warn"}
# The step ceilings are budgets, sized per agent (docs/agent-guard.md); the
# scenarios that run past the defaults (50 steps, 25 calls of one tool) lift
# them, so that what is tested is the loop detectors.
ROOMY = "steps: {max_steps: 1000, max_per_tool: 1000}"

PYTEST_FAIL = (
    "============ FAILURES ============\n"
    "____ test_{name} ____\n"
    "    assert parse('{arg}') == {want}\n"
    "E   AssertionError\n"
    "==== {n} failed, {p} passed in 0.{ms}s ===="
)


def decisions(answers: list[Answer]) -> set[str]:
    return {a.decision for a in answers}


async def call(guard: Guard, tool: str, args: Any, output: Any, ok: bool = True,
               session: str = "s") -> list[Answer]:  # fmt: skip
    step = await guard.step(session, {"tool": tool, "args": args})
    result = await guard.result(session, {"tool": tool, "ok": ok, "output": output})
    return [step, result]


# -- 1. fix, then re-test -------------------------------------------------------


async def test_twelve_rounds_of_fix_and_retest_are_never_blocked(guard: Guard) -> None:
    """hermes-agent: run the tests (fail), patch a file (ok), run them again
    (fail, another failure)... twelve rounds."""
    got: list[Answer] = []
    for i in range(12):
        failure = PYTEST_FAIL.format(name=f"case_{i}", arg=f"x{i}", want=i, n=12 - i, p=i,
                                     ms=40 + i)  # fmt: skip
        got += await call(guard, "terminal", {"command": "pytest -q"}, failure, ok=False)
        got += await call(guard, "patch", {"path": "src/parse.py", "diff": f"-a{i}\n+b{i}"},
                          {"success": True})  # fmt: skip
    assert decisions(got) <= OK_OR_WARN, [(a.decision, a.reason) for a in got]


async def test_retests_whose_output_changes_only_in_its_counts_are_progress_after_a_fix(
    guard: Guard,
) -> None:
    """The same test still failing, a few more passing each round: the fix
    between the runs is what changed."""
    got: list[Answer] = []
    for i in range(12):
        summary = f"==== 1 failed, {20 + i} passed in 1.{i}s ===="
        got += await call(guard, "terminal", {"command": "pytest"}, summary, ok=False)
        got += await call(guard, "edit_file", {"path": f"src/m{i % 3}.py", "old": f"v{i}",
                                               "new": f"v{i + 1}"}, "ok")  # fmt: skip
    assert decisions(got) <= OK_OR_WARN, [(a.decision, a.reason) for a in got]


async def test_a_sweep_of_twelve_distinct_failing_commands_is_never_blocked(
    guard: Guard,
) -> None:
    commands = ["ls /opt/app", "cat /etc/app.conf", "which node", "node --version",
                "npm ls", "ls ~/.config/app", "env | grep APP", "systemctl status app",
                "journalctl -u app -n 5", "ps aux | grep app", "ss -ltnp",
                "df -h /var"]  # fmt: skip
    got: list[Answer] = []
    for command in commands:
        got += await call(guard, "terminal", {"command": command},
                          {"exit_code": 1, "stderr": "permission denied"}, ok=False)  # fmt: skip
    assert decisions(got) <= OK_OR_WARN, [(a.decision, a.reason) for a in got]


async def test_the_same_failing_call_with_nothing_changing_is_still_blocked(
    guard: Guard,
) -> None:
    got: list[Answer] = []
    for _ in range(6):
        got += await call(guard, "deploy", {"env": "prod"}, "error: quota exceeded", ok=False)
    assert "block" in decisions(got)
    first = next(i for i, a in enumerate(got) if a.decision == "block")
    assert first <= 2 * 3  # by the third identical failure at the latest


async def test_a_retest_after_a_fix_is_no_part_of_the_failure_streak(guard: Guard) -> None:
    # Breaks if the step check counts a streak that a success has ended: the
    # retest after the fix was blocked (failure_streak) though it is new.
    for seed in range(5):  # a counter: one call up to its numbers, failing alike
        got = await call(guard, "terminal", {"command": "pytest", "seed": seed},
                         f"1 failed in run {seed}", ok=False)  # fmt: skip
    assert (got[1].decision, got[1].reason) == ("block", "failure_streak")
    await call(guard, "edit_file", {"path": "src/parse.py", "old": "a", "new": "b"}, "ok")
    retest = await guard.step("s", {"tool": "terminal", "args": {"command": "pytest", "seed": 9}})
    assert retest.decision == "allow", (retest.decision, retest.reason)
    # without the fix in between, the next call of that shape is still blocked
    for seed in range(5):
        await call(guard, "terminal", {"command": "pytest", "seed": seed},
                   f"1 failed in run {seed}", ok=False, session="t")  # fmt: skip
    again = await guard.step("t", {"tool": "terminal", "args": {"command": "pytest", "seed": 9}})
    assert (again.decision, again.reason) == ("block", "failure_streak")


async def test_a_retry_storm_with_a_new_request_id_each_time_is_a_failure_streak(
    guard: Guard,
) -> None:
    # Breaks if a call's shape keeps its UUIDs: a client that retries with a
    # fresh request id each time, failing alike, was a new call every time,
    # and nothing blocked it before the 26th call.
    got: list[Answer] = []
    for i in range(5):
        request = f"{i:08x}-7a1c-4e2b-9f00-{i * 7919:012x}"
        got += await call(guard, "http_post", {"url": "https://api.example.com/orders",
                                               "request_id": request},
                          "503 Service Unavailable", ok=False)  # fmt: skip
    assert (got[-1].decision, got[-1].reason) == ("block", "failure_streak")


# -- 2. volatile fields in results ---------------------------------------------


async def test_results_differing_only_in_volatile_fields_are_the_same_result(
    guard: Guard,
) -> None:
    """hermes / OpenClaw: an exec loop whose output differs only in its timing,
    pid and counters is a loop."""
    got: list[Answer] = []
    for i in range(6):
        output = {"stdout": "Traceback: KeyError 'user'\n", "exit_code": 1,
                  "duration_seconds": 0.1 + i / 100, "durationMs": 100 + i, "pid": 4000 + i,
                  "execution_count": i + 1, "session_id": f"k-{i}",
                  "timestamp": f"2026-11-23T10:00:0{i}Z"}  # fmt: skip
        got += await call(guard, "execute_code", {"code": "print(users['user'])"}, output)
    assert got[-1].decision == "block" or any(a.decision == "block" for a in got)


async def test_volatile_keys_in_json_held_in_a_nested_string_are_left_out(
    guard: Guard,
) -> None:
    # Breaks if only a whole output held in a string is read as JSON: an MCP
    # CallToolResult reported as it is (its JSON in content[].text) never
    # repeated, its duration and pid changing on every run.
    got: list[Answer] = []
    for i in range(4):
        text = json.dumps({"stdout": "KeyError: 'user'", "duration_ms": 100 + i, "pid": 4000 + i})
        output = {"content": [{"type": "text", "text": text}], "isError": False}
        got += await call(guard, "execute_code", {"code": "print(users['user'])"}, output)
    assert (got[-2].decision, got[-2].reason) == ("block", "identical_call")


async def test_a_result_of_brackets_nested_past_any_limit_is_a_result(guard: Guard) -> None:
    # Breaks if a string that looks like JSON is parsed by json.loads: 30,000
    # brackets raised RecursionError (a 500) and the result was lost.
    deep = "[" * 30_000 + "]" * 30_000
    for output in (deep, {"text": deep}):
        got = await call(guard, "read_file", {"path": "deep.json"}, output)
        assert decisions(got) <= OK_OR_WARN


async def test_volatile_text_in_a_plain_output_is_ignored_too(guard: Guard) -> None:
    got: list[Answer] = []
    for i in range(6):
        output = (f"[2026-11-23 10:00:0{i}] pid={4000 + i} running job\n"
                  f"KeyError: 'user'\nfinished in {0.2 + i / 10:.2f}s")  # fmt: skip
        got += await call(guard, "exec", {"cmd": "python job.py"}, output)
    assert "block" in decisions(got)


async def test_volatile_keys_are_configurable_per_profile(make: Any) -> None:
    guard = make(guard_config(
        "guard: {profiles: {default: {results: {volatile_keys: [seq]}}}}\n"))  # fmt: skip
    got: list[Answer] = []
    for i in range(6):
        got += await call(guard, "exec", {"cmd": "x"}, {"out": "same", "seq": i})
    assert "block" in decisions(got)
    # and the default keys are no longer dropped: a changing duration is progress
    got = []
    for i in range(6):
        got += await call(guard, "exec", {"cmd": "x"}, {"out": "same", "duration_ms": i},
                          session="t")  # fmt: skip
    assert "block" not in decisions(got)


# -- 3. pollers ---------------------------------------------------------------


POLL = "guard: {profiles: {default: {polling: {tools: [job_status]}}}}\n"


async def test_a_poller_waiting_on_a_job_is_not_blocked(make: Any) -> None:
    guard = make(guard_config(POLL))
    got: list[Answer] = []
    for _ in range(20):
        got += await call(guard, "job_status", {"job": "j-1"}, {"state": "running"})
    got += await call(guard, "job_status", {"job": "j-1"}, {"state": "done"})
    assert decisions(got) <= OK_OR_WARN, [(a.decision, a.reason) for a in got]


async def test_a_poller_is_stopped_past_its_generous_bound(make: Any) -> None:
    guard = make(
        guard_config(
            "guard: {profiles: {default: {polling: {tools: [job_status], max_unchanged: 10}}}}\n"
        )
    )
    got: list[Answer] = []
    for _ in range(12):
        got += await call(guard, "job_status", {"job": "j-1"}, {"state": "running"})
    blocked = [a for a in got if a.decision == "block"]
    assert blocked and blocked[0].reason == "poll_limit"


async def test_a_poller_is_stopped_past_its_time_budget(make: Any) -> None:
    guard = make(
        guard_config(
            "guard: {profiles: {default: {polling: {tools: [job_status], max_seconds: 60}}}}\n"
        )
    )
    got: list[Answer] = []
    for _ in range(5):
        got += await call(guard, "job_status", {"job": "j-1"}, {"state": "running"})
        make.clock.now += 20
    blocked = [a for a in got if a.decision == "block"]
    assert blocked and blocked[0].reason == "poll_limit"


async def test_polls_still_count_against_the_ceilings(make: Any) -> None:
    guard = make(guard_config(
        "guard: {profiles: {default: {polling: {tools: [job_status]},"
        " steps: {max_per_tool: 5}}}}\n"))  # fmt: skip
    got: list[Answer] = []
    for _ in range(6):
        got += await call(guard, "job_status", {"job": "j-1"}, {"state": "running"})
    assert got[-2].reason == "tool_call_limit"


async def test_polling_does_not_crowd_out_the_other_tools(make: Any) -> None:
    """Polls between an agent's other calls make its history look repetitive;
    they are left out of the exploration and cycle checks."""
    guard = make(guard_config(POLL))
    got: list[Answer] = []
    for i in range(10):
        got += await call(guard, "job_status", {"job": "j-1"}, {"state": "running"})
        got += await call(guard, "job_status", {"job": "j-1"}, {"state": "running"})
        got += await call(guard, "read_log", {"line": i}, f"line {i}")
    assert decisions(got) <= OK_OR_WARN, [(a.decision, a.reason) for a in got]


# -- 4. the same content to different targets ----------------------------------

TEMPLATE = ("# Service\n\nThis service is owned by the platform team. Deploy with make "
            "deploy; page the on-call engineer for incidents. See the runbook.\n")  # fmt: skip


async def test_one_template_written_to_thirty_files_is_not_fixation(make: Any) -> None:
    guard = make(guard_config(f"guard: {{profiles: {{default: {{{ROOMY}}}}}}}\n"))
    got: list[Answer] = []
    for i in range(30):
        got += await call(guard, "write_file", {"path": f"services/s{i}/README.md",
                                                "content": TEMPLATE}, "write complete")  # fmt: skip
    assert decisions(got) <= OK_OR_WARN, [(a.decision, a.reason) for a in got]
    assert "input_fixation" not in {a.reason for a in got}


FILE = "def parse(text):\n" + "".join(f"    step{j} = handle(text, {j})\n" for j in range(40))


async def test_rewriting_one_file_between_test_runs_is_not_fixation(guard: Guard) -> None:
    # Breaks if only the tool's own result restarts its fixation window: the
    # fourth rewrite of a file was blocked though each test run between the
    # rewrites answered something new.
    got: list[Answer] = []
    for i in range(6):
        got += await call(guard, "write_file", {"path": "src/parse.py",
                                                "content": FILE + f"    return step{i}\n"},
                          "File written successfully")  # fmt: skip
        failure = PYTEST_FAIL.format(name=f"case_{i}", arg=f"x{i}", want=i, n=6 - i, p=i, ms=40)
        got += await call(guard, "terminal", {"command": "pytest -q"}, failure, ok=False)
    assert "input_fixation" not in {a.reason for a in got}
    assert decisions(got) <= OK_OR_WARN, [(a.decision, a.reason) for a in got]
    # rewritten with nothing new in between, it is still fixation
    got = []
    for i in range(4):
        got += await call(guard, "write_file", {"path": "src/parse.py",
                                                "content": FILE + f"    return step{i}\n"},
                          "File written successfully", session="t")  # fmt: skip
        got += await call(guard, "terminal", {"command": "pytest -q"}, "1 failed",
                          ok=False, session="t")  # fmt: skip
    assert ("block", "input_fixation") in [(a.decision, a.reason) for a in got]


async def test_rephrasing_one_query_is_still_fixation(guard: Guard) -> None:
    got = []
    for q in REPHRASED:
        got.append(await guard.step("s", {"tool": "web_search", "args": {"query": q}}))
    assert got[-1].reason == "input_fixation"


# -- 6. long narrow runs whose results change ----------------------------------


async def test_thirty_polls_with_changing_output_and_no_other_tool_warn(make: Any) -> None:
    guard = make(guard_config(f"guard: {{profiles: {{default: {{{ROOMY}}}}}}}\n"))
    got: list[Answer] = []
    for i in range(30):
        got += await call(guard, "tail_log", {"file": "app.log"}, f"line {i}")
    assert "block" not in decisions(got)
    assert got[-2].decision == "warn" and got[-2].reason == "narrow_run"


async def test_a_ping_pong_whose_results_progress_warns_after_thirty(guard: Guard) -> None:
    got: list[Answer] = []
    for i in range(15):
        got += await call(guard, "ask_a", {"q": "next"}, f"a{i}")
        got += await call(guard, "ask_b", {"q": "next"}, f"b{i}")
    assert "block" not in decisions(got)
    assert got[-2].reason == "narrow_run"
    # nothing of the kind before the thirtieth call
    assert "narrow_run" not in {a.reason for a in got[: 2 * 29]}


# -- 7. the same failure after calls in between --------------------------------


async def test_an_identical_failure_after_two_other_calls_is_blocked_at_the_third(
    guard: Guard,
) -> None:
    """hermes: fail, fail, x, y, fail - the third identical failure blocks."""
    got: list[Answer] = []
    got += await call(guard, "fetch", {"url": "https://x.test/a"}, "HTTP 500", ok=False)
    got += await call(guard, "fetch", {"url": "https://x.test/a"}, "HTTP 500", ok=False)
    got += await call(guard, "read", {"file": "notes.md"}, "notes")
    got += await call(guard, "plan", {"goal": "retry later"}, "ok")
    third = await call(guard, "fetch", {"url": "https://x.test/a"}, "HTTP 500", ok=False)
    assert (third[1].decision, third[1].reason) == ("block", "repeated_failure")
    again = await guard.step("s", {"tool": "fetch", "args": {"url": "https://x.test/a"}})
    assert (again.decision, again.reason) == ("block", "repeated_failure")
    other = await guard.step("s", {"tool": "fetch", "args": {"url": "https://x.test/b"}})
    assert other.decision in OK_OR_WARN
