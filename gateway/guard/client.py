"""A Python client for the agent guard, async (aiohttp) and sync (stdlib).

This file needs nothing but the standard library to import and to run
`GuardClient` (it may be copied alone into an agent's code base);
`AsyncGuardClient` imports aiohttp when it makes its first request.

    guard = GuardClient("http://127.0.0.1:8080", session="run-42")

    @guard.tool()
    def search(query: str, page: int = 1) -> list[str]: ...

    search("tides")      # guard.step() before, guard.result() after
                         # a `block` raises GuardBlocked with the guard's message

Both clients fail open by default: when the guard cannot be reached the step
is allowed and a warning is logged (pass `fail_open=False` to raise instead).
A block is never swallowed.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar
from urllib.parse import quote

if TYPE_CHECKING:
    import aiohttp

log = logging.getLogger("botbouncer.guard.client")

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class GuardAnswer:
    decision: str  # allow | warn | block
    reason: str
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)
    also: list[str] = field(default_factory=list)
    budget: dict[str, Any] = field(default_factory=dict)
    steps: dict[str, Any] = field(default_factory=dict)
    reachable: bool = True  # False: the guard could not be asked (failed open)

    @property
    def blocked(self) -> bool:
        return self.decision == "block"

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> GuardAnswer:
        return cls(
            decision=body["decision"],
            reason=body["reason"],
            message=body["message"],
            evidence=body.get("evidence", {}),
            also=body.get("also", []),
            budget=body.get("budget", {}),
            steps=body.get("steps", {}),
        )


OPEN = GuardAnswer("allow", "ok", "The guard could not be reached; allowed.", reachable=False)


class GuardBlocked(Exception):
    """The guard said block: `answer.message` says what repeated and what to do."""

    def __init__(self, answer: GuardAnswer) -> None:
        super().__init__(f"{answer.reason}: {answer.message}")
        self.answer = answer


class GuardError(Exception):
    """The guard refused the request (bad input, profile conflict) or is unreachable."""


# The guard reads bodies nested up to 64 levels; a call's arguments and a
# result's output sit two levels down. Deeper values are cut short here, as
# are values that hold themselves, so that a tool's data never makes the
# guard refuse its call or its result.
MAX_DEPTH = 48
# Items walked by hand at most when json cannot write a value as it is: a
# bound on the time a value whose parts share parts may take (its JSON may
# still be more than the guard takes: a result is then sent without its
# call's arguments, a step allowed unchecked, as any too-large body).
MAX_NODES = 4_000_000


def _jsonable(value: Any) -> Any:
    """Arguments and outputs as JSON; what JSON cannot hold becomes its str():
    an object, a key that is no string or number (a tuple), a value that
    holds itself, an integer too long to print, a `__str__` that raises."""
    try:
        text = json.dumps(value, default=str)
    except Exception:  # default=str may raise anything (a __str__ that fails)
        return _Walk(MAX_NODES).value(value, 0)
    out = json.loads(text)
    if _deeper(text.encode(), MAX_DEPTH):
        return _Walk(None).value(out, 0)  # a JSON tree: only its depth to cut
    return out


_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_BRACKETS = bytes.maketrans(b"{}", b"[]")


def _deeper(text: bytes, limit: int) -> bool:
    """Whether a JSON text (ASCII, as json.dumps writes it) nests containers
    more than `limit` levels deep. gateway/guard/normalize.py's
    text_depth_over, copied: this file runs on the standard library alone.
    Every step is a bytes method: far cheaper than walking the value."""
    if text.count(b"[") + text.count(b"{") <= limit:
        return False
    # Outside strings only: with escaped backslashes and quotes gone, every
    # quote left opens or closes a string.
    text = text.replace(b"\\\\", b"").replace(b'\\"', b"")
    text = b"".join(text.split(b'"')[::2]).translate(_BRACKETS, _NOT_BRACKETS)
    for _ in range(limit):  # each pass removes the innermost level
        if not text:
            return False
        text = text.replace(b"[]", b"")
    return bool(text)


class _Walk:
    """A value as JSON, by hand, as json.dumps(default=str) writes it, but
    for containers at most MAX_DEPTH levels deep and `nodes` items (None: any
    number); a container met again inside itself is written "..."."""

    def __init__(self, nodes: int | None) -> None:
        self.path: set[int] = set()
        self.left = nodes

    def value(self, value: Any, depth: int) -> Any:
        if self.left is not None:
            self.left -= 1
            if self.left < 0:
                return "..."
        if isinstance(value, dict | list | tuple):  # a set is its str(), as json's default
            if depth >= MAX_DEPTH or id(value) in self.path:
                return "..."
            self.path.add(id(value))
            try:
                if isinstance(value, dict):
                    return {self.key(k): self.value(v, depth + 1) for k, v in value.items()}
                return [self.value(v, depth + 1) for v in value]
            finally:
                self.path.discard(id(value))
        if value is None or isinstance(value, str | bool | float):
            return value
        if isinstance(value, int):
            try:
                int.__repr__(value)  # what json writes it with: past 4,300 digits, an error
            except ValueError:
                return f"<an integer of {value.bit_length()} bits>"
            return value
        try:
            return str(value)
        except Exception:  # any __str__ may raise anything
            return f"<{type(value).__name__}>"

    def key(self, key: Any) -> str:
        """A key as JSON writes one (`1`, `true`, `null`), or its str()."""
        if isinstance(key, str):
            return key
        if key is None or isinstance(key, bool):
            return json.dumps(key)
        walked = self.value(key, 0)  # written as a string: its own depth is no JSON depth
        return walked if isinstance(walked, str) else json.dumps(walked)


def _call_args(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return _jsonable({"args": list(args), "kwargs": kwargs})
    bound.apply_defaults()
    return _jsonable(dict(bound.arguments))


def _step(tool: str, args: Any, input_tokens: int | None) -> dict[str, Any]:
    body: dict[str, Any] = {"tool": tool, "args": _jsonable(args if args is not None else {})}
    if input_tokens is not None:
        body["input_tokens"] = input_tokens
    return body


def _unnamed(body: dict[str, Any]) -> dict[str, Any]:
    """A result the guard did not take with its call's arguments, without
    them: too large together (413), or a guard older than `args` (0.1.0,
    400 "args: unknown field"). It gives the result to the newest call of
    its tool without one."""
    return {k: v for k, v in body.items() if k != "args"}


def _result(tool: str, ok: bool, output: Any, args: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"tool": tool, "ok": ok, "output": _jsonable(output)}
    if args is not None:  # which call it answers, when calls of one tool overlap
        body["args"] = _jsonable(args)
    return body


def _kb(question: str, confidence: float | None) -> dict[str, Any]:
    body: dict[str, Any] = {"question": question}
    if confidence is not None:
        body["confidence"] = confidence
    return body


def _usage(
    cost_usd: float, tokens: int, budget_usd: float | None, budget_tokens: int | None
) -> dict[str, Any]:
    body: dict[str, Any] = {"cost_usd": cost_usd, "tokens": tokens}
    if budget_usd is not None:
        body["budget_usd"] = budget_usd
    if budget_tokens is not None:
        body["budget_tokens"] = budget_tokens
    return body


class _Base:
    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8080",
        session: str = "default",
        *,
        profile: str | None = None,
        timeout: float = 5.0,
        fail_open: bool = True,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.session = session
        self.profile = profile
        self.timeout = timeout
        self.fail_open = fail_open

    def _url(self, op: str | None) -> str:
        url = f"{self.base_url}/v1/guard/{quote(self.session, safe='')}"
        if op is not None:
            url += f"/{op}"
        if self.profile and op is not None:
            url += f"?profile={quote(self.profile, safe='')}"
        return url

    def _answer(self, status: int, body: Any) -> GuardAnswer:
        if status in (200, 429) and isinstance(body, dict) and "decision" in body:
            return GuardAnswer.from_json(body)
        error = body.get("error") if isinstance(body, dict) else body
        # 413: a step or result too large for the guard to take is the
        # guard's limit, not the agent's fault: the call goes on unguarded.
        if (status >= 500 or status == 413) and self.fail_open:
            log.warning("guard answered %s (%s); allowing", status, error)
            return OPEN
        raise GuardError(f"guard answered {status}: {error}")

    def _unreachable(self, exc: Exception) -> GuardAnswer:
        if not self.fail_open:
            raise GuardError(f"guard unreachable at {self.base_url}: {exc}") from exc
        log.warning("guard unreachable at %s (%s); allowing", self.base_url, exc)
        return OPEN


class AsyncGuardClient(_Base):
    """The guard from asyncio code; one aiohttp session, closed by `close()`
    or `async with`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> AsyncGuardClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def _request(self, method: str, op: str | None, body: Any = None) -> tuple[int, Any]:
        import aiohttp  # only here: GuardClient runs on the standard library alone

        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        async with self._http.request(method, self._url(op), json=body) as resp:
            return resp.status, await resp.json(content_type=None)

    async def _check(self, op: str, body: dict[str, Any]) -> GuardAnswer:
        import aiohttp

        try:
            status, answer = await self._request("POST", op, body)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            return self._unreachable(exc)
        if status in (400, 413) and "args" in body and op == "result":
            return await self._check(op, _unnamed(body))
        return self._answer(status, answer)

    async def step(
        self, tool: str, args: Any = None, input_tokens: int | None = None
    ) -> GuardAnswer:
        return await self._check("step", _step(tool, args, input_tokens))

    async def result(
        self, tool: str, ok: bool = True, output: Any = None, args: Any = None
    ) -> GuardAnswer:
        return await self._check("result", _result(tool, ok, output, args))

    async def retry(self, task: str, input: str = "", error: Any = None) -> GuardAnswer:
        return await self._check("retry", {"task": task, "input": input, "error": _jsonable(error)})

    async def handoff(self, source: str, target: str) -> GuardAnswer:
        return await self._check("handoff", {"source": source, "target": target})

    async def kb_query(self, question: str, confidence: float | None = None) -> GuardAnswer:
        return await self._check("kb-query", _kb(question, confidence))

    async def usage(
        self,
        cost_usd: float = 0.0,
        tokens: int = 0,
        budget_usd: float | None = None,
        budget_tokens: int | None = None,
    ) -> GuardAnswer:
        return await self._check("usage", _usage(cost_usd, tokens, budget_usd, budget_tokens))

    async def state(self) -> dict[str, Any] | None:
        status, body = await self._request("GET", None)
        if status == 404:
            return None
        if status != 200:
            raise GuardError(f"guard answered {status}: {body}")
        state: dict[str, Any] = body["state"]
        return state

    async def reset(self) -> None:
        status, body = await self._request("DELETE", None)
        if status != 200:
            raise GuardError(f"guard answered {status}: {body}")

    def tool(
        self, name: str | None = None
    ) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
        """Guard an async tool function: step before (a block raises
        GuardBlocked and the tool is not called), result after."""

        def wrap(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
            if not inspect.iscoroutinefunction(fn):
                raise TypeError(f"{fn.__name__} is not async: use GuardClient.tool for it")
            tool = name or fn.__name__

            @functools.wraps(fn)
            async def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
                # The result names its call by its arguments: calls of one
                # tool may run side by side (_check: unless that is too large).
                called = _call_args(fn, args, kwargs)
                answer = await self.step(tool, called)
                if answer.blocked:
                    raise GuardBlocked(answer)
                try:
                    out = await fn(*args, **kwargs)
                except Exception as exc:
                    failed = f"{type(exc).__name__}: {exc}"
                    await self.result(tool, ok=False, output=failed, args=called)
                    raise
                await self.result(tool, ok=True, output=out, args=called)
                return out

            return guarded

        return wrap


# The daemon is the agent's own service, as AsyncGuardClient reaches it
# (aiohttp, which takes no proxy from the environment unless told): an
# HTTP_PROXY meant for the agent's other calls would seldom reach a daemon on
# 127.0.0.1, and an unreachable guard lets every step through.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class GuardClient(_Base):
    """The guard from synchronous code (urllib; no event loop needed). Like
    AsyncGuardClient, it calls the daemon directly, whatever proxy the
    environment names."""

    def _request(self, method: str, op: str | None, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self._url(op), data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with _DIRECT.open(req, timeout=self.timeout) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as err:
            raw = err.read()
            try:
                return err.code, json.loads(raw)
            except ValueError:
                return err.code, raw.decode("utf-8", "replace")

    def _check(self, op: str, body: dict[str, Any]) -> GuardAnswer:
        try:
            status, answer = self._request("POST", op, body)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            return self._unreachable(exc)
        if status in (400, 413) and "args" in body and op == "result":
            return self._check(op, _unnamed(body))
        return self._answer(status, answer)

    def step(self, tool: str, args: Any = None, input_tokens: int | None = None) -> GuardAnswer:
        return self._check("step", _step(tool, args, input_tokens))

    def result(
        self, tool: str, ok: bool = True, output: Any = None, args: Any = None
    ) -> GuardAnswer:
        return self._check("result", _result(tool, ok, output, args))

    def retry(self, task: str, input: str = "", error: Any = None) -> GuardAnswer:
        return self._check("retry", {"task": task, "input": input, "error": _jsonable(error)})

    def handoff(self, source: str, target: str) -> GuardAnswer:
        return self._check("handoff", {"source": source, "target": target})

    def kb_query(self, question: str, confidence: float | None = None) -> GuardAnswer:
        return self._check("kb-query", _kb(question, confidence))

    def usage(
        self,
        cost_usd: float = 0.0,
        tokens: int = 0,
        budget_usd: float | None = None,
        budget_tokens: int | None = None,
    ) -> GuardAnswer:
        return self._check("usage", _usage(cost_usd, tokens, budget_usd, budget_tokens))

    def state(self) -> dict[str, Any] | None:
        status, body = self._request("GET", None)
        if status == 404:
            return None
        if status != 200:
            raise GuardError(f"guard answered {status}: {body}")
        state: dict[str, Any] = body["state"]
        return state

    def reset(self) -> None:
        status, body = self._request("DELETE", None)
        if status != 200:
            raise GuardError(f"guard answered {status}: {body}")

    def tool(self, name: str | None = None) -> Callable[[Callable[P, R]], Callable[P, R]]:
        """Guard a tool function: step before (a block raises GuardBlocked and
        the tool is not called), result after."""

        def wrap(fn: Callable[P, R]) -> Callable[P, R]:
            if inspect.iscoroutinefunction(fn):
                raise TypeError(f"{fn.__name__} is async: use AsyncGuardClient.tool for it")
            tool = name or fn.__name__

            @functools.wraps(fn)
            def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
                # The result names its call by its arguments: calls of one
                # tool may run side by side (_check: unless that is too large).
                called = _call_args(fn, args, kwargs)
                answer = self.step(tool, called)
                if answer.blocked:
                    raise GuardBlocked(answer)
                try:
                    out = fn(*args, **kwargs)
                except Exception as exc:
                    failed = f"{type(exc).__name__}: {exc}"
                    self.result(tool, ok=False, output=failed, args=called)
                    raise
                self.result(tool, ok=True, output=out, args=called)
                return out

            return guarded

        return wrap


__all__ = [
    "AsyncGuardClient",
    "GuardAnswer",
    "GuardBlocked",
    "GuardClient",
    "GuardError",
]
