"""Prometheus metrics (DESIGN §5.5), one registry per daemon.

A registry per daemon rather than the process-global one keeps two daemons in
one test process (or one process reloaded) from sharing or double-registering
counters.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from gateway.model import Decision

# Decisions are sub-millisecond on memory, a few ms on Redis; backends take seconds.
FAST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
SLOW_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
CONTENT_TYPE = CONTENT_TYPE_LATEST

# `*_created` timestamp series double the output and no dashboard reads them.
disable_created_metrics()  # type: ignore[no-untyped-call]


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.messages = Counter(
            "botbouncer_messages", "Decisions taken, by bot, platform, action and reason code.",
            ["bot", "platform", "action", "reason"], registry=r,
        )  # fmt: skip
        self.turn_verdicts = Counter(
            "botbouncer_turn_verdicts",
            "Turn verdicts of decisions (a message seen by two bots counts twice).",
            ["verdict"], registry=r,
        )  # fmt: skip
        self.classifier_calls = Counter(
            "botbouncer_classifier_calls",
            "Reply-decision calls by result: reply, skip, or error (failed open).",
            ["result"], registry=r,
        )  # fmt: skip
        for result in ("reply", "skip", "error"):
            self.classifier_calls.labels(result)
        self.classifier_seconds = Histogram(
            "botbouncer_classifier_seconds", "Reply-decision call latency.",
            buckets=SLOW_BUCKETS, registry=r,
        )  # fmt: skip
        self.backend_seconds = Histogram(
            "botbouncer_backend_seconds", "Backend call latency, failures included.",
            buckets=SLOW_BUCKETS, registry=r,
        )  # fmt: skip
        self.decision_seconds = Histogram(
            "botbouncer_decision_seconds",
            "Time from a message to its decision, classifier and backend included.",
            buckets=FAST_BUCKETS, registry=r,
        )  # fmt: skip
        self.guard_checks = Counter(
            "botbouncer_guard_checks", "Agent guard answers, by decision and reason code.",
            ["decision", "reason"], registry=r,
        )  # fmt: skip
        self.store_degraded = Gauge(
            "botbouncer_store_degraded", "1 while the shared store is unreachable.", registry=r
        )

        # labels() looks a child up under a lock; a decision per message
        # keeps the few children it uses at hand instead
        self._counted: dict[tuple[str, str, str, str, str], tuple[Counter, Counter]] = {}

    def decision(self, d: Decision, platform: str, seconds: float) -> None:
        reason = d.reason.value if d.reason else "none"
        key = (d.bot, platform, d.action.value, reason, d.turn.value)
        children = self._counted.get(key)
        if children is None:
            if len(self._counted) > 4096:  # bots x actions x reasons x verdicts: far fewer
                self._counted.clear()
            children = (self.messages.labels(*key[:4]), self.turn_verdicts.labels(key[4]))
            self._counted[key] = children
        children[0].inc()
        children[1].inc()
        self.decision_seconds.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
