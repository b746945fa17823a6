"""Every example in README.md and docs/*.md is run, and its output compared.

The conventions (docs/development.md, "How the examples are checked", says the same
for writers):

- ```sh blocks are run. A block of `curl` commands (and `NAME=value` lines)
  is sent with aiohttp to a daemon started in this process; any other block
  runs in bash from the repository's root, its stdout and stderr together,
  with PATH as a reader from a clone has it: without `.venv/bin` (so an
  example runs `.venv/bin/python`, not `python`), unless the block runs the
  `botbouncer` command (installed by pip, or the virtualenv activated).
  A ```python block runs in the Python running the tests.
  `localhost:8080` is rewritten to the daemon's free port on 127.0.0.1, and
  `$BOTBOUNCER_URL` is set to its URL.
- The ```json or ```text block right after a run block is its expected
  output. In it `…` is a wildcard: inside a JSON string it stands for any
  characters (`"in-…"` matches any generated id), as a bare JSON value it
  stands for any value (`"at": …` for a timestamp), and in text for anything
  on the line. JSON is compared as values, so layout and line breaks are free.
- `<!-- daemon: PATH [NAME=value ...] -->` (re)starts the daemon on that
  config file, with those environment variables, for the blocks after it;
  before the first such marker a file's blocks run against config.example.yml.
- `<!-- not run: why -->` right before a block says it is not run (a token,
  a network, a model); every other ```sh and ```python block is run.
- ```yaml blocks must be valid YAML; ```json blocks that are not an expected
  output must be valid JSON (with the same `…` wildcards).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from gateway.config import load_config
from gateway.daemon import Daemon
from tests.redis_server import free_port

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
ELLIPSIS = "…"
RUN_LANGS = ("sh", "python")
_FENCE = re.compile(r"^\s*```(\w*)\s*$")
_MARKER = re.compile(r"^\s*<!--\s*(daemon|not run):\s*(.*?)\s*-->\s*$")  # in a list item too


@dataclass
class Block:
    lang: str
    text: str
    line: int
    not_run: str | None = None
    expected: Block | None = None


@dataclass
class Daemonize:
    config: str
    env: dict[str, str] = field(default_factory=dict)
    line: int = 0


Step = Block | Daemonize


def parse(path: Path) -> list[Step]:
    """The file's daemon markers and fenced blocks, in order; an output block
    is attached to the run block before it rather than listed."""
    lines = path.read_text(encoding="utf-8").splitlines()
    steps: list[Step] = []
    pending_not_run: str | None = None
    last_run: Block | None = None  # a run block still waiting for its output
    i = 0
    while i < len(lines):
        marker = _MARKER.match(lines[i])
        fence = _FENCE.match(lines[i])
        if marker:
            kind, rest = marker.groups()
            if kind == "not run":
                pending_not_run = rest or "(no reason given)"
            else:
                words = shlex.split(rest)
                env = dict(w.split("=", 1) for w in words[1:])
                steps.append(Daemonize(words[0], env, i + 1))
            last_run = None
            i += 1
        elif fence:
            start = i
            i += 1
            body = []
            while i < len(lines) and not lines[i].lstrip().startswith("```"):
                body.append(lines[i])
                i += 1
            i += 1
            indent = len(lines[start]) - len(lines[start].lstrip())  # a fence in a list item
            text = "\n".join(line[indent:] for line in body) + "\n"
            block = Block(fence.group(1), text, start + 1, pending_not_run)
            pending_not_run = None
            if last_run is not None and block.lang in ("json", "text"):
                last_run.expected = block
                last_run = None
                continue
            steps.append(block)
            runs = block.lang in RUN_LANGS and block.not_run is None
            last_run = block if runs else None
        else:
            if lines[i].strip():
                last_run = None  # prose between a command and a block: not its output
                pending_not_run = None
            i += 1
    return steps


# -- comparing --------------------------------------------------------------


def _bare_wildcards(text: str) -> str:
    """`…` outside JSON strings becomes the string "…"."""
    out = []
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            out.append(ch)
        elif ch == '"':
            in_string = True
            out.append(ch)
        elif ch == ELLIPSIS:
            out.append(f'"{ELLIPSIS}"')
        else:
            out.append(ch)
    return "".join(out)


def json_values(text: str) -> list[Any]:
    """Every JSON value in `text`, one after another (JSON lines, pretty
    printed objects, or curl outputs run together)."""
    decoder = json.JSONDecoder()
    values: list[Any] = []
    pos = 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            return values
        value, pos = decoder.raw_decode(text, pos)
        values.append(value)


def matches(expected: Any, actual: Any) -> bool:
    if expected == ELLIPSIS:
        return True
    if isinstance(expected, str) and ELLIPSIS in expected:
        pattern = ".*".join(re.escape(p) for p in expected.split(ELLIPSIS))
        return isinstance(actual, str) and re.fullmatch(pattern, actual, re.DOTALL) is not None
    if isinstance(expected, dict):
        return (
            isinstance(actual, dict)
            and expected.keys() == actual.keys()
            and all(matches(v, actual[k]) for k, v in expected.items())
        )
    if isinstance(expected, list):
        return (
            isinstance(actual, list)
            and len(expected) == len(actual)
            and all(matches(e, a) for e, a in zip(expected, actual, strict=True))
        )
    return type(expected) is type(actual) and bool(expected == actual)


def text_matches(expected: str, actual: str) -> bool:
    exp = [line.rstrip() for line in expected.strip("\n").splitlines()]
    act = [line.rstrip() for line in actual.strip("\n").splitlines()]
    if len(exp) != len(act):
        return False
    for e, a in zip(exp, act, strict=True):
        pattern = ".*".join(re.escape(p) for p in e.split(ELLIPSIS))
        if re.fullmatch(pattern, a) is None:
            return False
    return True


def check_output(block: Block, output: str, where: str) -> None:
    expected = block.expected
    if expected is None:
        return
    if expected.lang == "json":
        want = json_values(_bare_wildcards(expected.text))
        try:
            got = json_values(output)
        except ValueError:
            pytest.fail(f"{where}: the output is not JSON:\n{output}")
        assert matches(want, got), (
            f"{where}: the output differs from the block at line {expected.line}:\n"
            + "\n".join(json.dumps(v, ensure_ascii=False) for v in got)
        )
    else:
        assert text_matches(expected.text, output), (
            f"{where}: the output differs from the block at line {expected.line}:\n{output}"
        )


# -- running ----------------------------------------------------------------


@dataclass
class Env:
    daemon: Daemon | None = None
    url: str = ""
    vars: dict[str, str] = field(default_factory=dict)

    def local(self, text: str) -> str:
        if not self.url:
            return text
        host = self.url.removeprefix("http://")
        return text.replace("http://localhost:8080", self.url).replace("localhost:8080", host)


@asynccontextmanager
async def daemon_on(step: Daemonize, env: Env) -> AsyncIterator[None]:
    saved = {k: os.environ.get(k) for k in step.env}
    os.environ.update(step.env)
    try:
        config = load_config(str(ROOT / step.config))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    http = config.http.model_copy(update={"listen": f"127.0.0.1:{free_port()}"})
    daemon = Daemon(config.model_copy(update={"http": http}))
    env.url = await daemon.start()
    env.vars = dict(step.env)
    try:
        yield
    finally:
        await daemon.stop()
        env.url = ""


def _commands(text: str) -> Iterator[str]:
    """The block's commands: continuation lines joined, comments and blanks out."""
    joined = text.replace("\\\n", " ")
    for raw in joined.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            yield line


