"""What deploy/ ships, checked against the daemon it deploys (docs/deploy.md).

- The Prometheus rules and the Grafana dashboard name only metrics and labels
  a real daemon exports (read from its GET /metrics after some traffic), and
  only label values the daemon writes; promtool checks the rules, runs their
  unit tests, and parses every dashboard query.
- The dashboard has what Grafana's import needs (a JSON schema).
- The systemd unit passes `systemd-analyze verify` and `security`, and the
  daemon runs under W^X (MemoryDenyWriteExecute=yes) as it asks.
- No Docker engine runs here, so the Dockerfile and compose file are checked
  by structure: the image's user, port, signal, health check and command, the
  build context .dockerignore leaves, compose's services, health checks and
  order. The container's config (deploy/botbouncer.yml) is checked and run,
  and the image's HEALTHCHECK command is run against it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import aiohttp
import pytest
import yaml

from gateway.cli import build_parser
from gateway.config import load_config, parse_config
from gateway.daemon import Daemon
from gateway.model import Action, Reason, Turn
from tests.fakes.llm import FakeLLM, answer
from tests.fakes.webhook import FakeWebhook
from tests.redis_server import delete_matching, free_port

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
RULES = DEPLOY / "prometheus" / "botbouncer-rules.yml"
RULE_TESTS = DEPLOY / "prometheus" / "botbouncer-rules.test.yml"
DASHBOARD = DEPLOY / "grafana" / "botbouncer-dashboard.json"
UNIT = DEPLOY / "systemd" / "botbouncer.service"
COMPOSE = DEPLOY / "compose.yml"
CONTAINER_CONFIG = DEPLOY / "botbouncer.yml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
BOTBOUNCER = Path(sys.executable).parent / "botbouncer"
CONFIG_IN_IMAGE = "/etc/botbouncer/botbouncer.yml"


def rules() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


# -- PromQL, as far as these files use it -----------------------------------------

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_SELECTOR = re.compile(r"(?<![\w:])([a-zA-Z_:][\w:]*)?\s*\{([^}]*)\}")
_MATCHER = re.compile(r'([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_IDENT = re.compile(r"(?<![\w:.$])[a-zA-Z_:][\w:]*")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}
# Labels Prometheus adds to every scraped series.
TARGET_LABELS = {"job", "instance"}


def metric_names(expr: str) -> set[str]:
    """The series names an expression reads: identifiers left once strings,
    label matchers, ranges and grouping clauses are gone, that are not
    functions (followed by a parenthesis) or keywords."""
    text = _STRING.sub('""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for m in _IDENT.finditer(text):
        rest = text[m.end() :].lstrip()
        if not rest.startswith("(") and m.group() not in _KEYWORDS:
            names.add(m.group())
    return names


def selectors(expr: str) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """Each `name{matchers}`: the name and its (label, operator, value) matchers."""
    out = []
    for m in _SELECTOR.finditer(expr):
        assert m.group(1), f"a selector without a metric name in {expr!r}"
        out.append((m.group(1), _MATCHER.findall(m.group(2))))
    return out


def grouping_labels(expr: str) -> set[str]:
    text = _STRING.sub('""', expr)
    return {label.strip() for m in _GROUPING.finditer(text) for label in m.group(1).split(",")}


def test_the_promql_reader_finds_names_labels_and_groupings() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (job, le) (rate(a_bucket{x=~"y|z", job="j"}[5m])))'
        " > 2.5 and on (job) sum without (kind) (increase(b_total[$__range] offset 1h)) > 1e3"
        " or up == 0"
    )
    assert metric_names(expr) == {"a_bucket", "b_total", "up"}
    assert selectors(expr) == [("a_bucket", [("x", "=~", "y|z"), ("job", "=", "j")])]
    assert grouping_labels(expr) == {"job", "le", "kind"}


def rule_exprs() -> dict[str, str]:
    return {r["alert"]: r["expr"] for r in rules()}


def dashboard_exprs() -> dict[str, str]:
    """Every query: panel targets, and the selectors of label_values() variables."""
    out = {}
    for p in panels():
        for t in p["targets"]:
            out[f"panel {p['id']} ({p['title']}) {t['refId']}"] = t["expr"]
    for var in dashboard()["templating"]["list"]:
        if var["type"] == "query":
            m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", var["definition"])
            assert m, f"variable {var['name']}: {var['definition']}"
            out[f"variable {var['name']}"] = f"sum by ({m.group(2)}) ({m.group(1)})"
    return out


# -- a real daemon's /metrics ------------------------------------------------------


def exposed(text: str) -> dict[str, set[str]]:
    """Series name -> its label names, from the samples of a /metrics page."""
    out: dict[str, set[str]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s", line)
        assert m, line
        out.setdefault(m.group(1), set()).update(re.findall(r'([a-zA-Z_]\w*)="', m.group(2) or ""))
    return out


async def scrape_after_traffic() -> str:
    """A daemon with a bot, the LLM proxy and an alert target, after one
    answered message, an agent blocked (which sends an alert), one proxied
    model call and one whose upstream is down: every labelled counter has a
    sample."""
    async with FakeLLM() as llm, FakeWebhook() as hook:
        llm.default = answer("Fine.", usage=(12, 3))
        config = {
            "store": {"url": "memory://"},
            "http": {"listen": f"127.0.0.1:{free_port()}"},
            "llm_proxy": {
                "openai": {"upstream": llm.anthropic_base_url},
                "anthropic": {"upstream": f"http://127.0.0.1:{free_port()}"},  # nobody there
            },
            "alerts": [{"type": "webhook", "url": hook.url, "events": ["guard_block"]}],
            "bots": [{"name": "helper", "platform": "http", "backend": {"type": "echo"}}],
        }
        daemon = Daemon(parse_config(yaml.safe_dump(config)))
        url = await daemon.start()
        try:
            async with aiohttp.ClientSession() as http:
                message = {"chat": "room", "author": "alice", "text": "hi", "mentions": ["helper"]}
                async with http.post(f"{url}/v1/bots/helper/messages", json=message) as r:
                    assert (await r.json())["action"] == "reply"
                for _ in range(3):
                    step = {"tool": "search", "args": {"q": "tides"}}
                    async with http.post(f"{url}/v1/guard/run-1/step", json=step) as r:
                        status = r.status
                assert status == 429
                body = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}
                async with http.post(f"{url}/llm/openai/v1/chat/completions", json=body) as r:
                    assert r.status == 200
                body = {"model": "m", "max_tokens": 5, "messages": body["messages"]}
                async with http.post(f"{url}/llm/anthropic/v1/messages", json=body) as r:
                    assert r.status == 502  # counted as failed, by how
                for _ in range(100):  # the alert goes out off the decision path
                    async with http.get(f"{url}/metrics") as r:
                        text = await r.text()
                    if "botbouncer_alerts_total{" in text:
                        return text
                    await asyncio.sleep(0.05)
                raise AssertionError(f"no alert was counted:\n{text}")
        finally:
            await daemon.stop()


# The values each labelled metric takes (docs/operations.md's metrics table):
# a matcher on another value would never match.
LABEL_VALUES: dict[tuple[str, str], set[str]] = {
    ("botbouncer_messages_total", "action"): {a.value for a in Action},
    ("botbouncer_messages_total", "reason"): {r.value for r in Reason} | {"none"},
    ("botbouncer_turn_verdicts_total", "verdict"): {t.value for t in Turn},
    ("botbouncer_classifier_calls_total", "result"): {"reply", "skip", "error", "truncated"},
    ("botbouncer_guard_checks_total", "decision"): {"allow", "warn", "block"},
    ("botbouncer_llm_proxy_requests_total", "api"): {"openai", "anthropic"},
    ("botbouncer_llm_proxy_requests_total", "action"): {
        "forwarded",
        "noted",
        "tools_disabled",
        "stopped",
        "budget_exhausted",
        "passthrough",
        "fail_open",
        "too_large",
        "bad_path",
        "invalid_session",
        "guard_conflict",
        "shutting_down",
    },
    ("botbouncer_llm_proxy_failed_total", "how"): {
        "unreachable",
        "timeout",
        "upstream_broke",
        "agent_left",
    },
    ("botbouncer_llm_proxy_tokens_total", "kind"): {"input", "output"},
    ("botbouncer_alerts_total", "outcome"): {"sent", "failed", "dropped", "duplicate"},
}


@pytest.fixture(scope="module")
def metrics_page() -> str:
    return asyncio.run(scrape_after_traffic())


@pytest.mark.parametrize("source", ["rules", "dashboard"])
def test_every_metric_and_label_queried_is_one_the_daemon_exports(
    metrics_page: str, source: str
) -> None:
    series = exposed(metrics_page)
    series["up"] = set()  # Prometheus' own, per target
    exprs = rule_exprs() if source == "rules" else dashboard_exprs()
    assert exprs
    for where, expr in exprs.items():
        names = metric_names(expr)
        assert names, f"{where}: no metric in {expr!r}"
        unknown = names - set(series)
        assert not unknown, f"{where}: {sorted(unknown)} not exported; {expr!r}"
        for name, matchers in selectors(expr):
            for label, op, value in matchers:
                assert label in series[name] | TARGET_LABELS, f"{where}: {name} has no {label}"
                known = LABEL_VALUES.get((name, label))
                if known is None or "$" in value or op in ("!=", "!~"):
                    continue
                values = set(value.split("|")) if op == "=~" else {value}
                assert values <= known, f"{where}: {name}{{{label}}}: {sorted(values - known)}"
        labels = set().union(*(series[n] for n in names)) | TARGET_LABELS
        assert grouping_labels(expr) <= labels, f"{where}: grouping by a label none has"


def test_the_metric_vocabulary_matches_the_daemons(metrics_page: str) -> None:
    """The names of LABEL_VALUES are exported and every metric the daemon
    exports appears in the dashboard."""
    series = exposed(metrics_page)
    for name, label in LABEL_VALUES:
        assert label in series[name], (name, label)
    shown = set().union(*(metric_names(e) for e in dashboard_exprs().values()))
    families = {re.sub(r"_(bucket|sum|count)$", "", n) for n in series}
    missing = {f for f in families if not any(s.startswith(f) for s in shown)}
    assert not missing, f"exported but on no dashboard panel: {sorted(missing)}"


# -- Prometheus rules --------------------------------------------------------------

DOC_REF = re.compile(r"\b(docs/[\w./-]+\.md)(#[\w-]+)?")


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown file."""
    out = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


