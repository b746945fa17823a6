"""Configuration: YAML -> validated settings, with errors that name the key path."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from gateway.config import (
    DEFAULT_WARN_HARD,
    DEFAULT_WARN_SOFT,
    Config,
    ConfigError,
    load_config,
    parse_config,
)
from gateway.store.redis import SentinelUrl

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "config.example.yml"

ONE_BOT = """
bots:
  - name: helper
    platform: http
    backend: {type: echo}
"""

NO_BOTS = "bots: at least one bot is required (or an llm_proxy or mcp_proxy section)"


def problems(text: str, env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, env={} if env is None else env)
    assert str(info.value) == "\n".join(info.value.problems)
    return info.value.problems


# --- the example and the defaults ----------------------------------------------


def test_example_config_loads_as_is_without_any_environment() -> None:
    cfg = load_config(EXAMPLE, env={})
    assert cfg.store.url == "memory://"
    assert cfg.http.admin_token is None
    assert [b.name for b in cfg.bots] == ["helper"]
    bot = cfg.bot("helper")
    assert bot.platform == "http"
    assert bot.backend.type == "echo"
    assert bot.token is None
    assert bot.reply_decision.enabled is False
    assert bot.reply_decision.endpoint is None


def test_example_config_reads_the_admin_token_from_the_environment() -> None:
    cfg = load_config(str(EXAMPLE), env={"BOTBOUNCER_ADMIN_TOKEN": "s3cret-admin"})
    assert cfg.http.admin_token is not None
    assert cfg.http.admin_token.get_secret_value() == "s3cret-admin"


def test_example_config_states_every_default() -> None:
    # The example documents every key with its default value: keep them in step.
    assert load_config(EXAMPLE, env={}).defaults == Config.default().defaults


def test_defaults_applied_when_omitted() -> None:
    cfg = parse_config(ONE_BOT, env={})
    bot = cfg.bots[0]
    assert (bot.turns.soft_limit, bot.turns.hard_limit) == (20, 100)
    assert bot.turns.warn_soft == DEFAULT_WARN_SOFT
    assert bot.turns.warn_hard == DEFAULT_WARN_HARD
    assert DEFAULT_WARN_HARD.format(n=100) == (
        "🛑 Hard bot turn limit reached (100). A human must reply to continue."
    )
    assert (bot.pairs.max_events, bot.pairs.window_seconds, bot.pairs.cooldown_seconds) == (
        20,
        60.0,
        60.0,
    )
    assert bot.bot_messages == "off"
    assert bot.trusted_bots == ()
    assert bot.respond_to == "mentions"
    assert (bot.rate_cap.max_replies, bot.rate_cap.window_seconds, bot.rate_cap.scope) == (
        6,
        120.0,
        "groups",
    )
    rd = bot.reply_decision
    assert (rd.enabled, rd.timeout_seconds, rd.max_tokens, rd.context_messages, rd.scope) == (
        False,
        5.0,
        1024,
        8,
        "groups",
    )
    assert (cfg.store.url, cfg.store.state_ttl_seconds, cfg.store.settings_ttl_seconds) == (
        "memory://",
        604800,
        7776000,
    )
    assert (cfg.http.listen, cfg.http.host, cfg.http.port) == ("127.0.0.1:8080", "127.0.0.1", 8080)


def test_builtin_default_config_has_one_http_echo_bot_named_bot() -> None:
    cfg = Config.default()
    assert [(b.name, b.platform, b.backend.type) for b in cfg.bots] == [("bot", "http", "echo")]
    assert cfg.bots[0].rate_cap.max_replies == 6


def test_unknown_bot_name_lists_the_configured_ones() -> None:
    cfg = parse_config(ONE_BOT + "  - {name: other, platform: http, backend: {type: echo}}\n")
    with pytest.raises(KeyError) as info:
        cfg.bot("nope")
    assert str(info.value) == "no bot named 'nope' (configured: helper, other)"


# --- defaults and per-bot overrides ----------------------------------------------


def test_bot_overrides_one_leaf_and_inherits_the_rest_of_defaults() -> None:
    cfg = parse_config(
        """
defaults:
  turns: {soft_limit: 5, hard_limit: 50}
  rate_cap: {max_replies: 3, scope: all}
  bot_messages: mentions
bots:
  - name: a
    platform: http
    backend: {type: echo}
    turns: {soft_limit: 7}
    trusted_bots: [123, "abc"]
  - name: b
    platform: http
    backend: {type: echo}
""",
        env={},
    )
    a, b = cfg.bots
    assert (a.turns.soft_limit, a.turns.hard_limit) == (7, 50)
    assert (b.turns.soft_limit, b.turns.hard_limit) == (5, 50)
    assert (a.rate_cap.max_replies, a.rate_cap.scope) == (3, "all")
    assert a.bot_messages == b.bot_messages == "mentions"
    assert a.trusted_bots == ("123", "abc")
    assert cfg.defaults.turns.soft_limit == 5


def test_empty_sections_mean_all_defaults() -> None:
    # A section whose keys are all commented out parses as null.
    text = "store:\nhttp:\ndefaults:\n  pairs:\n  turns: {soft_limit: 3}\n" + ONE_BOT
    cfg = parse_config(text + "    turns:\n    admins:\n")
    assert cfg.store.url == "memory://"
    assert cfg.http.listen == "127.0.0.1:8080"
    assert cfg.defaults.pairs.max_events == 20
    assert cfg.bots[0].turns.soft_limit == 3  # a null section does not erase defaults
    assert cfg.bots[0].admins.user_ids == ()


def test_admin_ids_given_as_numbers_become_strings() -> None:
    text = ONE_BOT.replace("platform: http", "platform: discord") + "    token: t\n"
    text += "    admins: {user_ids: [42, '7'], role_ids: [99]}\n"
    admins = parse_config(text).bots[0].admins
    assert admins.user_ids == ("42", "7")
    assert admins.role_ids == ("99",)


def test_invalid_default_is_reported_once_at_defaults() -> None:
    text = "defaults: {rate_cap: {max_replies: 0}}\n" + ONE_BOT
    text += "  - {name: other, platform: http, backend: {type: echo}}\n"
    assert problems(text) == ["defaults.rate_cap.max_replies: must be >= 1"]


def test_bot_repeating_a_bad_default_value_is_reported_at_both() -> None:
    text = "defaults: {rate_cap: {max_replies: 0}}\n" + ONE_BOT + "    rate_cap: {max_replies: 0}\n"
    assert problems(text) == [
        "defaults.rate_cap.max_replies: must be >= 1",
        "bots[0].rate_cap.max_replies: must be >= 1",
    ]


def test_bot_error_is_named_by_its_path() -> None:
    assert problems(ONE_BOT + "    rate_cap: {max_replies: 0}\n") == [
        "bots[0].rate_cap.max_replies: must be >= 1"
    ]


# --- unknown keys and types --------------------------------------------------------


def test_unknown_keys_are_named_by_path_at_every_depth() -> None:
    text = """