_ASSIGN = re.compile(r"^([A-Za-z_]\w*)=(.*)$")


def is_curl_block(text: str) -> bool:
    return all(
        (c.startswith("curl ") and not {"|", ">", "&&", ";"} & set(shlex.split(c)))
        or _ASSIGN.match(c)
        for c in _commands(text)
    )


def _expand(word: str, names: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: names.get(m.group(1), ""), word)


async def run_curl(text: str, env: Env, session: aiohttp.ClientSession) -> str:
    out = []
    for command in _commands(text):
        assign = _ASSIGN.match(command)
        if assign:
            env.vars[assign.group(1)] = _expand(shlex.split(assign.group(2))[0], env.vars)
            continue
        words = [_expand(w, env.vars) for w in shlex.split(command, comments=True)[1:]]
        method, headers, data, url = None, {}, None, None
        it = iter(words)
        for word in it:
            if word == "-s":
                continue
            if word == "-X":
                method = next(it)
            elif word == "-H":
                name, _, value = next(it).partition(":")
                headers[name.strip()] = value.strip()
            elif word == "-d":
                data = next(it)
            elif word.startswith("-"):
                raise AssertionError(f"curl option {word} is not supported by tests/test_docs.py")
            else:
                url = word
        assert url is not None, f"no URL in {command!r}"
        url = env.local(url if "://" in url else "http://" + url)
        method = method or ("POST" if data is not None else "GET")
        async with session.request(method, url, data=data, headers=headers) as resp:
            out.append(await resp.text())
    return "\n".join(out)


