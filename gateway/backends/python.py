"""`python`: `package.module:function`, an async callable taking the message
(and, if it accepts a second argument, the recent context). It returns a
string, a list of strings, or None (stay silent). A plain (sync) function runs
in a thread of its own: blocking I/O in it holds up no other chat, and its
deadline still ends the wait."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import os
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gateway import config
from gateway.errors import BotbouncerError
from gateway.model import Message
from gateway.store import ContextEntry


class PythonBackendError(BotbouncerError):
    pass


def importable(config_file: str | None) -> None:
    """Let `module:function` name a module beside the config file or in the
    working directory, as users expect: the `botbouncer` script's own
    directory is what Python puts first on sys.path, not either of those.
    Appended after the installed packages, which keep their precedence."""
    dirs = [str(Path(config_file).resolve().parent)] if config_file else []
    dirs.append(os.getcwd())
    for folder in dirs:
        if folder not in sys.path:
            sys.path.append(folder)


def load_callable(spec: str) -> Callable[..., Any]:
    module_name, _, attr = spec.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name.split(".")[0]:
            raise PythonBackendError(f"cannot import {module_name!r}: {exc}") from None
        raise PythonBackendError(
            f"cannot import {module_name!r}: no module {exc.name!r} in the config file's "
            "directory, the working directory or the installed packages (add its "
            "directory to PYTHONPATH, or pip install it)"
        ) from None
    except Exception as exc:  # the user's module: any import error is theirs to see
        raise PythonBackendError(f"cannot import {module_name!r}: {exc}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise PythonBackendError(f"{module_name!r} has no {attr!r}") from None
    if not callable(obj):
        raise PythonBackendError(f"{spec} is not callable")
    return obj  # type: ignore[no-any-return]


def _takes_context(fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in params)


def _is_async(fn: Callable[..., Any]) -> bool:
    """An async function, or an object whose __call__ is one."""
    call = type(fn).__call__ if not inspect.isroutine(fn) else fn
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


def _in_thread(call: Callable[[], Any]) -> asyncio.Future[Any]:
    """`call()` in a daemon thread of its own, its outcome as a future of this
    loop. Not the loop's default executor: a call that never returns would
    hold one of its few threads (aiohttp resolves names there) and block the
    daemon's exit; this one is abandoned when the deadline passes."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()

    def settle(out: Any, exc: BaseException | None) -> None:
        if done.done():  # the deadline passed: nobody waits any more
            return
        if exc is None:
            done.set_result(out)
        else:
            done.set_exception(exc)

    def run() -> None:
        try:
            out, exc = call(), None
        except BaseException as caught:  # handed to the loop, as it would have seen it
            out, exc = None, caught
        with contextlib.suppress(RuntimeError):  # the loop closed: the daemon stopped meanwhile
            loop.call_soon_threadsafe(settle, out, exc)

    threading.Thread(target=run, name="botbouncer-python-backend", daemon=True).start()
    return done


class PythonBackend:
    name = "python"

    def __init__(self, cfg: config.PythonBackend) -> None:
        self.fn = load_callable(cfg.callable)
        self.spec = cfg.callable
        self.with_context = _takes_context(self.fn)
        # A sync function would block the event loop, every chat, and its
        # own deadline (which cannot interrupt a call that never yields).
        self.threaded = not _is_async(self.fn)

    async def reply(self, msg: Message, context: Sequence[ContextEntry]) -> list[str]:
        args = (msg, list(context)) if self.with_context else (msg,)
        try:
            out = await _in_thread(lambda: self.fn(*args)) if self.threaded else self.fn(*args)
            if inspect.isawaitable(out):
                out = await out
        except SystemExit as exc:  # argparse on a bad command, say: not the daemon's exit
            raise PythonBackendError(f"{self.spec} raised SystemExit({exc.code!r})") from None
        if out is None:
            return []
        if isinstance(out, str):
            return [out] if out.strip() else []
        if isinstance(out, list | tuple) and all(isinstance(r, str) for r in out):
            return [r for r in out if r.strip()]
        raise PythonBackendError(f"{self.spec} returned {type(out).__name__}, "
                                 "not a string, a list of strings or None")  # fmt: skip