colour: blue
store: {url: "memory://", ttl: 5}
defaults:
  pairs: {max_events: 3, burst: 1}
bots:
  - name: helper
    platform: http
    backend: {type: echo, url: "http://x"}
    admins: {user_ids: [], groups: []}
    reply_decision: {enabled: false, temperature: 0}
"""
    assert problems(text) == [
        "store.ttl: unknown key",
        "defaults.pairs.burst: unknown key",
        "bots[0].reply_decision.temperature: unknown key",
        "bots[0].backend.url: unknown key",
        "bots[0].admins.groups: unknown key",
        "colour: unknown key",
    ]


def test_type_errors_have_short_messages() -> None:
    text = """
store: {state_ttl_seconds: 59, settings_ttl_seconds: soon}
defaults:
  pairs: {window_seconds: 0, cooldown_seconds: later}
  respond_to: everyone
  trusted_bots: abc
  reply_decision: {enabled: maybe, context_messages: 51, max_tokens: true}
  turns: 3
bots:
  - name: helper
    platform: irc
    backend: {type: shell}
    admins: [1]
"""
    assert problems(text) == [
        "store.state_ttl_seconds: must be >= 60",
        "store.settings_ttl_seconds: must be an integer",
        "defaults.turns: must be a mapping",
        "defaults.pairs.window_seconds: must be > 0",
        "defaults.pairs.cooldown_seconds: must be a number",
        "defaults.trusted_bots: must be a list",
        "defaults.respond_to: must be one of: mentions, all",
        "defaults.reply_decision.enabled: must be true or false",
        "defaults.reply_decision.max_tokens: must be an integer",
        "defaults.reply_decision.context_messages: must be <= 50",
        "bots[0].platform: must be one of: discord, telegram, slack, matrix, http",
        "bots[0].backend.type: must be one of: echo, webhook, openai, python",
        "bots[0].admins: must be a mapping",
    ]


def test_a_window_under_a_millisecond_is_refused_not_rounded_to_nothing() -> None:
    # The stores count in whole milliseconds: 0.0004 s would be a 0 ms window.
    text = f"""{ONE_BOT}
defaults:
  rate_cap: {{window_seconds: 0.0004}}
  pairs: {{window_seconds: 0.001}}
guard:
  profiles:
    default: {{retry: {{window_seconds: 0.0009}}}}
"""
    assert problems(text) == [
        "guard.profiles.default.retry.window_seconds: must be at least 0.001"
        " (one millisecond, the unit the store counts in)",
        "defaults.rate_cap.window_seconds: must be at least 0.001"
        " (one millisecond, the unit the store counts in)",
    ]


def test_missing_bot_fields_are_required() -> None:
    assert problems("bots: [{platform: http}]") == [
        "bots[0].name: is required",
        "bots[0].backend: is required (or mode: decide, for a bot that answers by itself)",
    ]


def test_bot_name_must_be_a_nonempty_string() -> None:
    assert problems("bots: [{name: '', platform: http, backend: {type: echo}}]") == [
        "bots[0].name: must not be empty"
    ]
    assert problems("bots: [{name: 5, platform: http, backend: {type: echo}}]") == [
        "bots[0].name: must be a string"
    ]


# --- the rules the validators enforce ---------------------------------------------


def test_a_soft_limit_at_or_above_the_hard_one_is_valid_and_noted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A hard stop only (OpenAB's default has its turn cap equal to its hard
    cap): valid, and check-config says what it means, exit 0."""
    from gateway.cli import main

    for text in ("defaults: {turns: {soft_limit: 100, hard_limit: 100}}\n" + ONE_BOT,
                 ONE_BOT + "    turns: {soft_limit: 101, hard_limit: 100}\n"):  # fmt: skip
        parse_config(text, env={})
        path = tmp_path / "c.yml"
        path.write_text(text)
        assert main(["check-config", "-c", str(path)]) == 0
        out = capsys.readouterr().out
        assert "note: " in out and "the hard limit stops a loop first" in out


def test_warning_template_may_use_only_n_and_limit() -> None:
    assert problems(ONE_BOT + "    turns: {warn_soft: 'stop at {foo}'}\n") == [
        "bots[0].turns.warn_soft: unknown placeholder {foo}; only {n} and {limit} may be used"
    ]
    assert problems(ONE_BOT + "    turns: {warn_hard: 'stop {n'}\n") == [
        "bots[0].turns.warn_hard: malformed template: expected '}' before end of string"
    ]
    assert problems(ONE_BOT + "    turns: {warn_hard: 'stop {}'}\n") == [
        "bots[0].turns.warn_hard: unknown placeholder {}; only {n} and {limit} may be used"
    ]
    cfg = parse_config(ONE_BOT + "    turns: {warn_soft: '{n} of {limit}, {{literal}}'}\n")
    assert cfg.bots[0].turns.warn_soft.format(n=3, limit=4) == "3 of 4, {literal}"


