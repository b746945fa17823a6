"""The agent guard: checks an agent framework calls before each step, and
reports to after (docs/agent-guard.md).

Requests are validated (gateway/guard/requests.py: a 400 names the field),
normalised into the strings the detectors compare (gateway/guard/normalize.py), and passed
with the session's profile to one atomic script call (gateway/guard/engine.py).
Every answer is `allow`, `warn` or `block`, a stable reason code, a message
an agent can show its model, the evidence, and the budget left.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, Field

from gateway.errors import BotbouncerError
from gateway.guard import normalize
from gateway.guard.engine import Engine
from gateway.guard.profiles import GuardConfig, GuardProfile
from gateway.guard.requests import (
    GuardInputError,
    HandoffBody,
    KbQueryBody,
    ResultBody,
    RetryBody,
    StepBody,
    UsageBody,
    check_session,
    parse_body,
)

MICRO = 1_000_000  # dollars and confidences travel as integer millionths

# Every reason code, with what it means (docs/agent-guard.md lists them too).
REASONS: dict[str, str] = {
    "ok": "nothing repeats; go on",
    "identical_call": "the same tool with the same arguments (and result) in a row",
    "tool_cycle": "a sequence of calls repeating (A B A B, A B C A B C)",
    "input_fixation": "the tool's last calls rephrase one input without progress",
    "low_exploration": "few distinct calls among the recent ones",
    "failure_streak": "one tool failing again and again, the same call the same way, nothing "
    "succeeding in between",
    "repeated_failure": "the same call failing the same way again, whatever came between",
    "no_progress": "one tool returning the same result again and again",
    "poll_limit": "a polling tool answering the same for too many polls or too long",
    "narrow_run": "a long run of calls using only one or two distinct calls",
    "subagent_call_limit": "a sub-agent called more often than allowed",
    "subagent_repeated_response": "a sub-agent answering the same thing twice in a row",
    "input_missing_prerequisite_signal": "a retry whose input lacks what the task needs",
    "retry_limit": "a task retried more often than allowed in the window",
    "handoff_limit": "more handoffs than allowed in the session",
    "handoff_revisit": "a handoff back to an agent visited too often",
    "kb_requery": "the same question asked of the knowledge base again",
    "context_growth": "the context grew sharply several steps in a row",
    "token_cap": "the session's total input tokens passed the cap",
    "budget_warning": "80 % or more of the session's budget is spent",
    "budget_exhausted": "the session's budget is spent",
    "step_limit": "the session's step ceiling is reached",
    "tool_call_limit": "one tool's call ceiling is reached",
}


class ProfileConflict(BotbouncerError):
    """The session runs under another profile (answered 409)."""

    status = 409


# -- answers ------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    session: str
    decision: str  # allow | warn | block
    reason: str
    message: str
    evidence: dict[str, Any]
    also: list[str] = field(default_factory=list)
    budget: dict[str, Any] = field(default_factory=dict)
    steps: dict[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> int:
        return 429 if self.decision == "block" else 200

    def as_dict(self) -> dict[str, Any]:
        return {
            "session": self.session,
            "decision": self.decision,
            "reason": self.reason,
            "message": self.message,
            "evidence": self.evidence,
            "also": self.also,
            "budget": self.budget,
            "steps": self.steps,
        }


_DECODER = json.JSONDecoder()


def _read(text: str) -> Any:
    """JSON the guard's script wrote (enc.lua: compact, one value): "{}" and
    "[]", most of it, without a parse, the rest without json.loads's checks
    for what it never writes (leading space, a str or bytes argument)."""
    if text == "{}":
        return {}
    if text == "[]":
        return []
    value, end = _DECODER.raw_decode(text)
    if end != len(text):
        raise ValueError(f"guard script: more than one JSON value in {text[:60]!r}")
    return value


def _micro_up(usd: float) -> int:
    """Dollars in micro-dollars, up to the next one: 0.15 is 150,000 (its
    float's noise rounded away first), 0.0000004 is 1."""
    return math.ceil(round(usd * MICRO, 6))


def _money(micro: int) -> float:
    return round(micro / MICRO, 6)


def _budget(meta: dict[str, Any]) -> dict[str, Any]:
    busd, btok = int(meta.get("busd", 0)), int(meta.get("btok", 0))
    usd, tok = int(meta.get("usd", 0)), int(meta.get("tok", 0))
    return {
        "usd_spent": _money(usd),
        "usd_limit": _money(busd) if busd else None,
        "usd_remaining": _money(max(0, busd - usd)) if busd else None,
        "tokens_spent": tok,
        "tokens_limit": btok or None,
        "tokens_remaining": max(0, btok - tok) if btok else None,
    }


def message(reason: str, ev: dict[str, Any], budget: dict[str, Any]) -> str:
    """What an agent can show its model: what repeated, and what to do instead."""
    tool = ev.get("tool", "")
    if reason == "ok":
        return "Go ahead."
    if reason == "identical_call":
        return (f"You called {tool} with the same arguments {ev['repeats']} times in a row "
                "and got nothing new. Do not call it again with these arguments: change the "
                "arguments, use another tool, or answer with what you have.")  # fmt: skip
    if reason == "tool_cycle":
        pattern = " → ".join(ev["pattern"])
        return (f"You are going round in a cycle ({pattern}), repeated "
                f"{ev['repetitions']} times with the same inputs. Break it: try something "
                "different or answer with what you have.")  # fmt: skip
    if reason == "input_fixation":
        return (f"Your last {ev['calls']} calls to {tool} ask nearly the same thing "
                f"(similarity {ev['similarity']:.2f}) and nothing changed. Rewording will not "
                "help: use another source or tool, or say what you could not find.")  # fmt: skip
    if reason == "low_exploration":
        return (f"Only {ev['unique']} of your last {ev['calls']} calls were different. You "
                "are repeating yourself: stop and answer, or try a new approach.")  # fmt: skip
    if reason == "failure_streak":
        return (f"{tool} failed {ev['failures']} times in a row the same way, with nothing "
                "else succeeding in between. Stop calling it: change what you do, use another "
                "tool or report the failure.")  # fmt: skip
    if reason == "repeated_failure":
        return (f"This call to {tool} has failed the same way {ev['failures']} times. Calling "
                "it again will fail again: change the arguments, fix the cause first, or "
                "report the failure.")  # fmt: skip
    if reason == "poll_limit":
        return (f"{tool} has answered the same {ev['unchanged']} times in a row "
                f"({ev['waited_seconds']} s). Stop waiting: report that it has not finished, "
                "or check why it is stuck.")  # fmt: skip
    if reason == "narrow_run":
        tools = ", ".join(ev["tools"])
        return (f"Your last {ev['calls']} calls were only {ev['distinct']} distinct ones "
                f"({tools}). Make sure this is getting somewhere; if not, stop and answer "
                "with what you have.")  # fmt: skip
    if reason == "no_progress":
        return (f"{tool} returned the same result {ev['same_results']} times in a row. "
                "Calling it again will not change it: act on the result or move on.")  # fmt: skip
    if reason == "subagent_call_limit":
        return (f"You delegated to {tool} {ev['calls']} times already (at most "
                f"{ev['max']}). Do the rest yourself or answer with what you have.")  # fmt: skip
    if reason == "subagent_repeated_response":
        return (f"{tool} answered the same thing twice in a row (similarity "
                f"{ev['similarity']:.2f}). Asking again will not help: use its answer or "
                "do it another way.")  # fmt: skip
    if reason == "input_missing_prerequisite_signal":
        return (f"Retrying {ev['task']} cannot succeed: the input does not contain what the "
                "task needs. Ask the user for the missing information instead.")  # fmt: skip
    if reason == "retry_limit":
        return (f"{ev['task']} was retried {ev['retries']} times in the last "
                f"{ev['window_seconds']:g} s (at most {ev['max']}). Stop retrying: report the "
                "error or ask for help.")  # fmt: skip
    if reason == "handoff_limit":
        return (f"This conversation was handed off {ev['handoffs']} times "
                f"({' → '.join(ev['chain'])}). Stop handing it off: answer it or escalate "
                "to a person.")  # fmt: skip
    if reason == "handoff_revisit":
        return (f"Handing off to {ev['target']} again would be visit {ev['visits']} "
                f"(at most {ev['max']}): {' → '.join(ev['chain'])}. The agents are passing "
                "it around: answer it or escalate to a person.")  # fmt: skip
    if reason == "kb_requery":
        best = ev.get("best_confidence")
        seen = f"; the best confidence so far was {best:.2f}" if best is not None else ""
        return (f"This question was already asked of the knowledge base {ev['queries']} "
                f"times in the last {ev['window_seconds']:g} s{seen}. The documents do not "
                "answer it better: say what is known, or hand it to a person.")  # fmt: skip
    if reason == "context_growth":
        sizes = ", ".join(str(s) for s in ev["sizes"])
        return (f"Your context grew sharply {ev['growth_steps']} steps in a row ({sizes} "
                "tokens). Summarise or drop old context before going on.")  # fmt: skip
    if reason == "token_cap":
        return (f"This session has sent {ev['total_tokens']} input tokens, over its cap of "
                f"{ev['max']}. Stop here and answer with what you have.")  # fmt: skip
    if reason in ("budget_warning", "budget_exhausted"):
        left = []
        if budget.get("usd_remaining") is not None:
            left.append(f"${budget['usd_remaining']:.4f}")
        if budget.get("tokens_remaining") is not None:
            left.append(f"{budget['tokens_remaining']} tokens")
        rest = " and ".join(left) or "nothing"
        if reason == "budget_exhausted":
            return "The session's budget is spent. Stop and answer with what you have."
        return (f"{ev['percent']:g} % of the session's budget is spent; {rest} left. "
                "Finish up.")  # fmt: skip
    if reason == "step_limit":
        return (f"This session has taken {ev['steps']} steps, its ceiling. Stop and answer "
                "with what you have.")  # fmt: skip
    if reason == "tool_call_limit":
        return (f"{tool} has been called {ev['calls']} times in this session, its ceiling. "
                "Use what it returned or another tool.")  # fmt: skip
    return REASONS.get(reason, reason)


# -- the guard ------------------------------------------------------------------


def limits_of(profile: GuardProfile, ttl_seconds: int) -> str:
    """The profile as the script reads it: flat, integers where stored."""
    p = profile
    return json.dumps({
        "ident_warn": p.identical.warn_at, "ident_block": p.identical.block_at,
        "cycle_min": p.cycle.min_period, "cycle_max": p.cycle.max_period,
        "history": p.cycle.history, "cycle_warn": p.cycle.warn_at,
        "cycle_block": p.cycle.block_at,
        "fix_window": p.fixation.window, "fix_similarity": p.fixation.similarity,
        "explore_min_calls": p.exploration.min_calls,
        "explore_min_ratio": p.exploration.min_ratio,
        "fail_warn": p.failures.warn_at, "fail_block": p.failures.block_at,
        "rf_warn": p.repeated_failure.warn_at, "rf_block": p.repeated_failure.block_at,
        "poll_max": p.polling.max_unchanged,
        "poll_ms": round(p.polling.max_seconds * 1000),
        "narrow_calls": p.narrow_run.calls, "narrow_distinct": p.narrow_run.max_distinct,
        "same_result_warn": p.no_progress_at,
        "sub_max_calls": p.subagents.max_calls, "sub_similarity": p.subagents.similarity,
        "retry_max": p.retry.max_retries,
        "retry_window_ms": round(p.retry.window_seconds * 1000),
        "handoff_max": p.handoff.max_handoffs, "handoff_visits": p.handoff.max_visits,
        "kb_max": p.knowledge.max_queries,
        "kb_window_ms": round(p.knowledge.window_seconds * 1000),
        "drift_growth": round(p.context.growth * 100), "drift_steps": p.context.growth_steps,
        "max_total_tokens": p.context.max_total_tokens or 0,
        "budget_usd": round((p.budget.usd or 0) * MICRO), "budget_tokens": p.budget.tokens or 0,
        "budget_warn": p.budget.warn_at,
        "max_steps": p.steps.max_steps, "max_per_tool": p.steps.max_per_tool,
        "max_tools": p.session.max_tools, "max_tasks": p.session.max_tasks,
        "max_topics": p.session.max_topics, "max_chain": p.session.max_chain,
        "ttl_ms": ttl_seconds * 1000,
    }, sort_keys=True)  # fmt: skip


@dataclass(frozen=True)
class Prepared:
    """A step or a result ready for Guard.feed."""

    op: str
    payload: dict[str, Any]


class Guard:
    """`clock` (seconds) injects time for tests; by default the store's own."""

    def __init__(
        self, config: GuardConfig, engine: Engine, clock: Callable[[], float] | None = None
    ) -> None:
        self.engine = engine
        self.clock = clock
        # Told every answer that is not allow (gateway/alerts.py); must not await.
        self.observer: Callable[[str, Answer], None] | None = None
        self.configure(config)

    def configure(self, config: GuardConfig) -> None:
        """New profiles (SIGHUP) apply from the next check."""
        self.config = config
        self.engine.limit_sessions(config.max_sessions)
        self._limits = {
            name: limits_of(p, config.session_ttl_seconds) for name, p in config.profiles.items()
        }

    def profile(self, name: str | None) -> tuple[str, GuardProfile]:
        name = name or "default"
        found = self.config.profiles.get(name)
        if found is None:
            known = ", ".join(sorted(self.config.profiles))
            raise GuardInputError(f"profile: no profile named {name!r} (profiles: {known})")
        return name, found

    async def _check(
        self, session: str, profile: str | None, op: str, payload: dict[str, Any]
    ) -> Answer:
        return (await self._run(session, profile, op, payload))[0]

    async def _run(
        self, session: str, profile: str | None, op: str, payload: dict[str, Any] | list[Any]
    ) -> list[Answer]:
        """One call to the engine: one check, or a batch of them."""
        check_session(session)
        name, _ = self.profile(profile)
        now_ms = None if self.clock is None else round(self.clock() * 1000)
        raw = await self.engine.run(session, op, self._limits[name], payload, name, now_ms)
        return [self._answer(session, raw[i : i + 5]) for i in range(0, len(raw), 5)]

    def _answer(self, session: str, raw: list[str]) -> Answer:
        decision, reason, evidence, meta, also = raw
        ev = _read(evidence)
        if decision == "error":
            if reason == "profile_mismatch":
                raise ProfileConflict(
                    f"session {session!r} runs under profile {ev.get('profile')!r}; pass "
                    f"?profile={ev.get('profile')} or DELETE the session to start over"
                )
            raise RuntimeError(f"guard script: {reason} {ev}")  # a bug, not bad input
        info = _read(meta)
        if "best_confidence" in ev:
            best = ev["best_confidence"]
            ev["best_confidence"] = None if best < 0 else round(best / MICRO, 6)
        budget = _budget(info)
        steps = {"used": info.get("steps", 0), "max": info.get("max_steps")}
        answer = Answer(
            session=session,
            decision=decision,
            reason=reason,
            message=message(reason, ev, budget),
            evidence=ev,
            also=_read(also),
            budget=budget,
            steps=steps,
        )
        if self.observer is not None and decision != "allow":
            self.observer(session, answer)
        return answer

    def prepare(self, op: str, body: Any, profile: str | None = None) -> Prepared:
        """A step or a result made ready for `feed` (GuardInputError when the
        guard cannot take it, as `step` and `result` would say)."""
        if op == "step":
            return Prepared(op, self._step(body, profile))
        if op == "result":
            return Prepared(op, self._result(body, profile))
        raise ValueError(f"prepare: {op!r} is neither step nor result")

    async def feed(
        self, session: str, checks: list[Prepared], profile: str | None = None
    ) -> list[Answer]:
        """Steps and results checked in order, as `step` and `result` would
        check them one by one, in one call to the store (one Redis round
        trip), until one is blocked: the answers of those checked."""
        if not checks:
            return []
        return await self._run(session, profile, "batch", [[c.op, c.payload] for c in checks])

    async def step(self, session: str, body: Any, profile: str | None = None) -> Answer:
        return await self._check(session, profile, "step", self._step(body, profile))

    def _step(self, body: Any, profile: str | None) -> dict[str, Any]:
        req = parse_body(StepBody, body)
        _, p = self.profile(profile)
        sig, ash = normalize.call_hashes(req.tool, req.args)
        payload: dict[str, Any] = {
            "tool": req.tool,
            "sig": sig,
            "ash": ash,
            "tgt": normalize.target(req.args, p.fixation.target_keys),
            "toks": normalize.tokens(req.args, p.session.max_tokens),
            "exempt": req.tool in p.exempt_tools,
            "sub": req.tool in p.subagents.tools,
            "poll": req.tool in p.polling.tools,
        }
        if req.input_tokens is not None:
            payload["itok"] = req.input_tokens
        return payload

    async def result(self, session: str, body: Any, profile: str | None = None) -> Answer:
        return await self._check(session, profile, "result", self._result(body, profile))

    def _result(self, body: Any, profile: str | None) -> dict[str, Any]:
        req = parse_body(ResultBody, body)
        _, p = self.profile(profile)
        sub = req.tool in p.subagents.tools
        # compared without what changes on every run (timings, pids, ...)
        rh, rsh = normalize.value_hashes(normalize.steady(req.output, p.results.volatile_keys))
        payload: dict[str, Any] = {
            "tool": req.tool,
            "ok": req.ok,
            "rh": rh,
            "rsh": rsh,
            "exempt": req.tool in p.exempt_tools,
            "poll": req.tool in p.polling.tools,
            "sub": sub,
            "rtoks": normalize.tokens(req.output, p.session.max_tokens) if sub else "",
            "ack": req.ok and normalize.acknowledges(req.output),
        }
        if req.args is not None:  # the call it answers, by the step's own hashes
            payload["sig"], payload["ash"] = normalize.call_hashes(req.tool, req.args)
        return payload

    async def retry(self, session: str, body: Any, profile: str | None = None) -> Answer:
        req = parse_body(RetryBody, body)
        _, p = self.profile(profile)
        pattern = p.retry.prechecks.get(req.task)
        failed = pattern is not None and re.search(pattern, req.input) is None
        return await self._check(
            session, profile, "retry", {"task": req.task, "precheck_failed": failed}
        )

    async def handoff(self, session: str, body: Any, profile: str | None = None) -> Answer:
        req = parse_body(HandoffBody, body)
        payload = {"source": req.source, "target": req.target}
        return await self._check(session, profile, "handoff", payload)

    async def kb_query(self, session: str, body: Any, profile: str | None = None) -> Answer:
        req = parse_body(KbQueryBody, body)
        payload: dict[str, Any] = {"topic": normalize.topic(req.question)}
        if req.confidence is not None:
            payload["conf"] = round(req.confidence * MICRO)
        return await self._check(session, profile, "kb", payload)

    async def usage(self, session: str, body: Any, profile: str | None = None) -> Answer:
        req = parse_body(UsageBody, body)
        # Up to the next micro-dollar: rounded to the nearest, a cost under half
        # of one would count nothing however often it was spent.
        payload: dict[str, Any] = {"usd": _micro_up(req.cost_usd), "tok": req.tokens}
        if req.budget_usd is not None:
            payload["busd"] = round(req.budget_usd * MICRO)
        if req.budget_tokens is not None:
            payload["btok"] = req.budget_tokens
        return await self._check(session, profile, "usage", payload)

    async def state(self, session: str) -> dict[str, Any] | None:
        """The session as a person reads it (`view`), or None when there is none."""
        check_session(session)
        raw = await self.engine.run(session, "state", "{}", {}, "", None)
        state = json.loads(raw[2])
        return view(state) if state else None

    async def reset(self, session: str) -> None:
        check_session(session)
        await self.engine.run(session, "reset", "{}", {}, "", None)


class ToolView(BaseModel):
    calls: int = Field(description="calls of this tool in the session")
    failure_streak: int = Field(description="failed results in a row")
    same_result_streak: int = Field(description="results unchanged in a row")


class CallView(BaseModel):
    tool: str | None
    call: str | None = Field(
        description="the call as a label of this view (c1, c2, ...): equal labels, equal "
        "calls (the tool and its normalised arguments)"
    )
    result: str | None = Field(
        description="its result as a label of this view (r1, r2, ...): equal labels, equal "
        "results; null before one is reported"
    )


class SpentView(BaseModel):
    usd: float
    tokens: int


class SessionView(BaseModel):
    """GET /v1/guard/{session}: what the detectors hold, by documented names.
    What the agent sent is not repeated: calls and results appear as labels
    of this view (equal labels where the detectors' hashes are equal; a hash
    of a small argument, a PIN, could be reversed by trying them all),
    knowledge-base questions only as a count."""

    profile: str | None
    created_at: float | None = Field(description="Unix time, seconds")
    updated_at: float | None = Field(description="Unix time, seconds")
    steps: int
    blocked: int = Field(description="checks answered block")
    tools: dict[str, ToolView] = Field(description="the most recently used tools")
    recent_calls: list[CallView] = Field(description="oldest first")
    identical_run: int = Field(description="the newest call repeated this many times in a row")
    retries: dict[str, dict[str, int]] = Field(
        description="per task: `in_window`, its retries within the retry window"
    )
    handoffs: dict[str, Any] = Field(description="`count`, and the `chain` of agents, oldest first")
    knowledge_topics: int
    context: dict[str, int] = Field(description="`total_tokens`, `growth_streak`")
    spent: SpentView


def _ms(value: Any) -> float | None:
    return value / 1000 if isinstance(value, int | float) else None


def _count(value: Any) -> int:
    return int(value) if isinstance(value, int | float) else 0


class _Labels:
    """A label per distinct hash, in order of first appearance."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.given: dict[str, str] = {}

    def of(self, digest: Any) -> str | None:
        if not isinstance(digest, str):
            return None
        return self.given.setdefault(digest, f"{self.prefix}{len(self.given) + 1}")


def view(state: dict[str, Any]) -> dict[str, Any]:
    """The stored state (compact keys the script keeps small) as a SessionView."""
    calls, results = _Labels("c"), _Labels("r")
    tools = state.get("tools") or {}
    run = state.get("run") or {}
    cost = state.get("cost") or {}
    hand = state.get("hand") or {}
    ctx = state.get("ctx") or {}
    retry = state.get("retry") or {}
    return SessionView(
        profile=state.get("profile"),
        created_at=_ms(state.get("created")),
        updated_at=_ms(state.get("updated")),
        steps=_count(state.get("steps")),
        blocked=_count(state.get("blocked")),
        tools={
            name: ToolView(
                calls=_count(t.get("n")),
                failure_streak=_count(t.get("fail")),
                same_result_streak=_count(t.get("same")),
            )
            for name, t in sorted(tools.items())
            if isinstance(t, dict)
        },
        recent_calls=[
            CallView(tool=e.get("t"), call=calls.of(e.get("s")), result=results.of(e.get("r")))
            for e in state.get("hist") or []
            if isinstance(e, dict)
        ],
        identical_run=_count(run.get("n")),
        retries={
            task: {"in_window": len(r.get("ts") or [])}
            for task, r in sorted(retry.items())
            if isinstance(r, dict)
        },
        handoffs={"count": _count(hand.get("n")), "chain": list(hand.get("chain") or [])},
        knowledge_topics=len(state.get("kb") or {}),
        context={
            "total_tokens": _count(ctx.get("total")),
            "growth_streak": _count(ctx.get("grow")),
        },
        spent=SpentView(usd=_count(cost.get("usd")) / 1_000_000, tokens=_count(cost.get("tok"))),
    ).model_dump()
