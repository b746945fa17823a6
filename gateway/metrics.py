"""Prometheus metrics (docs/operations.md), one registry per daemon.

A registry per daemon rather than the process-global one keeps two daemons in
one test process (or one process reloaded) from sharing or double-registering
counters.

The metrics every message moves (messages, turn verdicts and the three
latency histograms) are plain numbers, kept on the event loop's thread (the
only one that decides or scrapes), and become metric families when scraped:
a custom collector, prometheus-client's own way to expose numbers kept
elsewhere. Its Counter and Histogram take a lock and check their state on
every update, and the seven updates of an answered message cost as many
instructions as the rest of its decision's bookkeeping (bench/README.md).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.utils import floatToGoString

from gateway.model import Decision

# Decisions are sub-millisecond on memory, a few ms on Redis; backends take seconds.
FAST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
SLOW_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
CONTENT_TYPE = CONTENT_TYPE_LATEST

# `*_created` timestamp series double the output and no dashboard reads them.
disable_created_metrics()  # type: ignore[no-untyped-call]


class Timing:
    """A histogram without labels, as prometheus-client's Histogram exposes
    it: observe() is one bisect and two additions."""

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...]) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = buckets
        self._counts = [0] * (len(buckets) + 1)  # the last: above every bound (+Inf)
        self._sum = 0.0

    def observe(self, seconds: float) -> None:
        self._counts[bisect_left(self.bounds, seconds)] += 1  # le: the first bound >= it
        self._sum += seconds

    def family(self) -> HistogramMetricFamily:
        buckets, total = [], 0
        for bound, n in zip(
            [*map(floatToGoString, self.bounds), "+Inf"], self._counts, strict=True
        ):
            total += n
            buckets.append((bound, total))
        return HistogramMetricFamily(
            self.name, self.documentation, buckets=buckets, sum_value=self._sum
        )


class _PerMessage:
    """The collector of the per-message metrics (registered with the registry)."""

    def __init__(self, metrics: Metrics) -> None:
        self._m = metrics

    def collect(self) -> Iterator[Metric]:
        m = self._m
        messages = CounterMetricFamily(
            "botbouncer_messages", "Decisions taken, by bot, platform, action and reason code.",
            labels=["bot", "platform", "action", "reason"],
        )  # fmt: skip
        for key, n in m.message_counts.items():
            messages.add_metric(list(key), n)
        yield messages
        verdicts = CounterMetricFamily(
            "botbouncer_turn_verdicts",
            "Turn verdicts of decisions (a message seen by two bots counts twice).",
            labels=["verdict"],
        )
        for verdict, n in m.verdict_counts.items():
            verdicts.add_metric([verdict], n)
        yield verdicts
        for timing in (m.classifier_seconds, m.backend_seconds, m.decision_seconds):
            yield timing.family()


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.message_counts: dict[tuple[str, str, str, str], int] = {}
        self.verdict_counts: dict[str, int] = {}
        self.classifier_calls = Counter(
            "botbouncer_classifier_calls",
            "Reply-decision calls by result: reply, skip, error (failed open), or truncated "
            "(failed open: max_tokens ran out before the answer, a configuration problem).",
            ["result"], registry=r,
        )  # fmt: skip
        for result in ("reply", "skip", "error", "truncated"):
            self.classifier_calls.labels(result)
        self.classifier_seconds = Timing(
            "botbouncer_classifier_seconds", "Reply-decision call latency.", SLOW_BUCKETS
        )
        self.backend_seconds = Timing(
            "botbouncer_backend_seconds", "Backend call latency, failures included.", SLOW_BUCKETS
        )
        self.decision_seconds = Timing(
            "botbouncer_decision_seconds",
            "Time from a message to its decision, classifier and backend included.",
            FAST_BUCKETS,
        )
        r.register(_PerMessage(self))
        self.guard_checks = Counter(
            "botbouncer_guard_checks", "Agent guard answers, by decision and reason code.",
            ["decision", "reason"], registry=r,
        )  # fmt: skip
        self.llm_requests = Counter(
            "botbouncer_llm_proxy_requests",
            "LLM proxy requests by API and what was done: forwarded, noted (a warning as a "
            "note), tools_disabled, stopped, budget_exhausted, passthrough (not a model call), "
            "fail_open (the store failed), too_large, bad_path, invalid_session, "
            "guard_conflict, shutting_down.",
            ["api", "action"], registry=r,
        )  # fmt: skip
        self.llm_failed = Counter(
            "botbouncer_llm_proxy_failed",
            "LLM proxy requests sent on that did not end well, by API and how: unreachable, "
            "timeout, upstream_broke (the answer broke off), agent_left (the agent hung up "
            "mid-answer). Each is also one of botbouncer_llm_proxy_requests_total.",
            ["api", "how"], registry=r,
        )  # fmt: skip
        self.llm_tokens = Counter(
            "botbouncer_llm_proxy_tokens", "Tokens the upstreams reported, by API and kind.",
            ["api", "kind"], registry=r,
        )  # fmt: skip
        self.alerts = Counter(
            "botbouncer_alerts",
            "Alerts by target (index:type), event and outcome: sent, failed (after its "
            "retries), dropped (the target's queue was full), duplicate (another replica "
            "claimed it).",
            ["target", "event", "outcome"], registry=r,
        )  # fmt: skip
        self.store_degraded = Gauge(
            "botbouncer_store_degraded", "1 while the shared store is unreachable.", registry=r
        )

    def decision(self, d: Decision, platform: str, seconds: float) -> None:
        key = (d.bot, platform, d.action.value, d.reason.value if d.reason else "none")
        counts = self.message_counts
        counts[key] = counts.get(key, 0) + 1
        verdicts = self.verdict_counts
        verdicts[d.turn.value] = verdicts.get(d.turn.value, 0) + 1
        self.decision_seconds.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