def test_unquoted_off_means_off_and_unquoted_on_is_explained() -> None:
    cfg = parse_config("defaults: {bot_messages: off}\n" + ONE_BOT + "    bot_messages: off\n")
    assert cfg.defaults.bot_messages == "off"
    assert cfg.bots[0].bot_messages == "off"
    assert problems(ONE_BOT + "    bot_messages: on\n") == [
        "bots[0].bot_messages: must be one of: off, mentions, all (an unquoted on/yes/true "
        'reads as a boolean: write all or mentions, or quote the value: "all")'
    ]


def test_discord_and_telegram_bots_need_a_token() -> None:
    text = """
bots:
  - {name: d, platform: discord, backend: {type: echo}}
  - {name: t, platform: telegram, backend: {type: echo}, token: ""}
  - {name: h, platform: http, backend: {type: echo}}
"""
    assert problems(text) == [
        "bots[0].token: is required for platform discord",
        "bots[1].token: is required for platform telegram",
    ]


def test_api_base_must_be_an_http_url() -> None:
    assert problems(ONE_BOT + "    api_base: 'ftp://proxy'\n") == [
        "bots[0].api_base: must be an http:// or https:// URL"
    ]
    cfg = parse_config(ONE_BOT + "    api_base: 'http://localhost:8081/bot'\n")
    assert cfg.bots[0].api_base == "http://localhost:8081/bot"


def test_duplicate_bot_names_rejected() -> None:
    text = ONE_BOT + "  - {name: helper, platform: http, backend: {type: echo}}\n"
    assert problems(text) == ["bots[1].name: duplicate bot name 'helper' (also bots[0])"]


@pytest.mark.parametrize("bots", ["bots: []", "bots:", ""])
def test_at_least_one_bot_is_required(bots: str) -> None:
    assert problems(bots) == [NO_BOTS]


SCHEMES = "memory://, redis://, rediss://, redis+cluster://, redis+sentinel://, rediss+sentinel://"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://localhost", f"unsupported scheme 'http'; use one of: {SCHEMES}"),
        ("mysql://db", f"unsupported scheme 'mysql'; use one of: {SCHEMES}"),
        ("localhost:6379", f"must be a URL starting with one of: {SCHEMES}"),
        ("redis://host:99999/0", "has an invalid port"),
        ("redis+sentinel://h1:26379,h2/mymaster", "sentinel 'h2' is not host:port"),
        (
            "redis+sentinel://:s3cret@h1:26379/",
            "names no service: redis+sentinel://host:port,.../<service>[/db]",
        ),
        (
            "redis+sentinel://h1:26379/mymaster/zero",
            "the path must be /<service> or /<service>/<db number>",
        ),
        ("redis+sentinel://h1:70000/mymaster", "sentinel 'h1:70000' is not host:port"),
    ],
)
def test_store_url_scheme_is_validated(url: str, message: str) -> None:
    assert problems(f"store: {{url: '{url}'}}\n" + ONE_BOT) == [f"store.url: {message}"]


@pytest.mark.parametrize(
    "url",
    [
        "memory://",
        "redis://localhost:6379/0",
        "rediss://h:6380",
        "redis+cluster://h:7000",
        "redis+sentinel://h1:26379,h2:26379,[::1]:26380/mymaster",
        "rediss+sentinel://user:pw@h1:26379/mymaster/3?sentinel_password=sp",
    ],
)
def test_store_url_accepts_the_supported_schemes(url: str) -> None:
    assert parse_config(f"store: {{url: '{url}'}}\n" + ONE_BOT).store.url == url


def test_a_sentinel_url_names_sentinels_service_db_and_passwords() -> None:
    url = SentinelUrl.parse("rediss+sentinel://u:p%40ss@h1:26379,[::1]:26380/my%20master/3"
                            "?sentinel_password=sp")  # fmt: skip
    assert url == SentinelUrl((("h1", 26379), ("::1", 26380)), "my master", 3, "u", "p@ss",
                              "sp", tls=True)  # fmt: skip
    plain = SentinelUrl.parse("redis+sentinel://h:1/m")
    assert (plain.db, plain.password, plain.tls) == (0, None, False)


def test_a_bad_sentinel_url_never_shows_its_password() -> None:
    [problem] = problems("store: {url: 'redis+sentinel://:hunter2@h1/mymaster'}\n" + ONE_BOT)
    assert "hunter2" not in problem and "is not host:port" in problem


@pytest.mark.parametrize(
    ("listen", "message"),
    [
        ("8080", 'must be "host:port", e.g. "127.0.0.1:8080"'),
        ("localhost:0", "port must be a number from 1 to 65535, got '0'"),
        ("localhost:65536", "port must be a number from 1 to 65535, got '65536'"),
        ("localhost:http", "port must be a number from 1 to 65535, got 'http'"),
        ("::1:8080", 'an IPv6 address must be in brackets, e.g. "[::1]:8080"'),
        ("[nope]:8080", "'nope' is not an IPv6 address"),
        ("bad host:8080", "'bad host' is not a valid host name or address"),
    ],
)
def test_bad_listen_address_rejected(listen: str, message: str) -> None:
    assert problems(f"http: {{listen: '{listen}'}}\n" + ONE_BOT) == [f"http.listen: {message}"]


def test_listen_accepts_ipv6_in_brackets() -> None:
    cfg = parse_config("http: {listen: '[::1]:9000'}\n" + ONE_BOT)
    assert (cfg.http.host, cfg.http.port) == ("::1", 9000)