_BOTBOUNCER = re.compile(r"(?<![\w./-])botbouncer(?![\w.-])")


def reader_path(text: str) -> str:
    """PATH for a block: the tests' own PATH without the virtualenv's bin,
    which `make install` does not put on a reader's PATH; with it first for a
    block that runs `botbouncer`, which the docs take as installed."""
    venvs = {os.path.realpath(ROOT / ".venv" / "bin")}
    if sys.prefix != sys.base_prefix:  # the tests run in a virtualenv: its bin too
        venvs.add(os.path.realpath(Path(sys.executable).parent))
    path = [p for p in os.environ["PATH"].split(os.pathsep) if os.path.realpath(p) not in venvs]
    if _BOTBOUNCER.search(text):
        path[:0] = [str(ROOT / ".venv" / "bin"), str(Path(sys.executable).parent)]
    return os.pathsep.join(path)


async def run_shell(text: str, env: Env) -> tuple[int, str]:
    proc_env = {**os.environ, **env.vars, "PATH": reader_path(text)}
    if env.url:
        proc_env["BOTBOUNCER_URL"] = env.url  # what docs/examples/relay.py talks to
    proc = await asyncio.create_subprocess_exec(
        "bash", "-c", env.local(text), cwd=ROOT, env=proc_env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    stdout, _ = await asyncio.wait_for(proc.communicate(), timeout=60)
    return proc.returncode or 0, stdout.decode()


def _ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(ROOT)) for p in paths]


@pytest.mark.parametrize("path", DOCS, ids=_ids(DOCS))
async def test_every_example_runs_as_shown(path: Path) -> None:
    steps = parse(path)
    env = Env()
    first = Daemonize("config.example.yml")
    async with aiohttp.ClientSession() as session:
        ctx = daemon_on(first, env)
        await ctx.__aenter__()
        try:
            for step in steps:
                if isinstance(step, Daemonize):
                    await ctx.__aexit__(None, None, None)
                    ctx = daemon_on(step, env)
                    await ctx.__aenter__()
                    continue
                where = f"{path.name}:{step.line}"
                if step.not_run is not None:
                    continue
                if step.lang == "sh":
                    if is_curl_block(step.text):
                        output = await run_curl(step.text, env, session)
                    else:
                        code, output = await run_shell(step.text, env)
                        assert step.expected or code == 0, f"{where}: exit {code}\n{output}"
                    check_output(step, output, where)
                elif step.lang == "python":
                    python = shlex.quote(sys.executable)
                    code, output = await run_shell(f"{python} - <<'EOF'\n{step.text}EOF\n", env)
                    assert step.expected or code == 0, f"{where}: exit {code}\n{output}"
                    check_output(step, output, where)
                elif step.lang == "yaml":
                    yaml.safe_load(step.text)
                elif step.lang == "json":
                    json_values(_bare_wildcards(step.text))
        finally:
            await ctx.__aexit__(None, None, None)


def test_the_docs_stand_alone() -> None:
    """No reference to material outside this repository."""
    pattern = re.compile(r"shared/|DESIGN|[Ii]ssue [0-9]")
    for path in [*DOCS, ROOT / "bench" / "README.md"]:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            assert not pattern.search(line), f"{path.name}:{number}: {line}"


def test_every_relative_link_resolves() -> None:
    link = re.compile(r"\]\(([^)#:]+)(#[^)]*)?\)")
    for path in DOCS:
        for target, _ in link.findall(path.read_text(encoding="utf-8")):
            assert (path.parent / target).exists(), f"{path.name}: broken link {target}"