def test_every_rule_says_what_to_do_and_how_bad_it_is() -> None:
    names = [r["alert"] for r in rules()]
    assert len(names) == len(set(names)) >= 8
    for rule in rules():
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
        notes = rule["annotations"]
        assert notes["summary"] and notes["description"], rule["alert"]
        refs = DOC_REF.findall(notes["description"])
        assert refs, f"{rule['alert']}: its description links no document"
        for path, anchor in refs:
            assert (ROOT / path).exists(), f"{rule['alert']}: {path}"
            if anchor:
                assert anchor[1:] in anchors(ROOT / path), f"{rule['alert']}: {path}{anchor}"
    assert {"BotbouncerDown", "BotbouncerStoreDegraded"} <= set(names)
    down = next(r for r in rules() if r["alert"] == "BotbouncerDown")
    assert down["expr"] == 'up{job="botbouncer"} == 0'


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus; CI does)")
    return found


def test_promtool_checks_the_rules() -> None:
    out = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(rules())} rules found" in out.stdout


def test_promtool_unit_tests_of_the_rules_pass() -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text())
    tested = {t["alertname"] for case in tests["tests"] for t in case["alert_rule_test"]}
    assert tested == set(rule_exprs()), "every rule has a promtool test"
    out = subprocess.run(
        [promtool(), "test", "rules", RULE_TESTS.name],
        cwd=RULE_TESTS.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout + out.stderr


def test_promtool_parses_every_dashboard_query(tmp_path: Path) -> None:
    """Each query as a recording rule, Grafana's variables given values, so a
    PromQL syntax error in a panel fails here rather than on a screen."""
    values = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}
    records = []
    for i, expr in enumerate(dashboard_exprs().values()):
        for var, value in values.items():
            expr = expr.replace(var, value)
        records.append({"record": f"dashboard:query_{i}", "expr": re.sub(r"\$\w+", ".*", expr)})
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": records}]}))
    out = subprocess.run(
        [promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr


# -- Grafana dashboard -----------------------------------------------------------

_DATASOURCE = {
    "type": "object",
    "required": ["type", "uid"],
    "properties": {"type": {"const": "prometheus"}, "uid": {"const": "${datasource}"}},
}
_PANEL = {
    "type": "object",
    "required": ["id", "type", "title", "gridPos"],
    "properties": {
        "id": {"type": "integer", "minimum": 1},
        "type": {"enum": ["row", "timeseries", "stat"]},
        "title": {"type": "string", "minLength": 1},
        "gridPos": {
            "type": "object",
            "required": ["x", "y", "w", "h"],
            "properties": {
                "x": {"type": "integer", "minimum": 0, "maximum": 23},
                "y": {"type": "integer", "minimum": 0},
                "w": {"type": "integer", "minimum": 1, "maximum": 24},
                "h": {"type": "integer", "minimum": 1},
            },
        },
    },
    "if": {"properties": {"type": {"const": "row"}}},
    "then": {"required": ["panels", "collapsed"]},
    "else": {
        "required": ["datasource", "targets", "fieldConfig", "options"],
        "properties": {
            "datasource": _DATASOURCE,
            "targets": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["expr", "refId", "datasource"],
                    "properties": {
                        "expr": {"type": "string", "minLength": 1},
                        "refId": {"type": "string", "pattern": "^[A-Z]$"},
                        "datasource": _DATASOURCE,
                    },
                },
            },
        },
    },
}
DASHBOARD_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": [
        "__inputs",
        "__requires",
        "uid",
        "title",
        "schemaVersion",
        "panels",
        "templating",
        "time",
        "annotations",
    ],
    "properties": {
        "__inputs": {
            "type": "array",
            "contains": {
                "type": "object",
                "required": ["name", "type", "pluginId"],
                "properties": {
                    "name": {"const": "DS_PROMETHEUS"},
                    "type": {"const": "datasource"},
                    "pluginId": {"const": "prometheus"},
                },
            },
        },
        "id": {"type": "null"},  # so an import makes a new dashboard
        "uid": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,40}$"},
        "title": {"type": "string", "minLength": 1},
        "schemaVersion": {"type": "integer", "minimum": 36, "maximum": 41},
        "panels": {"type": "array", "minItems": 1, "items": _PANEL},
        "templating": {
            "type": "object",
            "required": ["list"],
            "properties": {
                "list": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name", "type", "current"],
                        "properties": {"type": {"enum": ["datasource", "query"]}},
                    },
                }
            },
        },
    },
}


