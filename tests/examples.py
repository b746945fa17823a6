"""The runnable examples of docs/examples/, for the tests that run them:
imported from their files (their `build`), or run as programs (their `main`)
against a fake platform."""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType

from tests.fakes.telegram import FakeTelegram

EXAMPLES = Path(__file__).resolve().parent.parent / "docs" / "examples"


@functools.cache
def example(name: str) -> ModuleType:
    """docs/examples/<name>.py, imported from its file (once)."""
    spec = importlib.util.spec_from_file_location(f"{name}_example", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def program_env(**env: str) -> dict[str, str]:
    """An example's environment: nothing of the test run's but PATH."""
    return {"PATH": "/usr/bin:/bin", **env}


class Program:
    """An example running as a program; its output once it ended."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.stdout = self.stderr = ""

    async def polling(self, fake: FakeTelegram, user_id: int) -> None:
        """Until it waits in a long poll as `user_id`; fails if it exits first."""
        polls = asyncio.create_task(
            fake.wait_until(lambda: fake.bot(user_id).polling > 0, 30, "the example polling")
        )
        exited = asyncio.create_task(self.proc.wait())
        await asyncio.wait({polls, exited}, return_when=asyncio.FIRST_COMPLETED)
        if exited.done():
            polls.cancel()
            assert self.proc.stderr is not None
            err = (await self.proc.stderr.read()).decode()
            raise AssertionError(f"the example exited with {self.proc.returncode}: {err}")
        exited.cancel()
        await polls


@asynccontextmanager
async def program(
    fake: FakeTelegram, tmp_path: Path, name: str, config: str, token: str
) -> AsyncIterator[Program]:
    """docs/examples/<name>.py run as a program (`main`) on the fake Bot API,
    with `config` as its botbouncer.yml; stopped with SIGINT at the end
    (unless it stopped itself)."""
    (tmp_path / "botbouncer.yml").write_text(config)
    env = program_env(TELEGRAM_TOKEN=token, TELEGRAM_API_BASE=fake.api_base)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(EXAMPLES / f"{name}.py"), env=env, cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    run = Program(proc)
    try:
        yield run
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
        try:
            async with asyncio.timeout(20):
                out, err = await proc.communicate()
        except TimeoutError:
            proc.kill()
            out, err = await proc.communicate()
        run.stdout, run.stderr = out.decode(), err.decode()


def run_once(
    name: str, tmp_path: Path, config: str, **env: str
) -> subprocess.CompletedProcess[str]:
    """docs/examples/<name>.py run to its end, `config` as its botbouncer.yml
    in the working directory (for the refusals: it should not get far)."""
    (tmp_path / "botbouncer.yml").write_text(config)
    return subprocess.run(
        [sys.executable, str(EXAMPLES / f"{name}.py")], env=program_env(**env),
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
