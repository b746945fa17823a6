"""`check-config` on hostile input (issue 8, "Bad input"): whatever a file holds,
`botbouncer check-config -c FILE` exits 0 or 2, never tracebacks, and on 2 says
what is wrong, one `<key path or file>: <problem>` line each (README.md).

Three kinds of input, all through the real CLI entry point `gateway.cli.main`:

- YAML-ish text and bytes: tabs, anchors and aliases, merge keys, tags,
  `${VAR}` interpolation (broken forms too), deep nesting, huge numbers,
  control characters, bytes that are not UTF-8;
- configs built from the schema itself (`Config.model_fields`, walked
  recursively): real key names at the right and the wrong level, values of
  the right and the wrong type, nulls, lists where maps are expected;
- one wrong value or unknown key planted in a valid config: the error names
  exactly that key path.

Inputs that once broke it are pinned at the end (a YAML bomb, an int past
Python's digit limit, a 13th month, a 5 MB file, ...).
More examples: BOTBOUNCER_FUZZ_EXAMPLES=2000 pytest tests/test_config_fuzz.py
"""

from __future__ import annotations

import io
import os
import re
import types
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, SecretStr

from gateway.cli import main
from gateway.config import Config, GuardConfig, GuardProfile, Policy

EXAMPLES = int(os.environ.get("BOTBOUNCER_FUZZ_EXAMPLES", "150"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
        HealthCheck.function_scoped_fixture,  # tmp_path: one file, rewritten per example
    ],
)
SET, EMPTY, UNSET = "BB_FUZZ_SET", "BB_FUZZ_EMPTY", "BB_FUZZ_UNSET"

NO_BOTS = "bots: at least one bot is required (or an llm_proxy or mcp_proxy section)"


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    # `${VAR}` forms in the inputs refer to these; nothing else of the environment matters
    monkeypatch.setenv(SET, "7")
    monkeypatch.setenv(EMPTY, "")
    monkeypatch.delenv(UNSET, raising=False)


# -- running check-config ------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    code: int
    out: str
    err: str

    @property
    def problems(self) -> list[str]:
        return self.err.rstrip("\n").split("\n")[1:]