def test_reply_decision_enabled_needs_endpoint_and_model() -> None:
    assert problems(ONE_BOT + "    reply_decision: {enabled: true, model: tiny}\n") == [
        "bots[0].reply_decision.endpoint: is required when enabled"
    ]
    assert problems("defaults: {reply_decision: {enabled: true}}\n" + ONE_BOT) == [
        "defaults.reply_decision.endpoint: is required when enabled",
        "defaults.reply_decision.model: is required when enabled",
    ]
    cfg = parse_config(
        ONE_BOT + "    reply_decision: {enabled: true, endpoint: 'http://llm/v1', model: m}\n"
    )
    assert cfg.bots[0].reply_decision.endpoint == "http://llm/v1"


# --- environment interpolation ------------------------------------------------------


def test_env_variable_is_substituted() -> None:
    text = ONE_BOT.replace("platform: http", "platform: discord") + '    token: "${TOK}"\n'
    token = parse_config(text, env={"TOK": "abc.def"}).bots[0].token
    assert token is not None
    assert token.get_secret_value() == "abc.def"


def test_unset_env_variable_is_an_error_naming_the_key_path() -> None:
    text = ONE_BOT + '    api_base: "${PROXY}"\n'
    assert problems(text) == ["bots[0].api_base: environment variable PROXY is not set"]


def test_env_default_used_when_unset_or_empty() -> None:
    text = "store: {url: '${REDIS_URL:-redis://localhost:6379/1}'}\n" + ONE_BOT
    assert parse_config(text, env={}).store.url == "redis://localhost:6379/1"
    assert parse_config(text, env={"REDIS_URL": ""}).store.url == "redis://localhost:6379/1"
    assert parse_config(text, env={"REDIS_URL": "memory://"}).store.url == "memory://"


def test_set_but_empty_variable_without_default_is_empty() -> None:
    text = ONE_BOT + '    turns: {warn_soft: "a${EMPTY}b"}\n'
    assert parse_config(text, env={"EMPTY": ""}).bots[0].turns.warn_soft == "ab"


def test_double_dollar_is_a_literal_dollar() -> None:
    text = ONE_BOT + '    turns: {warn_soft: "costs $$5, not ${X}$$"}\n'
    assert parse_config(text, env={"X": "$HOME"}).bots[0].turns.warn_soft == "costs $5, not $HOME$"


def test_interpolated_numbers_are_validated_as_numbers() -> None:
    text = ONE_BOT + "    rate_cap: {max_replies: '${CAP:-4}'}\n"
    assert parse_config(text, env={}).bots[0].rate_cap.max_replies == 4
    assert problems(text, env={"CAP": "lots"}) == [
        "bots[0].rate_cap.max_replies: must be an integer"
    ]


def test_env_defaults_to_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BB_TEST_LISTEN", "127.0.0.1:9999")
    cfg = parse_config("http: {listen: '${BB_TEST_LISTEN}'}\n" + ONE_BOT)
    assert cfg.http.port == 9999
    assert os.environ["BB_TEST_LISTEN"] == "127.0.0.1:9999"


# --- secrets --------------------------------------------------------------------------


def test_tokens_never_appear_in_repr_or_errors() -> None:
    secret = "xoxb-VERY-SECRET-42"
    text = f"""
store: {{url: "redis://user:{secret}@localhost:6379/0"}}
http: {{admin_token: "${{ADMIN}}"}}
defaults:
  reply_decision: {{api_key: "{secret}"}}
bots:
  - name: d
    platform: discord
    token: "${{TOK}}"
    backend: {{type: echo}}
"""
    env = {"TOK": secret, "ADMIN": secret}
    cfg = parse_config(text, env=env)
    assert cfg.bots[0].token is not None
    assert cfg.bots[0].token.get_secret_value() == secret
    for shown in (repr(cfg), str(cfg), repr(cfg.store), repr(cfg.bots[0])):
        assert secret not in shown
    assert "redis://user:***@localhost:6379/0" in repr(cfg.store)

    # A secret in the wrong place, or a bad value next to it, is not echoed.
    bad = text.replace("backend: {type: echo}", "backend: {type: echo}\n    turns: 0")
    bad = bad.replace("localhost:6379", "localhost:notaport")
    errors = problems(bad, env=env)
    assert errors == ["store.url: has an invalid port", "bots[0].turns: must be a mapping"]
    assert secret not in "\n".join(errors)
    errors = problems(text.replace('token: "${TOK}"', f"token: [{secret}]"), env=env)
    assert errors == ["bots[0].token: must be a string"]


# --- files and YAML ----------------------------------------------------------------------