def test_the_dashboard_has_what_grafana_import_needs() -> None:
    jsonschema = pytest.importorskip("jsonschema")  # installed with the mcp extra
    data = dashboard()
    errors = sorted(jsonschema.Draft202012Validator(DASHBOARD_SCHEMA).iter_errors(data), key=str)
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)
    variables = {v["name"]: v for v in data["templating"]["list"]}
    assert {"datasource", "job", "instance", "bot", "platform"} <= set(variables)
    source = variables["datasource"]
    assert (source["type"], source["query"]) == ("datasource", "prometheus")
    # The import prompt's choice becomes the datasource variable's default.
    assert source["current"]["value"] == "${DS_PROMETHEUS}"
    for var in variables.values():
        if var["type"] == "query":
            assert var["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


def test_the_dashboard_layout_and_variables_are_consistent() -> None:
    data = dashboard()
    ids = [p["id"] for p in data["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    cells: dict[tuple[int, int], str] = {}
    for p in data["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]
    defined = {v["name"] for v in data["templating"]["list"]}
    builtin = {"__rate_interval", "__interval", "__range"}
    for where, expr in dashboard_exprs().items():
        used = set(re.findall(r"\$(\w+)", expr))
        assert used <= defined | builtin, f"{where}: {sorted(used - defined - builtin)}"
    titles = " ".join(p["title"].lower() for p in panels())
    topics = (
        "decisions,verdicts,loops stopped,decision latency,backend,reply decision,"
        "store degraded,guard,llm proxy,tokens,alerts"
    )
    for topic in topics.split(","):
        assert topic in titles, topic


# -- systemd ----------------------------------------------------------------------


def unit_settings() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def test_the_unit_is_hardened_and_fits_the_daemon() -> None:
    s = unit_settings()
    expected = {
        "DynamicUser": "yes",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "CapabilityBoundingSet": "",
        "RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
        "MemoryDenyWriteExecute": "yes",
        "ExecReload": "/bin/kill -HUP $MAINPID",
        "Restart": "on-failure",
    }
    for key, value in expected.items():
        assert s.get(key) == [value], key
    assert "@system-service" in s["SystemCallFilter"]
    assert s["EnvironmentFile"][0].lstrip("-").startswith("/etc/botbouncer/")
    # The daemon exits 0 after draining within the grace period (+2 s for alerts).
    stop = int(s["TimeoutStopSec"][0].removesuffix("s"))
    grace = load_config(str(CONTAINER_CONFIG)).shutdown.grace_seconds
    assert stop >= grace + 2 + 5
    argv = shlex.split(s["ExecStart"][0])
    assert argv[0].endswith("/bin/botbouncer")
    args = build_parser().parse_args(argv[1:])
    assert (args.command, args.config) == ("run", CONFIG_IN_IMAGE)


def systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found is None:
        pytest.skip("systemd-analyze is not installed (Debian: the systemd package)")
    return found


def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    """`verify` fails on a missing ExecStart binary (/opt/botbouncer is not
    installed here) and only warns, exit 0, on unknown keys and bad values. So
    the unit is verified as a copy whose ExecStart is this virtualenv's
    botbouncer (the one difference), and any line naming the unit fails the
    test; a copy with a misspelt key shows that such a line is printed."""
    tool = systemd_analyze()
    text = UNIT.read_text()
    assert text.count("/opt/botbouncer/bin/botbouncer") == 1
    unit = tmp_path / "botbouncer.service"
    unit.write_text(text.replace("/opt/botbouncer/bin/botbouncer", str(BOTBOUNCER)))
    out = subprocess.run(
        [tool, "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60
    )
    said = [line for line in (out.stdout + out.stderr).splitlines() if "botbouncer" in line]
    assert out.returncode == 0 and not said, out.stdout + out.stderr

    typo = tmp_path / "typo" / "botbouncer.service"
    typo.parent.mkdir()
    typo.write_text(unit.read_text().replace("PrivateTmp=", "PrivateTemp="))
    out = subprocess.run(
        [tool, "verify", "--man=no", str(typo)], capture_output=True, text=True, timeout=60
    )
    assert "Unknown key 'PrivateTemp'" in out.stdout + out.stderr

    # The exposure score (0 best, 10 worst) of the sandbox; --threshold is x10.
    out = subprocess.run(
        [tool, "security", "--offline=true", "--threshold=20", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr


# -- the container's config, the image's command and health check, W^X ------------


def test_the_container_config_is_valid() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_URL", "BOTBOUNCER_"))}
    out = subprocess.run(
        [str(BOTBOUNCER), "check-config", "-c", str(CONTAINER_CONFIG)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"{CONTAINER_CONFIG}: ok - store redis, bots: helper (http)")
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k in ("REDIS_URL",)}
    try:
        config = load_config(str(CONTAINER_CONFIG))
    finally:
        os.environ.update(saved)
    assert config.http.listen == "0.0.0.0:8080"
    assert urlparse(config.store.url).hostname == "redis"  # compose's service name
    assert config.http.admin_token is None  # unset: the admin API is closed


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments), continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n(\s*#.*\n)*", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def final_stage() -> list[tuple[str, str]]:
    steps = dockerfile()
    last = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    return steps[last:]


def healthcheck_command() -> list[str]:
    line = next(rest for word, rest in final_stage() if word == "HEALTHCHECK")
    argv: list[str] = json.loads(line.split(" CMD ", 1)[1])
    return argv


def test_the_dockerfile_runs_the_daemon_as_documented() -> None:
    steps = dockerfile()
    args = dict(rest.split("=", 1) for word, rest in steps if word == "ARG" and "=" in rest)
    bases = [
        rest.split()[0].replace("${PYTHON_IMAGE}", args["PYTHON_IMAGE"])
        for word, rest in steps
        if word == "FROM"
    ]
    assert bases and all(b == "python:3.11-slim" for b in bases), bases
    final = dict(final_stage())
    user = final["USER"].split(":")[0]
    assert user not in ("", "0", "root"), "the daemon does not run as root"
    assert final["EXPOSE"] == "8080"
    assert final["STOPSIGNAL"] == "SIGTERM"
    assert "/healthz" in " ".join(healthcheck_command())
    argv = json.loads(final["ENTRYPOINT"]) + json.loads(final["CMD"])
    assert argv[0] == "botbouncer"
    parsed = build_parser().parse_args(argv[1:])
    assert (parsed.command, parsed.config) == ("run", CONFIG_IN_IMAGE)
    assert any(w == "COPY" and r.endswith(f" {CONFIG_IN_IMAGE}") for w, r in final_stage())


SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|CREDENTIAL", re.I)


def test_no_secret_is_baked_into_the_image() -> None:
    for word, rest in dockerfile():
        if word in ("ENV", "ARG"):
            assert not SECRET_NAME.search(rest), f"{word} {rest}"
        if word in ("COPY", "ADD"):
            assert ".env" not in rest and "secret" not in rest.lower(), f"{word} {rest}"
    # The config the image carries names its secrets as ${VAR}, never a value.
    for line in CONTAINER_CONFIG.read_text().splitlines():
        key, _, value = line.split("#")[0].partition(":")
        if SECRET_NAME.search(key) and value.strip():
            assert re.fullmatch(r'"?\$\{\w+(:-)?\}"?', value.strip()), line


def dockerignore_patterns() -> list[tuple[bool, re.Pattern[str]]]:
    """(re-include?, pattern) in order, as Docker reads .dockerignore."""
    out = []
    for raw in DOCKERIGNORE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        glob = line.lstrip("!").strip("/")
        regex = ""
        i = 0
        while i < len(glob):
            if glob.startswith("**/", i):
                regex, i = regex + "(?:.*/)?", i + 3
            elif glob.startswith("**", i):
                regex, i = regex + ".*", i + 2
            elif glob[i] == "*":
                regex, i = regex + "[^/]*", i + 1
            elif glob[i] == "?":
                regex, i = regex + "[^/]", i + 1
            elif glob[i] == "[":
                end = glob.index("]", i)
                regex, i = regex + glob[i : end + 1], end + 1
            else:
                regex, i = regex + re.escape(glob[i]), i + 1
        out.append((negate, re.compile(regex)))
    return out


def in_build_context(path: str) -> bool:
    """Whether Docker sends `path` (relative to the root): the last pattern
    matching it or a directory above it decides."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    sent = True
    for negate, pattern in dockerignore_patterns():
        if any(pattern.fullmatch(p) for p in prefixes):
            sent = negate
    return sent


def test_the_build_context_holds_what_the_package_build_needs() -> None:
    import tomllib

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    build = dockerfile()[: max(i for i, (w, _) in enumerate(dockerfile()) if w == "FROM")]
    copied = set()
    for word, rest in build:
        if word == "COPY" and not rest.startswith("--from"):
            copied.update(shlex.split(rest)[:-1])
    needed = {"pyproject.toml", pyproject["readme"], *pyproject["license-files"]}
    needed |= {"gateway", "adapters", "botbouncer"}  # [tool.setuptools.packages.find]
    assert needed <= copied, sorted(needed - copied)
    for source in copied:
        assert (ROOT / source).exists(), source
        files = (
            [source]
            if (ROOT / source).is_file()
            else [
                str(p.relative_to(ROOT))
                for p in (ROOT / source).rglob("*")
                if p.is_file() and "__pycache__" not in p.parts
            ]
        )
        assert files and all(in_build_context(f) for f in files), source
    for kept_out in (
        ".venv/bin/python",
        ".git/HEAD",
        "tests/test_deploy.py",
        "docs/deploy.md",
        "gateway/__pycache__/cli.cpython-311.pyc",
        "botbouncer.egg-info/PKG-INFO",
        "config.example.yml",
        "deploy/compose.yml",
    ):
        assert not in_build_context(kept_out), kept_out
    assert in_build_context("gateway/store/lua/admit.lua")
    assert in_build_context("deploy/botbouncer.yml")


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


def seconds(text: str) -> float:
    m = re.fullmatch(r"(\d+)(s|m)", text)
    assert m, text
    return int(m.group(1)) * (60 if m.group(2) == "m" else 1)


def test_the_compose_file_runs_the_daemon_beside_redis() -> None:
    services = compose()["services"]
    assert set(services) == {"botbouncer", "redis"}
    daemon, redis = services["botbouncer"], services["redis"]

    context = (COMPOSE.parent / daemon["build"]["context"]).resolve()
    assert context == ROOT and (context / daemon["build"]["dockerfile"]) == DOCKERFILE
    final = dict(final_stage())
    assert daemon["command"] == json.loads(final["CMD"])
    source, target, mode = daemon["volumes"][0].split(":")
    assert (COMPOSE.parent / source).resolve() == CONTAINER_CONFIG
    assert (target, mode) == (CONFIG_IN_IMAGE, "ro")
    assert daemon["ports"] == ["127.0.0.1:8080:8080"]  # the host's loopback only
    assert final["EXPOSE"] == "8080"
    assert daemon["depends_on"] == {"redis": {"condition": "service_healthy"}}
    store = urlparse(daemon["environment"]["REDIS_URL"])
    assert (store.scheme, store.hostname, store.port) == ("redis", "redis", 6379)
    for name, value in daemon["environment"].items():
        if SECRET_NAME.search(name):
            assert re.fullmatch(r"\$\{\w+(:-)?\}", value), f"{name}: a secret in compose.yml"
    assert daemon["healthcheck"]["test"] == ["CMD", *healthcheck_command()]
    assert seconds(daemon["stop_grace_period"]) >= (
        load_config(str(CONTAINER_CONFIG)).shutdown.grace_seconds + 2 + 5
    )
    assert daemon["stop_signal"] == "SIGTERM" and daemon["restart"] == "unless-stopped"
    assert daemon["read_only"] is True and daemon["cap_drop"] == ["ALL"]

    assert redis["image"].startswith("redis:7")  # scripts declared with #!lua need 7.0
    assert redis["healthcheck"]["test"] == ["CMD-SHELL", "redis-cli ping | grep -q PONG"]
    assert redis["restart"] == "unless-stopped"
    for service in services.values():
        check = service["healthcheck"]
        assert seconds(check["timeout"]) < seconds(check["interval"])


# The kernel's W^X for one process tree (Linux >= 6.3), what systemd's
# MemoryDenyWriteExecute=yes asks for: no mapping writable and executable, none
# made executable later. Set in a small wrapper, which then execs the daemon.
_MDWE = (
    "import ctypes, os, sys\n"
    "if ctypes.CDLL(None, use_errno=True).prctl(65, 1, 0, 0, 0) != 0:\n"  # PR_SET_MDWE
    "    sys.exit(97)\n"
    "os.execv(sys.argv[1], sys.argv[1:])\n"
)


def mdwe_available() -> bool:
    """The wrapper sets it, and a mapping both writable and executable is then refused."""
    probe = (
        "import mmap\n"
        "try:\n"
        "    mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
        "except OSError:\n"
        "    print('refused')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", _MDWE, sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return out.returncode == 0 and out.stdout.strip() == "refused"


def logged(path: Path) -> str:
    return path.read_text()


@asynccontextmanager
async def daemon_process(
    env: dict[str, str], log: Path, *, mdwe: bool
) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """`botbouncer run -c deploy/botbouncer.yml`, as the image and the unit
    run it, listening on a free port of 127.0.0.1; its URL once /healthz answers."""
    port = free_port()
    argv = [str(BOTBOUNCER), "run", "-c", str(CONTAINER_CONFIG)]
    if mdwe:
        argv = [sys.executable, "-c", _MDWE, *argv]
    full_env = {**os.environ, **env, "BOTBOUNCER_LISTEN": f"127.0.0.1:{port}"}
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            *argv, env=full_env, stdout=out, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(200):
                assert proc.returncode is None, logged(log)
                try:
                    async with http.get(f"{url}/healthz") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.05)
            else:
                raise AssertionError(f"the daemon did not answer:\n{logged(log)}")
        yield proc, url
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def healthcheck(url: str) -> int:
    """The image's HEALTHCHECK command, pointed at this daemon."""
    argv = healthcheck_command()
    assert argv[0] == "python"
    code = argv[2].replace("http://127.0.0.1:8080", url)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, argv[1], code, stderr=subprocess.DEVNULL
    )
    return await asyncio.wait_for(proc.wait(), timeout=30)


@pytest.mark.parametrize("store", ["memory", "redis"])
async def test_the_container_config_serves_reloads_and_drains(
    request: pytest.FixtureRequest, tmp_path: Path, store: str
) -> None:
    """The daemon on deploy/botbouncer.yml under W^X (where the kernel has
    it): healthy by the image's own check, deciding (the guard on Redis, or
    in this process through lupa's LuaJIT interpreter for memory://), reloaded by SIGHUP
    as ExecReload sends it, and exiting 0 on SIGTERM as the unit and docker
    stop expect."""
    tag = f"deploy-{uuid.uuid4().hex[:12]}"
    redis_url = request.getfixturevalue("redis_url") if store == "redis" else "memory://"
    env = {"REDIS_URL": redis_url}
    mdwe = sys.platform == "linux" and mdwe_available()
    log = tmp_path / "daemon.log"
    try:
        async with daemon_process(env, log, mdwe=mdwe) as (proc, url):
            assert await healthcheck(url) == 0
            async with aiohttp.ClientSession() as http:
                async with http.get(f"{url}/healthz") as r:
                    assert (await r.json()) == {"status": "ok", "store": store}
                message = {"chat": tag, "author": "alice", "text": "hi", "mentions": ["helper"]}
                async with http.post(f"{url}/v1/bots/helper/messages", json=message) as r:
                    assert (await r.json())["reply"] == "hi"
                step = {"tool": "search", "args": {"q": "tides"}}
                answers = []
                for _ in range(3):
                    async with http.post(f"{url}/v1/guard/{tag}/step", json=step) as r:
                        answers.append((await r.json())["decision"])
                assert answers == ["allow", "warn", "block"]
                # Enough checks to make the script's loops hot: were LuaJIT's
                # compiler on in this process, W^X would abort it here.
                for i in range(120):
                    step = {"tool": f"t{i % 7}", "args": {"q": f"q{i}"}}
                    async with http.post(f"{url}/v1/guard/{tag}-hot/step", json=step) as r:
                        assert r.status in (200, 429), await r.text()  # 429: a block
            proc.send_signal(signal.SIGHUP)
            for _ in range(100):
                if "reloaded" in logged(log):
                    break
                await asyncio.sleep(0.05)
            assert proc.returncode is None, logged(log)
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), timeout=20) == 0, logged(log)
            assert await healthcheck(url) != 0  # nothing answers any more
        text = logged(log)
        assert "reloaded" in text and "stopped" in text, text
        assert "Traceback" not in text, text
    finally:
        if store == "redis":
            await delete_matching(redis_url, f"bb:*{tag}*")