def check_config(path: Path | str) -> Outcome:
    """`botbouncer check-config -c PATH`, in process; nothing may escape it."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["check-config", "-c", str(path)])
    return Outcome(code, out.getvalue(), err.getvalue())


def assert_clean(res: Outcome, path: Path | str) -> None:
    """Exit 0 with the one `ok` line, or exit 2 with a header and one
    `<where>: <what>` line per problem; never a traceback."""
    shown = f"exit {res.code}\nstdout: {res.out!r}\nstderr: {res.err[:2000]!r}"
    assert "Traceback" not in res.out + res.err, shown
    assert res.code in (0, 2), shown
    if res.code == 0:
        assert res.err == "", shown
        assert res.out.startswith(f"{path}: ok - store "), shown
        return
    assert res.out == "", shown
    assert res.err.startswith(f"botbouncer: {path}: invalid configuration\n"), shown
    assert res.problems, shown
    for line in res.problems:
        _where, sep, what = line.partition(": ")
        assert sep and what.strip(), f"not '<where>: <what>': {line!r}\n{shown}"


def write(path: Path, content: str | bytes) -> Path:
    if isinstance(content, str):
        content = content.encode("utf-8")
    path.write_bytes(content)
    return path


def check_text(tmp_path: Path, content: str | bytes) -> Outcome:
    path = write(tmp_path / "config.yml", content)
    res = check_config(path)
    assert_clean(res, path)
    return res


# -- the schema, read from the models ------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """What a config position holds: a model, a list or map of something, one
    of several models (tagged by `type`), or a leaf value of `annotation`."""

    kind: Literal["model", "list", "dict", "union", "leaf"]
    model: type[BaseModel] | None = None
    item: Shape | None = None
    models: tuple[type[BaseModel], ...] = ()
    annotation: Any = None


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _strip(tp: Any) -> Any:
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    return tp


def _is_union(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType)


def shape_of(annotation: Any) -> Shape:
    tp = _strip(annotation)
    if _is_model(tp):
        return Shape("model", model=tp)
    origin, args = get_origin(tp), [_strip(a) for a in get_args(tp)]
    if _is_union(tp) and len(args) == 2 and type(None) in args:  # an optional union of models
        inner = next(a for a in args if a is not type(None))
        if _is_union(inner) and all(_is_model(_strip(a)) for a in get_args(inner)):
            return shape_of(inner)
        if _is_model(inner):  # an optional section (llm_proxy, mcp_proxy)
            return Shape("model", model=inner)
    if _is_union(tp) and args and all(_is_model(a) for a in args):
        return Shape("union", models=tuple(args))
    if origin in (list, tuple) and args and _is_model(args[0]):
        return Shape("list", item=shape_of(args[0]))
    if origin is dict and len(args) == 2 and _is_model(args[1]):
        return Shape("dict", item=shape_of(args[1]))
    return Shape("leaf", annotation=annotation)


def fields_of(model: type[BaseModel]) -> dict[str, Shape]:
    return {name: shape_of(f.annotation) for name, f in model.model_fields.items()}


def all_models(model: type[BaseModel] = Config) -> list[type[BaseModel]]:
    found: list[type[BaseModel]] = []

    def visit(shape: Shape) -> None:
        for m in [*([shape.model] if shape.model else []), *shape.models]:
            if m not in found:
                found.append(m)
                for sub in fields_of(m).values():
                    visit(sub)
        if shape.item is not None:
            visit(shape.item)

    visit(Shape("model", model=model))
    return found


MODELS = all_models()
KEYS = sorted({name for m in MODELS for name in m.model_fields})
SCHEMA = Shape("model", model=Config)


def test_the_schema_walk_finds_every_section() -> None:
    names = {m.__name__ for m in MODELS}
    assert {
        "Config",
        "StoreConfig",
        "HttpConfig",
        "BotConfig",
        "TurnsPolicy",
        "GuardProfile",
        "WebhookBackend",
        "OpenAIBackend",
        "TelegramConfig",
        "RetryGuard",
    } <= names
    assert {"bots", "soft_limit", "url", "headers", "prechecks", "secret_token"} <= set(KEYS)
    assert fields_of(Config)["bots"].kind == "list"
    assert fields_of(GuardConfig)["profiles"].kind == "dict"


# -- strategies ----------------------------------------------------------------------

INTERESTING = [
    "", " ", "off", "on", "yes", "no", "all", "mentions", "groups", "echo", "webhook", "openai",
    "python", "http", "discord", "telegram", "irc", "memory://", "redis://127.0.0.1:6379/0",
    "redis://:pw@h:99999", "rediss://h", "redis+cluster://a:1", "mysql://x",
    "http://127.0.0.1:9/hook", "https://", "ftp://x", "ws://127.0.0.1:9/gw", "127.0.0.1:8080",
    "[::1]:80", "[::1", ":80", "host:0", "host:x", "{n}", "{limit}", "{", "}", "{0}",
    "{n:{limit}}", "{n!r}", "{identity}", "{name}", "${" + SET + "}", "${" + UNSET + "}",
    "${" + UNSET + ":-3}", "${" + EMPTY + ":-x}", "${" + EMPTY + "}", "${", "${A:-", "${A",
    "$$", "$", "${1BAD}", "${}", "$${A}", "pkg.mod:func", "a:b:c", ":", "a/b", " padded ",
    "(?P<", "[a-", ".*", "\u202e\u200d\u200b", "\u0301", "\ufeff", "A" * 257, "x" * 300,
]  # fmt: skip

SAFE_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=20)
small_text = st.one_of(st.sampled_from(INTERESTING), SAFE_TEXT)
numbers = st.one_of(
    st.integers(-3, 200),
    st.sampled_from([0, 1, 2, 59, 60, 10**6, 10**6 + 1, 10**13 + 1, 2**63, 10**400]),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
)
scalars = st.one_of(
    st.none(), st.booleans(), numbers, small_text, st.dates(), st.binary(max_size=6)
)
junk = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(
            st.one_of(st.sampled_from(KEYS), small_text, st.integers()), inner, max_size=3
        ),
    ),
    max_leaves=6,
)


def right_value(annotation: Any) -> st.SearchStrategy[Any]:
    """A value of the annotated type, as YAML would spell it (ranges unchecked)."""
    tp = _strip(annotation)
    origin, args = get_origin(tp), get_args(tp)
    if _is_union(tp):
        return st.one_of([right_value(a) for a in args])
    if origin is Literal:
        return st.sampled_from(args)
    if tp is type(None):
        return st.none()
    if tp is bool:
        return st.booleans()
    if tp is int:
        return numbers.filter(lambda v: isinstance(v, int))
    if tp is float:
        return numbers
    if tp in (str, SecretStr):
        return small_text
    if origin in (list, tuple):
        return st.lists(right_value(args[0]) if args else scalars, max_size=3)
    if origin is dict:
        return st.dictionaries(small_text, right_value(args[1]), max_size=3)
    return scalars


def value_of(shape: Shape, depth: int = 0) -> st.SearchStrategy[Any]:
    """Right or wrong: what a position of this shape might be given."""
    if shape.kind == "leaf":
        return st.one_of(right_value(shape.annotation), junk)
    if depth > 4:
        return junk
    if shape.kind == "model":
        assert shape.model is not None
        return st.one_of(model_value(shape.model, depth), junk)
    if shape.kind == "union":
        return st.one_of(*[model_value(m, depth) for m in shape.models], junk)
    assert shape.item is not None
    item = value_of(shape.item, depth + 1)
    if shape.kind == "list":
        return st.one_of(st.lists(item, max_size=3), junk)
    names = st.one_of(st.sampled_from(["default", "strict", "x"]), small_text)
    return st.one_of(st.dictionaries(names, item, max_size=3), junk)


@st.composite
def model_value(draw: st.DrawFn, model: type[BaseModel], depth: int = 0) -> dict[Any, Any]:
    """A mapping for `model`: most of its required keys, some optional ones, and
    now and then a key that belongs elsewhere or nowhere."""
    out: dict[Any, Any] = {}
    for name, field in model.model_fields.items():
        wanted = draw(st.integers(0, 9)) > 0 if field.is_required() else draw(st.booleans())
        if wanted:
            out[name] = draw(value_of(shape_of(field.annotation), depth + 1))
    extra = draw(st.dictionaries(st.one_of(st.sampled_from(KEYS), small_text), junk, max_size=1))
    out.update({k: v for k, v in extra.items() if k not in out})
    return out


configs = st.one_of(model_value(Config), junk)


def dump(doc: Any, flow: bool) -> str:
    return yaml.safe_dump(doc, default_flow_style=flow, allow_unicode=True, sort_keys=False)


# YAML-ish fragments: joined at random they make every kind of (in)valid text
TOKENS = [
    "bots:", "store:", "http:", "defaults:", "guard:", "profiles:", "name:", "platform:",
    "backend:", "type: echo", "url:", "listen:", "turns:", "soft_limit:", "\n", "\n  ",
    "\n    ", "  ", "\t", "- ", "-", ": ", ":", ",", "{", "}", "[", "]", "'", '"', "&a ", "*a",
    "&b ", "*b", "<<: *a", "<<: ", "? ", "---", "...", "%YAML 1.1\n", "%TAG ! x:\n", "#",
    "!!str ", "!!int ", "!!binary ", "!!set ", "!!omap ", "!!python/object:os.system ",
    "!custom ", "|", ">", "~", "null", "true", "off", "on", "0x1F", "0o17", "1_000", "1:30",
    ".inf", ".nan", "-.inf", "1e400", "2001-12-14", "2001-13-45", "2001-12-14t21:59", "9" * 30,
    "9" * 5000, "${", "${A:-", "${" + SET + "}", "${" + UNSET + "}", "$$", "\\x00", "\\ud800",
    "\\U0010ffff", "\\UFFFFFFFF", "\\N", "\x00", "\x07", "\x85", "\u2028", "\ufeff", "\u202e",
    "é", "🤖", "memory://", "http: //", "echo", "helper",
]  # fmt: skip

yamlish = st.one_of(
    st.lists(st.sampled_from(TOKENS), max_size=40).map("".join),
    st.text(max_size=200),
    st.builds(
        lambda d, base, tail: (d * "[") + base + (d * "]") + tail,
        st.integers(0, 400),
        st.sampled_from(["", "1", "*a", "{a: 1}"]),
        st.sampled_from(["", "\nbots: x\n"]),
    ),
    st.builds(lambda d: "a: " + "{a: " * d + "1" + "}" * d, st.integers(0, 400)),
    st.builds(lambda d: "".join("  " * i + "a:\n" for i in range(d)), st.integers(0, 200)),
)
raw_bytes = st.one_of(
    st.binary(max_size=300),
    st.builds(
        lambda text, junk_bytes, at: (lambda b: b[:at] + junk_bytes + b[at:])(
            text.encode("utf-8", "surrogatepass")
        ),
        yamlish,
        st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xef\xbb\xbf", b"\x80\x80"]),
        st.integers(0, 200),
    ),
)


# -- the properties ----------------------------------------------------------------------


@pytest.mark.timeout(120)
@FUZZ
@given(text=yamlish)
def test_yaml_ish_text_never_tracebacks(tmp_path: Path, text: str) -> None:
    check_text(tmp_path, text.encode("utf-8", "surrogatepass"))


@pytest.mark.timeout(120)
@FUZZ
@given(data=raw_bytes)
def test_arbitrary_bytes_never_traceback(tmp_path: Path, data: bytes) -> None:
    res = check_text(tmp_path, data)
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        assert res.code == 2 and "not UTF-8 text" in res.err, res.err


@pytest.mark.timeout(120)
@FUZZ
@given(doc=configs, flow=st.booleans())
def test_configs_built_from_the_schema_never_traceback(
    tmp_path: Path, doc: Any, flow: bool
) -> None:
    check_text(tmp_path, dump(doc, flow))


# -- one planted mistake in a valid config is named by its key path ---------------------------


def base_config() -> dict[str, Any]:
    """A valid config that sets every section (each backend type, each platform)."""
    profile = GuardProfile().model_dump(mode="json")
    profile["retry"]["prechecks"] = {"deploy": "^v[0-9]+$"}
    profile["subagents"]["tools"] = ["delegate"]
    profile["exempt_tools"] = ["read_file"]
    defaults = Policy().model_dump(mode="json")
    defaults["trusted_bots"] = ["42"]
    return {
        "store": {"url": "memory://", "state_ttl_seconds": 3600, "settings_ttl_seconds": 7200},
        "http": {"listen": "127.0.0.1:8080", "admin_token": "admin-secret"},
        "shutdown": {"grace_seconds": 5},
        "guard": {
            "session_ttl_seconds": 3600,
            "profiles": {"default": profile, "strict": {"steps": {"max_steps": 10}}},
        },
        "defaults": defaults,
        "llm_proxy": {
            "openai": {"upstream": "http://127.0.0.1:9", "api_key": "sk-x"},
            "anthropic": {"path": "/llm/claude"},
            "block_mode": "stop",
            "budget": {"usd": 1.5, "tokens": 100000},
            "prices": {"gpt-4o-mini": {"input": 0.15, "output": 0.6}},
            "timeouts": {"connect_seconds": 5},
        },
        "mcp_proxy": {"profile": "strict", "warn_note": False},
        "alerts": [
            {"type": "slack", "url": "https://hooks.example.invalid/x", "events": ["guard_block"]},
            {"type": "webhook", "url": "http://127.0.0.1:9/a", "headers": {"X-Key": "k"}},
        ],
        "bots": [
            {
                "name": "web",
                "platform": "http",
                "admins": {"user_ids": ["1"]},
                "backend": {
                    "type": "webhook",
                    "url": "http://127.0.0.1:9/hook",
                    "headers": {"Authorization": "Bearer x"},
                    "timeout_seconds": 5,
                    "context_messages": 4,
                    "breaker": {"failures": 3, "cooldown_seconds": 10},
                },
            },
            {
                "name": "disc",
                "platform": "discord",
                "token": "discord-token",
                "api_base": "http://127.0.0.1:9",
                "gateway_url": "ws://127.0.0.1:9/gw",
                "shard_count": 2,
                "shard_ids": [0, 1],
                "guild_ids": ["123"],
                "admins": {"user_ids": ["1"], "role_ids": ["2"]},
                "backend": {
                    "type": "openai",
                    "endpoint": "http://127.0.0.1:9/v1",
                    "api_key": "k",
                    "model": "m",
                    "system_prompt": "You are {name}.",
                    "max_tokens": 10,
                    "temperature": 0.5,
                },
            },
            {
                "name": "tele",
                "platform": "telegram",
                "token": "1:abc",
                "telegram": {"webhook_url": "https://example.invalid/hook", "secret_token": "s_1"},
                "backend": {"type": "python", "callable": "tests.sample_backends:polite"},
            },
            {
                "name": "echo",
                "platform": "http",
                "backend": {"type": "echo"},
                "turns": {"soft_limit": 3, "hard_limit": 5, "warn_soft": "{n}/{limit}"},
                "reply_decision": {
                    "enabled": True,
                    "endpoint": "http://127.0.0.1:9/v1/chat/completions",
                    "model": "m",
                    "prompt": "{identity}: {message}",
                },
            },
        ],
    }


KeyPath = tuple[str | int, ...]


def format_path(path: KeyPath) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def positions(value: Any, shape: Shape, path: KeyPath = ()) -> Iterator[tuple[KeyPath, Shape]]:
    """Every position of the schema at which `value` (valid) can be changed: each
    field of each model it holds, set or not, and each item of its lists and maps."""
    if shape.kind == "union":
        assert isinstance(value, dict)
        model = next(
            m
            for m in shape.models
            if value.get("type") in get_args(m.model_fields["type"].annotation)
        )
        shape = Shape("model", model=model)
    if shape.kind == "model":
        assert shape.model is not None and isinstance(value, dict)
        for name, sub in fields_of(shape.model).items():
            yield (*path, name), sub
            if name in value:
                yield from positions(value[name], sub, (*path, name))
    elif shape.kind == "list":
        assert shape.item is not None
        for i, item in enumerate(value):
            yield (*path, i), shape.item
            yield from positions(item, shape.item, (*path, i))
    elif shape.kind == "dict":
        assert shape.item is not None
        for key, item in value.items():
            yield (*path, key), shape.item
            yield from positions(item, shape.item, (*path, key))


BASE = base_config()
POSITIONS = list(dict(positions(BASE, SCHEMA)).items())


def is_set(path: KeyPath) -> bool:
    node: Any = BASE
    for part in path:
        if not isinstance(node, dict | list) or (isinstance(node, dict) and part not in node):
            return False
        node = node[part]
    return isinstance(node, dict)


MAPPINGS = [(p, s) for p, s in POSITIONS if s.kind in ("model", "union") and is_set(p)]
WRONG = {"zz_wrong": [1]}  # no position of the schema takes this (a mapping of a list)


def planted(path: KeyPath, value: Any) -> dict[str, Any]:
    doc = base_config()
    node: Any = doc
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return doc


def test_the_base_config_is_valid_and_reaches_every_model(tmp_path: Path) -> None:
    res = check_text(tmp_path, dump(BASE, flow=False))
    assert res.code == 0, res.err
    reached = {s.model for _, s in POSITIONS if s.model} | {
        m for _, s in POSITIONS for m in s.models
    }
    assert reached | {Config} >= set(MODELS)
    assert len(POSITIONS) > 150


@FUZZ
@given(where=st.sampled_from(POSITIONS), flow=st.booleans())
def test_a_wrong_value_anywhere_is_named_by_its_key_path(
    tmp_path: Path, where: tuple[KeyPath, Shape], flow: bool
) -> None:
    path, _ = where
    res = check_text(tmp_path, dump(planted(path, WRONG), flow))
    shown = format_path(path)
    assert res.code == 2, f"{shown} took {WRONG}"
    assert any(re.match(re.escape(shown) + r"[:.\[]", line) for line in res.problems), (
        shown,
        res.problems,
    )


@FUZZ
@given(where=st.sampled_from(MAPPINGS), key=st.sampled_from(["zz_unknown", *KEYS]))
def test_an_unknown_key_anywhere_is_named_by_its_key_path(
    tmp_path: Path, where: tuple[KeyPath, Shape], key: str
) -> None:
    path, shape = where
    model = shape.model or next(
        m for m in shape.models if planted_type(path) in get_args(m.model_fields["type"].annotation)
    )
    if key in model.model_fields:
        key = "zz_unknown"  # a real key of this section is no mistake
    doc = base_config()
    node: Any = doc
    for part in path:
        node = node[part]
    node[key] = 1
    res = check_text(tmp_path, dump(doc, flow=False))
    assert res.code == 2
    assert f"{format_path((*path, key))}: unknown key" in res.problems, res.problems


def planted_type(path: KeyPath) -> str:
    node: Any = BASE
    for part in path:
        node = node[part]
    return str(node["type"])


# -- fixed cases: each a clear error, quickly -------------------------------------------------


def billion_laughs(levels: int = 9, width: int = 9) -> str:
    lines = ["a: &a [" + ", ".join(['"lol"'] * width) + "]"]
    for i in range(1, levels + 1):
        prev = "a" if i == 1 else f"l{i - 1}"
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*{prev}"] * width) + "]")
    return "\n".join(lines) + "\n"


BOT = "bots:\n  - {name: helper, platform: http, backend: {type: echo}}\n"


def test_an_empty_file_says_a_bot_is_required(tmp_path: Path) -> None:
    res = check_text(tmp_path, b"")
    assert res.problems == [NO_BOTS]


def test_a_directory_a_missing_file_and_non_utf8_are_named(tmp_path: Path) -> None:
    res = check_config(tmp_path)
    assert_clean(res, tmp_path)
    assert res.problems == [f"{tmp_path}: is a directory, not a file"]
    missing = tmp_path / "absent.yml"
    res = check_config(missing)
    assert_clean(res, missing)
    assert res.problems == [f"{missing}: no such file"]
    res = check_text(tmp_path, BOT.encode() + b"# caf\xe9\n")
    offset = len(BOT) + len("# caf")
    assert res.problems == [
        f"{tmp_path / 'config.yml'}: not UTF-8 text (bad byte at offset {offset})"
    ]


def test_a_5_mb_file_is_refused_without_parsing_it(tmp_path: Path) -> None:
    big = BOT + ("# " + "x" * 78 + "\n") * (5 * 1024 * 1024 // 80)
    res = check_text(tmp_path, big)
    assert res.code == 2 and "larger than 1024 KiB" in res.err, res.err


def test_an_endless_device_is_refused() -> None:
    if not Path("/dev/zero").exists():
        pytest.skip("no /dev/zero here")
    res = check_config("/dev/zero")
    assert_clean(res, "/dev/zero")
    assert "larger than 1024 KiB" in res.err


@pytest.mark.timeout(30)
@pytest.mark.parametrize("where", ["top", "bots", "profiles", "defaults"])
def test_a_yaml_bomb_is_refused_quickly(tmp_path: Path, where: str) -> None:
    """Nine aliases of nine aliases...: a billion values. Once this hung for ever."""
    bomb = billion_laughs()
    if where == "bots":
        bomb += BOT.replace("backend:", "trusted_bots: *l9, backend:")
    elif where == "profiles":
        bomb += BOT + "guard:\n  profiles: {default: {exempt_tools: *l9}, strict: {x: *l9}}\n"
    elif where == "defaults":
        bomb += "defaults: {turns: {x: *l9}}\n" + BOT.replace(
            "backend:", "turns: {y: *l9}, backend:"
        )
    res = check_text(tmp_path, bomb)
    assert res.code == 2
    assert any("values once its aliases are expanded" in p for p in res.problems), res.problems


def test_a_mapping_bomb_through_merge_keys_is_refused(tmp_path: Path) -> None:
    lines = ["m0: &m0 {a: 1, b: 2, c: 3, d: 4, e: 5, f: 6, g: 7, h: 8}"]
    for i in range(1, 10):
        keys = ", ".join(f"k{j}: *m{i - 1}" for j in range(8))
        lines.append(f"m{i}: &m{i} {{{keys}}}")
    text = "\n".join(lines) + "\n" + BOT + "defaults: {<<: *m9}\n"
    res = check_text(tmp_path, text)
    assert res.code == 2


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            "store: {state_ttl_seconds: 1" + "0" * 5000 + "}\n",
            r"line 1, column 28: cannot read this value as int: Exceeds the limit \(4300 digits\)",
        ),
        (
            "bots: [2001-13-45]\n",
            r"line 1, column 8: cannot read this value as timestamp: month must be",
        ),
        ('bots: ["\\UFFFFFFFF"]\n', r"line 1, column \d+: cannot read this value"),
        ("bots: !!int\n", r"line 1, column 7: cannot read this value as int$"),
        ("bots: !!bool ''\n", r"line 1, column 7: cannot read this value as bool$"),
        ("bots: !!map [1]\n", "line 1, column 7: expected a mapping node, but found sequence"),
        ("bots: !!set 1\n", "line 1, column 7: expected a mapping node, but found scalar"),
        ('"\\n": 1\n' + BOT, r"^'\\n': unknown key$"),
        ('"": 1\n' + BOT, r"^'': unknown key$"),
        ('store: {"a\\u202eb": 1}\n' + BOT, r"^store\.'a\\u202eb': unknown key$"),
        ("bots: [a\x00b]\n", r"line 1, column 9: character U\+0000 is not allowed in YAML"),
        ("bots:\n  x: \x07\n", r"line 2, column 6: character U\+0007 is not allowed in YAML"),
        ("a: &a [*a]\n", r"a\[0\]: a recursive alias is not allowed"),
        ("a: " + "[" * 100_000 + "]" * 100_000 + "\n", "nested too deeply"),
        ("bots:\n\t- name: x\n", "line 2, column 1: found character '\\\\t'"),
        ("bots: !!python/object/apply:os.system ['true']\n", "could not determine a constructor"),
        ("a: 1\n---\nb: 2\n", "but found another document"),
        (
            "bots: [{name: a, platform: http, backend: {type: echo}, trusted_bots: ["
            + "[]," * 60_000
            + "]}]\n",
            r"bots\[0\]\.trusted_bots\[59999\]: must be a string",
        ),
        ("store: {url: '${A:-'}\n" + BOT, r"store\.url: malformed reference"),
        (
            "http: {listen: '${" + UNSET + "}'}\n" + BOT,
            f"http.listen: environment variable {UNSET} is not set",
        ),
        (
            "bots: [{name: a, platform: http, backend: {type: echo, openai: 1}}]\n",
            r"^bots\[0\]\.backend\.openai: unknown key$",
        ),
    ],
    ids=[
        "int-past-4300-digits",
        "month-13",
        "escape-past-unicode",
        "empty-int",
        "empty-bool",
        "map-tag-on-a-list",
        "set-tag-on-a-scalar",
        "newline-key",
        "empty-key",
        "rtl-key",
        "nul",
        "bell",
        "recursive-alias",
        "deep-nesting",
        "tab-indent",
        "python-tag",
        "two-documents",
        "60k-bad-items",
        "broken-interpolation",
        "unset-variable",
        "key-spelt-like-a-backend-type",
    ],
)
def test_inputs_that_once_broke_it(tmp_path: Path, text: str, problem: str) -> None:
    """The first seven were tracebacks, the odd keys broke the one-line-per-problem
    rule, the NUL was an unreadable two-line message,
    the 60k bad items a quadratic hang; a key spelt like a backend type lost
    its name (`bots[0].backend: unknown key`)."""
    res = check_text(tmp_path, text)
    assert res.code == 2
    assert any(re.search(problem, p) for p in res.problems), res.problems


def test_deep_nesting_at_every_depth_is_an_answer(tmp_path: Path) -> None:
    """Around the recursion limit every stage (parser, alias check, interpolation,
    validation) must either finish or say "nested too deeply"."""
    for depth in (10, 100, 150, 200, 250, 300, 320, 340, 360, 400, 500, 1000):
        for text in (
            "bots: " + "[" * depth + "]" * depth + "\n",
            "defaults: " + "{turns: " * depth + "1" + "}" * depth + "\n",
            "guard: {profiles: {default: " + "{a: " * depth + "'${A:-'" + "}" * depth + "}}\n",
        ):
            check_text(tmp_path, text)