def test_yaml_syntax_error_names_source_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "bad.yml"
    path.write_text("store:\n  url: [memory://\nbots: []\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert info.value.problems == [f"{path}: line 3, column 5: expected ',' or ']', but got ':'"]


def test_yaml_duplicate_key_is_an_error() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config("store: {}\nstore: {}\n", source="dup.yml")
    assert str(info.value) == "dup.yml: line 2, column 1: duplicate key 'store'"


def test_empty_file_means_no_bots(tmp_path: Path) -> None:
    path = tmp_path / "empty.yml"
    path.write_text("# nothing here\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert info.value.problems == [NO_BOTS]


@pytest.mark.parametrize("text", ["- a\n- b\n", "just text\n", "42\n"])
def test_top_level_must_be_a_mapping(text: str) -> None:
    assert problems(text) == ["(top level): must be a mapping"]


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yml"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.problems == [f"{path}: no such file"]


def test_directory_and_non_utf8_file_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path)
    assert info.value.problems == [f"{tmp_path}: is a directory, not a file"]
    path = tmp_path / "latin1.yml"
    path.write_bytes(b"bots: [\xff]\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.problems == [f"{path}: not UTF-8 text (bad byte at offset 7)"]


def test_recursive_alias_is_a_config_error() -> None:
    assert problems("x: &a [*a]\n") == ["x[0]: a recursive alias is not allowed"]


def test_config_error_joins_problems_with_newlines() -> None:
    err = ConfigError(["a: one", "b: two"])
    assert str(err) == "a: one\nb: two"
    assert err.problems == ["a: one", "b: two"]
    assert ConfigError("c: three").problems == ["c: three"]


def _commented_backends() -> list[str]:
    """Each `# backend:` alternative in config.example.yml, uncommented."""
    lines = (Path(__file__).resolve().parents[1] / "config.example.yml").read_text().splitlines()
    blocks: list[str] = []
    for i, line in enumerate(lines):
        if line == "    # backend:":
            block = ["backend:"]
            for follow in lines[i + 1 :]:
                if not follow.startswith("    #   "):
                    break
                block.append(follow[len("    # ") :])
            blocks.append("\n".join(block))
    return blocks


def test_every_commented_backend_in_the_example_is_valid() -> None:
    blocks = _commented_backends()
    assert len(blocks) == 3
    env = {"HELPER_WEBHOOK_TOKEN": "t", "OPENAI_API_KEY": "k"}
    for block in blocks:
        indented = "\n".join("    " + b for b in block.splitlines())
        text = f"bots:\n  - name: x\n    platform: http\n{indented}\n"
        backend = parse_config(text, env=env).bots[0].backend
        assert backend.type in ("webhook", "openai", "python")


@pytest.mark.parametrize(
    ("backend", "problem"),
    [
        (
            "{type: webhook, url: 'ftp://x'}",
            "bots[0].backend.url: must be an http:// or https:// URL",
        ),
        ("{type: webhook}", "bots[0].backend.url: is required"),
        (
            "{type: openai, endpoint: nope, model: m}",
            "bots[0].backend.endpoint: must be an http:// or https:// URL",
        ),
        (
            "{type: openai, endpoint: 'http://x/v1', model: m, system_prompt: 'hi {who}'}",
            "bots[0].backend.system_prompt: unknown placeholder {who}; only {name} may be used",
        ),
        (
            "{type: python, callable: 'no colon'}",
            "bots[0].backend.callable: must be 'package.module:function'",
        ),
        (
            "{type: webhook, url: 'http://x', breaker: {failures: 0}}",
            "bots[0].backend.breaker.failures: must be >= 1",
        ),
    ],
)
def test_backend_errors_name_the_key(backend: str, problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(f"bots:\n  - {{name: x, platform: http, backend: {backend}}}\n")
    assert err.value.problems == [problem]


def commented_bot(name: str, *, options: bool = False) -> str:
    """The example's commented-out bot `name`, uncommented; `options` also
    uncomments its optional keys (the `#   #` lines)."""
    text = EXAMPLE.read_text(encoding="utf-8")
    start = text.index(f"  # - name: {name}")
    lines = []
    for line in text[start:].splitlines():
        if not line.startswith("  # "):
            break
        if line.startswith("  #   # ") and options:
            line = "  #   " + line[len("  #   # ") :]
        if line.startswith("  #   #"):
            continue
        lines.append("  " + line[4:])
    return "bots:\n" + "\n".join(lines) + "\n"


def test_the_commented_discord_bot_in_the_example_is_valid() -> None:
    text = commented_bot("discord-helper")
    bot = parse_config(text, env={"DISCORD_TOKEN": "t"}).bots[0]
    assert (bot.platform, bot.bot_messages, bot.token is not None) == ("discord", "mentions", True)


def test_the_commented_telegram_bot_in_the_example_is_valid_in_both_modes() -> None:
    env = {"TELEGRAM_TOKEN": "1:t", "TELEGRAM_WEBHOOK_SECRET": "s-1"}
    polling = parse_config(commented_bot("telegram-helper"), env=env).bots[0]
    assert (polling.platform, polling.telegram.webhook_url) == ("telegram", None)
    hooked = parse_config(commented_bot("telegram-helper", options=True), env=env).bots[0]
    assert hooked.api_base == "http://127.0.0.1:8081"
    assert hooked.telegram.webhook_url == "https://bots.example.com/tg/helper"


NOT_DISCORD = "is a Discord setting; this bot's platform is http"


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        ("shard_count: 2", f"bots[0].shard_count: {NOT_DISCORD}"),
        ("guild_ids: [1]", f"bots[0].guild_ids: {NOT_DISCORD}"),
    ],
)
def test_discord_settings_belong_to_discord_bots(extra: str, problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(f"bots:\n  - {{name: x, platform: http, backend: {{type: echo}}, {extra}}}\n")
    assert err.value.problems == [problem]


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        ("gateway_url: 'http://x'", "bots[0].gateway_url: must be a ws:// or wss:// URL"),
        ("shard_ids: [0]", "bots[0]: shard_ids needs shard_count"),
        ("shard_count: 2, shard_ids: [2]", "bots[0]: shard_ids: 2 is not below shard_count (2)"),
        ("shard_count: 0", "bots[0].shard_count: must be >= 1"),
    ],
)
def test_discord_settings_are_checked(extra: str, problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        bot = f"{{name: x, platform: discord, token: t, backend: {{type: echo}}, {extra}}}"
        parse_config(f"bots:\n  - {bot}\n")
    assert err.value.problems[0].startswith(problem)


TELEGRAM = "{name: t, platform: telegram, token: tok, backend: {type: echo}"


def test_a_telegram_bot_polls_unless_a_webhook_is_configured() -> None:
    bot = parse_config(f"bots:\n  - {TELEGRAM}}}\n").bots[0]
    assert bot.telegram.webhook_url is None
    text = f"bots:\n  - {TELEGRAM}, telegram: {{webhook_url: 'https://b.example/tg', "
    text += "secret_token: '${TG_SECRET}'}}\n"
    hooked = parse_config(text, env={"TG_SECRET": "s3cr-et_"}).bots[0].telegram
    assert hooked.webhook_url == "https://b.example/tg"
    assert hooked.secret_token is not None
    assert hooked.secret_token.get_secret_value() == "s3cr-et_"
    assert "s3cr-et_" not in repr(hooked)
    limits = hooked.rate_limit
    assert (limits.overall_per_second, limits.group_per_minute) == (30, 20)  # Telegram's own
    text = f"bots:\n  - {TELEGRAM}, telegram: {{rate_limit: {{overall_per_second: 0}}}}}}\n"
    lifted = parse_config(text).bots[0].telegram.rate_limit
    assert (lifted.overall_per_second, lifted.group_per_minute) == (0, 20)


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        (
            "telegram: {webhook_url: 'https://b.example/tg'}",
            "bots[0].telegram: webhook_url needs secret_token: without it anyone who finds "
            "the URL can post updates",
        ),
        (
            "telegram: {secret_token: abc}",
            "bots[0].telegram: secret_token is only used with webhook_url",
        ),
        (
            "telegram: {webhook_url: 'https://b.example/tg', secret_token: 'a b'}",
            "bots[0].telegram.secret_token: must be 1-256 characters of A-Z, a-z, 0-9, _ and -",
        ),
        (
            "telegram: {webhook_url: 'ftp://b.example/tg', secret_token: ab}",
            "bots[0].telegram.webhook_url: must be an http:// or https:// URL",
        ),
        (
            "telegram: {webhook: 'https://b.example/tg'}",
            "bots[0].telegram.webhook: unknown key",
        ),
        (
            "telegram: {rate_limit: {group_per_minute: -1}}",
            "bots[0].telegram.rate_limit.group_per_minute: must be >= 0",
        ),
        (
            "telegram: {rate_limit: {per_second: 5}}",
            "bots[0].telegram.rate_limit.per_second: unknown key",
        ),
        (
            "admins: {role_ids: [5]}",
            "bots[0].admins: role_ids: telegram has no roles; list people under user_ids",
        ),
        (
            "guild_ids: [1]",
            "bots[0].guild_ids: is a Discord setting; this bot's platform is telegram",
        ),
    ],
)
def test_telegram_settings_are_checked(extra: str, problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(f"bots:\n  - {TELEGRAM}, {extra}}}\n")
    assert err.value.problems == [problem]


def test_telegram_settings_belong_to_telegram_bots() -> None:
    text = "bots:\n  - {name: x, platform: http, backend: {type: echo}, "
    text += "telegram: {webhook_url: 'https://b.example/tg', secret_token: ab}}\n"
    with pytest.raises(ConfigError) as err:
        parse_config(text)
    assert err.value.problems == [
        "bots[0].telegram: is a Telegram setting; this bot's platform is http"
    ]


def test_the_examples_guard_section_shows_the_built_in_defaults() -> None:
    from gateway.config import GuardConfig, GuardProfile, load_config

    config = load_config(str(EXAMPLE))
    assert config.guard.profiles == {"default": GuardProfile()}
    assert config.guard.session_ttl_seconds == GuardConfig().session_ttl_seconds


@pytest.mark.parametrize(
    ("guard", "problem"),
    [
        ("{profiles: {default: {identical: {warn_at: 3, block_at: 2}}}}",
         "guard.profiles.default.identical: warn_at must not be greater than block_at"),
        ("{profiles: {default: {retry: {prechecks: {t: '('}}}}}",
         "guard.profiles.default.retry.prechecks.t: is not a valid regular expression: "
         "missing ), unterminated subpattern at position 0"),
        ("{profiles: {'bad name': {}}}",
         "guard.profiles: profile name 'bad name': use 1-64 of A-Z a-z 0-9 _ . -"),
        ("{profiles: {strict: {steps: {max_steps: 0}}}}",
         "guard.profiles.strict.steps.max_steps: must be >= 1"),
        ("{profiles: {default: {fixation: {similarity: 1.5}}}}",
         "guard.profiles.default.fixation.similarity: must be <= 1"),
        ("{profiles: {default: {budget: {usd: -1}}}}",
         "guard.profiles.default.budget.usd: must be > 0"),
    ],
)  # fmt: skip
def test_guard_profiles_are_checked(guard: str, problem: str) -> None:
    assert problems(f"guard: {guard}\n" + ONE_BOT) == [problem]


def test_a_named_guard_profile_inherits_from_default() -> None:
    text = "guard: {profiles: {default: {steps: {max_steps: 9}}, b: {identical: {warn_at: 1, "
    text += "block_at: 1}}}}\n" + ONE_BOT
    profiles = parse_config(text).guard.profiles
    assert profiles["b"].steps.max_steps == 9
    assert profiles["b"].identical.block_at == 1
    assert profiles["default"].identical.block_at == 3


# --- Slack ---------------------------------------------------------------------

SLACK = "{name: s, platform: slack, token: xoxb-1-bot, backend: {type: echo}"


def test_a_slack_bot_uses_socket_mode_unless_told_events() -> None:
    env = {"SLACK_APP": "xapp-1-A0-secret-app", "SLACK_SIGNING": "s1gn1ng-secret"}
    text = f"bots:\n  - {SLACK}, slack: {{app_token: '${{SLACK_APP}}'}}}}\n"
    bot = parse_config(text, env=env).bots[0]
    assert bot.slack is not None and bot.token is not None
    assert (bot.slack.mode, bot.slack.signing_secret) == ("socket", None)
    assert bot.slack.app_token is not None
    assert bot.slack.app_token.get_secret_value() == "xapp-1-A0-secret-app"
    assert "xapp-1-A0-secret-app" not in repr(bot) and "xoxb-1-bot" not in repr(bot)
    text = f"bots:\n  - {SLACK}, slack: {{mode: events, signing_secret: '${{SLACK_SIGNING}}'}}}}\n"
    events = parse_config(text, env=env).bots[0].slack
    assert events is not None and (events.mode, events.app_token) == ("events", None)
    assert events.signing_secret is not None
    assert events.signing_secret.get_secret_value() == "s1gn1ng-secret"


def test_the_commented_slack_bot_in_the_example_is_valid() -> None:
    env = {"SLACK_BOT_TOKEN": "xoxb-1-t", "SLACK_APP_TOKEN": "xapp-1-t"}
    for options in (False, True):
        bot = parse_config(commented_bot("slack-helper", options=options), env=env).bots[0]
        assert (bot.platform, bot.bot_messages) == ("slack", "mentions")
        assert bot.slack is not None and bot.slack.mode == "socket"
        assert bot.api_base == ("http://127.0.0.1:8082/api/" if options else None)


def test_the_commented_matrix_bot_in_the_example_is_valid() -> None:
    bot = parse_config(commented_bot("matrix-helper"), env={"MATRIX_TOKEN": "syt_t"}).bots[0]
    assert (bot.platform, bot.bot_messages) == ("matrix", "mentions")
    assert bot.matrix is not None
    assert (bot.matrix.user_id, bot.matrix.auto_join) == ("@helper:example.org", ("example.org",))


@pytest.mark.parametrize(
    ("bot", "problem"),
    [
        (
            "{name: s, platform: slack, token: xoxb-1, backend: {type: echo}}",
            "bots[0]: slack: is required for platform slack: app_token (Socket Mode) or "
            "mode: events with signing_secret",
        ),
        (
            "{name: s, platform: slack, backend: {type: echo}, slack: {app_token: xapp-1}}",
            "bots[0].token: is required for platform slack",
        ),
        (  # the app token where the bot token goes
            "{name: s, platform: slack, token: xapp-1-A0-secret, backend: {type: echo}, "
            "slack: {app_token: xapp-1-A0-secret}}",
            "bots[0].token: a Slack bot's token is its bot token (xoxb-...), under "
            "OAuth & Permissions",
        ),
        (  # the bot token where the app token goes
            f"{SLACK}, slack: {{app_token: xoxb-1-secret-bot}}}}",
            "bots[0].slack.app_token: must be an app-level token (xapp-...), made under "
            "Basic Information",
        ),
        (  # a user token is no bot token either
            "{name: s, platform: slack, token: xoxp-1-user, backend: {type: echo}, "
            "slack: {app_token: xapp-1}}",
            "bots[0].token: a Slack bot's token is its bot token (xoxb-...), under "
            "OAuth & Permissions",
        ),
        (
            f"{SLACK}, slack: {{}}}}",
            "bots[0].slack: app_token: is required for Socket Mode (or mode: events with "
            "signing_secret)",
        ),
        (
            f"{SLACK}, slack: {{mode: events}}}}",
            "bots[0].slack: signing_secret: is required for mode: events: without it anyone "
            "who finds the URL can post events",
        ),
        (
            f"{SLACK}, slack: {{mode: events, app_token: xapp-1}}}}",
            "bots[0].slack: signing_secret: is required for mode: events: without it anyone "
            "who finds the URL can post events",
        ),
        (
            f"{SLACK}, slack: {{app_token: xapp-1, signing_secret: s}}}}",
            "bots[0].slack: signing_secret: is only used with mode: events",
        ),
        (
            f"{SLACK}, slack: {{mode: events, signing_secret: s, app_token: xapp-1}}}}",
            "bots[0].slack: app_token: is only used with mode: socket",
        ),
        (
            f"{SLACK}, slack: {{mode: webhook, signing_secret: s}}}}",
            "bots[0].slack.mode: must be one of: socket, events",
        ),
        (f"{SLACK}, slack: {{apptoken: xapp-1}}}}", "bots[0].slack.apptoken: unknown key"),
        (
            f"{SLACK}, slack: {{app_token: xapp-1}}, admins: {{role_ids: [R1]}}}}",
            "bots[0].admins: role_ids: slack has no roles; list people under user_ids",
        ),
        (
            f"{SLACK}, slack: {{app_token: xapp-1}}, guild_ids: [1]}}",
            "bots[0].guild_ids: is a Discord setting; this bot's platform is slack",
        ),
        (
            f"{SLACK}, slack: {{app_token: xapp-1}}, "
            "telegram: {webhook_url: 'https://x.example/t', secret_token: ab}}",
            "bots[0].telegram: is a Telegram setting; this bot's platform is slack",
        ),
        (
            "{name: s, platform: slack, mode: decide, slack: {app_token: xapp-1}}",
            "bots[0]: slack: a decide bot keeps its own connection",
        ),
        (
            "{name: s, platform: slack, mode: decide, token: xoxb-1}",
            "bots[0].token: a decide bot keeps its token: botbouncer never connects for it",
        ),
    ],
)
def test_slack_settings_are_checked(bot: str, problem: str) -> None:
    assert problems(f"bots:\n  - {bot}\n") == [problem]
    for token in re.findall(r"\bx(?:oxb|oxp|app)-[\w-]+", bot):
        assert token not in problem  # a token in the wrong place is still a secret


@pytest.mark.parametrize("platform", ["http", "telegram", "discord"])
def test_a_slack_section_belongs_to_a_slack_bot(platform: str) -> None:
    token = "" if platform == "http" else ", token: t"
    bot = f"{{name: x, platform: {platform}{token}, backend: {{type: echo}}, "
    bot += "slack: {app_token: xapp-1}}"
    assert problems(f"bots:\n  - {bot}\n") == [
        f"bots[0].slack: is a Slack setting; this bot's platform is {platform}"
    ]


def test_a_mixed_up_token_is_never_echoed() -> None:
    """A token pasted in the wrong place is still a secret: the problem names
    the key, never the value."""
    swapped = ("{name: s, platform: slack, token: xapp-1-A0-topsecret1, backend: {type: echo}, "
               "slack: {app_token: xoxb-1-topsecret2}}")  # fmt: skip
    found = problems(f"bots:\n  - {swapped}\n")
    assert len(found) == 2
    assert not [p for p in found if "topsecret" in p]


def test_a_decide_mode_slack_bot_needs_no_token_or_slack_section() -> None:
    bot = parse_config("bots:\n  - {name: s, platform: slack, mode: decide}\n").bots[0]
    assert (bot.mode, bot.token, bot.slack) == ("decide", None, None)


# --- Matrix ----------------------------------------------------------------------------

MATRIX = "{name: m, platform: matrix, token: syt_topsecret, backend: {type: echo}"
HOMESERVER = "homeserver: 'https://matrix.example.org', user_id: '@helper:example.org'"


def test_a_matrix_bot_reads_its_homeserver_account_and_auto_join() -> None:
    text = f"{MATRIX}, matrix: {{{HOMESERVER}, auto_join: ['@alice:example.org', example.org, "
    text += "'localhost:8448']}}"
    bot = parse_config(f"bots:\n  - {text}\n").bots[0]
    assert bot.matrix is not None and bot.token is not None
    assert (bot.matrix.homeserver, bot.matrix.user_id) == (
        "https://matrix.example.org",
        "@helper:example.org",
    )
    assert bot.matrix.auto_join == ("@alice:example.org", "example.org", "localhost:8448")
    assert bot.token.get_secret_value() == "syt_topsecret"
    bare = parse_config(f"bots:\n  - {MATRIX}, matrix: {{{HOMESERVER}}}}}\n").bots[0]
    assert bare.matrix is not None and bare.matrix.auto_join == ()  # joins nothing by itself


@pytest.mark.parametrize(
    ("bot", "problem"),
    [
        (f"{MATRIX}}}", "bots[0]: matrix: is required for platform matrix: homeserver and user_id"),
        (
            f"{MATRIX}, matrix: {{homeserver: 'https://matrix.example.org', user_id: helper}}}}",
            "bots[0].matrix.user_id: must be a Matrix user id like @bot:example.org, not 'helper'",
        ),
        (
            f"{MATRIX}, matrix: {{homeserver: 'https://m.example.org', user_id: '@helper'}}}}",
            "bots[0].matrix.user_id: must be a Matrix user id like @bot:example.org, not '@helper'",
        ),
        (
            f"{MATRIX}, matrix: {{homeserver: 'https://m.example.org', "
            "user_id: '@hel per:example.org'}}",
            "bots[0].matrix.user_id: must be a Matrix user id like @bot:example.org, "
            "not '@hel per:example.org'",
        ),
        (
            f"{MATRIX}, matrix: {{{HOMESERVER}, auto_join: ['not a server!']}}}}",
            "bots[0].matrix.auto_join: 'not a server!' is neither a user id "
            "(@alice:example.org) nor a server name (example.org)",
        ),
        (
            f"{MATRIX}, matrix: {{{HOMESERVER}, auto_join: [example.org, '@alice']}}}}",
            "bots[0].matrix.auto_join: '@alice' is neither a user id (@alice:example.org) "
            "nor a server name (example.org)",
        ),
        (
            f"{MATRIX}, matrix: {{{HOMESERVER}, auto_join: ['']}}}}",
            "bots[0].matrix.auto_join[0]: must not be empty",
        ),
        (
            f"{MATRIX}, matrix: {{{HOMESERVER}}}, api_base: 'https://matrix.example.org'}}",
            "bots[0]: api_base: a Matrix bot's server is matrix.homeserver",
        ),
        (
            f"{MATRIX}, matrix: {{homeserver: matrix.example.org, user_id: '@h:example.org'}}}}",
            "bots[0].matrix.homeserver: must be an http:// or https:// URL",
        ),
        (
            f"{MATRIX}, matrix: {{user_id: '@helper:example.org'}}}}",
            "bots[0].matrix.homeserver: is required",
        ),
        (
            f"{MATRIX}, matrix: {{{HOMESERVER}, autojoin: [example.org]}}}}",
            "bots[0].matrix.autojoin: unknown key",
        ),
        (
            "{name: m, platform: matrix, backend: {type: echo}, matrix: {" + HOMESERVER + "}}",
            "bots[0].token: is required for platform matrix",
        ),
        (
            f"{MATRIX}, matrix: {{{HOMESERVER}}}, admins: {{role_ids: [R1]}}}}",
            "bots[0].admins: role_ids: matrix has no roles; list people under user_ids",
        ),
        (
            "{name: m, platform: matrix, mode: decide, matrix: {" + HOMESERVER + "}}",
            "bots[0]: matrix: a decide bot keeps its own connection",
        ),
        (
            "{name: m, platform: matrix, mode: decide, token: syt_topsecret}",
            "bots[0].token: a decide bot keeps its token: botbouncer never connects for it",
        ),
    ],
)
def test_matrix_settings_are_checked(bot: str, problem: str) -> None:
    assert problems(f"bots:\n  - {bot}\n") == [problem]
    assert "topsecret" not in problem


@pytest.mark.parametrize("platform", ["http", "telegram", "discord", "slack"])
def test_a_matrix_section_belongs_to_a_matrix_bot(platform: str) -> None:
    extra = {"http": "", "telegram": ", token: t", "discord": ", token: t",
             "slack": ", token: xoxb-1, slack: {app_token: xapp-1}"}[platform]  # fmt: skip
    bot = f"{{name: x, platform: {platform}{extra}, backend: {{type: echo}}, "
    bot += f"matrix: {{{HOMESERVER}}}}}"
    assert problems(f"bots:\n  - {bot}\n") == [
        f"bots[0].matrix: is a Matrix setting; this bot's platform is {platform}"
    ]


def test_a_decide_mode_matrix_bot_needs_no_token_or_matrix_section() -> None:
    bot = parse_config("bots:\n  - {name: m, platform: matrix, mode: decide}\n").bots[0]
    assert (bot.mode, bot.token, bot.matrix, bot.backend) == ("decide", None, None, None)
    named = "bots:\n  - {name: m, platform: matrix, mode: decide, user_id: '@m:example.org'}\n"
    assert parse_config(named).bots[0].user_id == "@m:example.org"