def test_the_parser_sees_markers_outputs_and_wildcards() -> None:
    assert matches(json_values(_bare_wildcards('{"id": "in-…", "at": …}')),
                   [{"id": "in-12ab", "at": 1.5}])  # fmt: skip
    assert not matches({"id": "in-…"}, {"id": "out-1"})
    assert not matches({"a": 1}, {"a": 1, "b": 2})
    assert not matches(1, True)
    assert text_matches("ok - …\nnote", "ok - anything here\nnote")
    assert not text_matches("a\nb", "a")


# -- docs/configuration.md's table of keys, checked against the models -------


def _bounds(info: Any) -> str:
    parts = []
    for meta in info.metadata:
        for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            value = getattr(meta, attr, None)
            if value is not None:
                parts.append(f"{sign} {value:g}" if isinstance(value, float) else f"{sign} {value}")
    return ", ".join(parts)


def _choices(annotation: Any) -> str:
    import typing

    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is typing.Literal:
        return " / ".join(f"`{a}`" for a in typing.get_args(annotation))
    for arg in args:
        found = _choices(arg)
        if found:
            return found
    return ""


def _default(info: Any, parent: Any, name: str) -> str:
    from pydantic import BaseModel, SecretStr
    from pydantic_core import PydanticUndefined

    if parent is not None:
        value = getattr(parent, name)
    elif info.default is PydanticUndefined and info.default_factory is None:
        return "required"
    else:
        value = info.default_factory() if info.default is PydanticUndefined else info.default
    if isinstance(value, BaseModel) and not isinstance(value, SecretStr):
        return ""
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, str):
        return f"`{json.dumps(value, ensure_ascii=False)}`"
    return f"`{json.dumps(value)}`"


def _models(annotation: Any) -> list[Any]:
    """The pydantic models in a (nested) union or Annotated type, in order."""
    import typing

    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in typing.get_args(annotation) for m in _models(a)]


def config_rows() -> list[str]:
    """One table row per key: `| key | default | range or choices |`."""
    import typing

    from pydantic import BaseModel

    from gateway.config import BACKEND_TYPES, BotConfig, Config, GuardProfile, Policy

    rows: list[str] = []

    def walk(
        model: type[BaseModel], prefix: str, skip: frozenset[str] = frozenset(), parent: Any = None
    ) -> None:
        for name, info in model.model_fields.items():
            if name in skip:
                continue
            key = prefix + name
            annotation = info.annotation
            nested = [
                a
                for a in (annotation, *typing.get_args(annotation))
                if isinstance(a, type) and issubclass(a, BaseModel)
            ]
            if name == "profiles":
                walk(GuardProfile, f"{key}.<name>.", parent=GuardProfile())
            elif name == "bots":
                walk(BotConfig, "bots[].", frozenset(Policy.model_fields) | {"backend"})
                rows.append("| `bots[].<any key of defaults>` | the `defaults` value | |")
                kinds = " / ".join(f"`{k}`" for k in BACKEND_TYPES)
                rows.append(f"| `bots[].backend.type` | required in mode: proxy | {kinds} |")
                for backend in _models(BotConfig.model_fields["backend"].annotation):
                    kind = typing.get_args(backend.model_fields["type"].annotation)[0]
                    walk(backend, f"bots[].backend.({kind}).", frozenset({"type"}))
            elif nested and typing.get_origin(annotation) is list:  # alerts
                walk(nested[0], f"{key}[].")
            elif nested and typing.get_origin(annotation) is dict:  # llm_proxy.prices
                walk(nested[0], f"{key}.<model>.")
            elif nested:
                child = getattr(parent, name) if parent is not None else info.default
                walk(nested[0], key + ".", parent=child if isinstance(child, BaseModel) else None)
            else:
                default = _default(info, parent, name)
                rows.append(f"| `{key}` | {default} | {_choices(annotation) or _bounds(info)} |")

    walk(Config, "")
    return rows


def test_the_configuration_reference_lists_every_key_with_its_default() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    table = text.split("<!-- keys: begin -->\n", 1)[1].split("<!-- keys: end -->", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    want = config_rows()
    assert rows == want, "docs/configuration.md is stale; its table is:\n" + "\n".join(
        ["| key | default | range |", "|---|---|---|", *want]
    )
