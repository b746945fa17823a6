"""The per-message metrics, kept as plain numbers and exposed by a collector,
read exactly as prometheus-client's own Counter and Histogram would expose the
same observations (names, HELP and TYPE lines, labels, buckets, sums)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from gateway.metrics import FAST_BUCKETS, SLOW_BUCKETS, Metrics
from gateway.model import Action, Decision, Reason, Turn

# latencies on, between, below and above the bounds
SECONDS = [0.0, 0.0004, 0.0005, 0.00051, 0.003, 0.1, 2.5, 7.0, 59.9, 60.0, 61.0, 1e9]


def decision(action: Action, reason: Reason | None, turn: Turn, bot: str = "a") -> Decision:
    return Decision(bot, "m", "http:room", "alice", action, reason, turn, 1, 1)


DECISIONS = [
    decision(Action.REPLY, None, Turn.RESET),
    decision(Action.DROP, Reason.NOT_ADDRESSED, Turn.RESET),
    decision(Action.DROP, Reason.NOT_ADDRESSED, Turn.RESET),
    decision(Action.WARN, Reason.TURN_SOFT_LIMIT, Turn.SOFT_LIMIT, bot="b"),
    decision(Action.DROP, Reason.OWN_MESSAGE, Turn.OK),
]


def reference() -> str:
    """The same observations through prometheus-client's own metric classes."""
    r = CollectorRegistry()
    messages = Counter("botbouncer_messages", "Decisions taken, by bot, platform, action and "
                       "reason code.", ["bot", "platform", "action", "reason"],
                       registry=r)  # fmt: skip
    verdicts = Counter("botbouncer_turn_verdicts", "Turn verdicts of decisions (a message seen "
                       "by two bots counts twice).", ["verdict"], registry=r)  # fmt: skip
    classifier = Histogram("botbouncer_classifier_seconds", "Reply-decision call latency.",
                           buckets=SLOW_BUCKETS, registry=r)  # fmt: skip
    backend = Histogram("botbouncer_backend_seconds", "Backend call latency, failures included.",
                        buckets=SLOW_BUCKETS, registry=r)  # fmt: skip
    decided = Histogram("botbouncer_decision_seconds", "Time from a message to its decision, "
                        "classifier and backend included.", buckets=FAST_BUCKETS,
                        registry=r)  # fmt: skip
    for i, d in enumerate(DECISIONS):
        reason = d.reason.value if d.reason else "none"
        messages.labels(d.bot, "discord", d.action.value, reason).inc()
        verdicts.labels(d.turn.value).inc()
        decided.observe(SECONDS[i])
    for s in SECONDS:
        backend.observe(s)
        classifier.observe(s / 2)
    return generate_latest(r).decode()


def ours() -> str:
    m = Metrics()
    for i, d in enumerate(DECISIONS):
        m.decision(d, "discord", SECONDS[i])
    for s in SECONDS:
        m.backend_seconds.observe(s)
        m.classifier_seconds.observe(s / 2)
    return m.render().decode()


def families(text: str, names: tuple[str, ...]) -> dict[str, list[str]]:
    """The exposition's lines by metric family, in their order."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        name = line.split()[2] if line.startswith("#") else line.split("{")[0].split()[0]
        family = next((n for n in names if name.startswith(n)), None)
        if family is not None:
            out.setdefault(family, []).append(line)
    return out


def test_the_per_message_metrics_read_as_prometheus_clients_own() -> None:
    names = ("botbouncer_messages", "botbouncer_turn_verdicts", "botbouncer_classifier_seconds",
             "botbouncer_backend_seconds", "botbouncer_decision_seconds")  # fmt: skip
    want, got = families(reference(), names), families(ours(), names)
    assert set(want) == set(names)
    for name in names:
        assert got[name] == want[name], name


def test_the_other_metrics_are_still_there_from_the_start() -> None:
    text = Metrics().render().decode()
    assert 'botbouncer_classifier_calls_total{result="error"} 0.0' in text
    assert "botbouncer_store_degraded 0.0" in text
    assert "# TYPE botbouncer_guard_checks_total counter" in text
    assert "botbouncer_decision_seconds_count 0.0" in text
