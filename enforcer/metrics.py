"""Prometheus metrics of the enforcer (prometheus-client).

The hot path only bumps plain integers in dicts; a custom collector turns
them into metric families at scrape time, so a check pays ~100 ns for its
metrics instead of a labelled-child lock per budget. Each enforcer has its own
registry (several may live in one process, in tests).

=============================================  =======  ====================================
metric                                         type     labels / meaning
=============================================  =======  ====================================
spendbus_enforcer_checks_total                 counter  budget, outcome (allowed, alert,
                                                        exceeded, in_flight, failed_open,
                                                        failed_closed, too_large, throttled,
                                                        unpriced, too_many_sessions):
                                                        one per applicable budget per check
spendbus_enforcer_decisions_total              counter  decision (schemas.usage values)
spendbus_enforcer_peeks_total                  counter  decision: checks that hold nothing and
                                                        count as no request (policy hook, usage)
spendbus_enforcer_ready                        gauge    1 once caught up with the start offsets
spendbus_enforcer_verdict_staleness_seconds    gauge    since the verdict stream was last
                                                        confirmed caught up
spendbus_enforcer_verdict_lag_seconds          gauge    last verdict: applied − emitted_at
spendbus_enforcer_holds_outstanding            gauge    holds in flight or awaiting a verdict
spendbus_enforcer_holds_outstanding_nanos      gauge    their amount
spendbus_enforcer_holds_dropped_total          counter  reason (verdict, timeout)
spendbus_enforcer_counters                     gauge    verdicts held in memory
spendbus_enforcer_budgets                      gauge    budgets in force
spendbus_enforcer_records_total                counter  topic: records read
spendbus_enforcer_undecodable_total            counter  topic, reason: records skipped
spendbus_enforcer_verdicts_ignored_total       counter  older seq or period than held
spendbus_enforcer_refusals_published_total     counter  result (ok: handed to the sink, error): sidecar only
spendbus_enforcer_in_flight_per_key_refusals_  counter  sidecar checks refused 429 before deciding:
total                                                   the key had sidecar_max_in_flight_per_key
                                                        holds unsettled
spendbus_enforcer_replicas                     gauge    the count the share is taken with
spendbus_enforcer_group_members                gauge    membership: the group's last count
spendbus_enforcer_group_rebalances_total       counter  membership: rebalances taken part in
=============================================  =======  ====================================
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from runtime.http_log import expose_malformed_requests

if TYPE_CHECKING:
    from enforcer.holds import Holds
    from enforcer.membership import Membership
    from enforcer.state import EnforcerState

_P = "spendbus_enforcer_"
#: the outcome label per counter state (enforcer.plans.STATE_NAMES, "ok" reads "allowed")
_OUTCOMES = (
    "allowed",
    "alert",
    "exceeded",
    "in_flight",
    "failed_open",
    "failed_closed",
    "too_large",
    "throttled",
    "unpriced",
    "too_many_sessions",
)


class EnforcerMetrics(Collector):
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=False)
        expose_malformed_requests(self.registry)  # refused heads (runtime/http_log.py)
        #: budget id -> check counts per counter state (enforcer.plans.STATE_NAMES order);
        #: the checker's plans bump these lists in place
        self.by_budget: dict[str, list[int]] = {}
        self.decisions: defaultdict[str, int] = defaultdict(int)
        self.peeks: defaultdict[str, int] = defaultdict(int)
        self.records: defaultdict[str, int] = defaultdict(int)
        self.undecodable: defaultdict[tuple[str, str], int] = defaultdict(int)
        self.published: defaultdict[str, int] = defaultdict(int)
        #: sidecar checks refused by the per-key in-flight limit (they decide nothing)
        self.in_flight_per_key_refusals = 0
        self.verdict_lag_s: float | None = None
        self._state: EnforcerState | None = None
        self._holds: Holds | None = None
        self._clock: Callable[[], float] | None = None
        self._replicas: Callable[[], int] | None = None
        self._membership: Membership | None = None
        self.registry.register(self)

    def bind(self, state: EnforcerState, holds: Holds, clock: Callable[[], float]) -> None:
        self._state, self._holds, self._clock = state, holds, clock

    def bind_replicas(self, replicas: Callable[[], int], membership: Membership | None) -> None:
        """The replica count checks use now, and the membership that counts it (if any)."""
        self._replicas, self._membership = replicas, membership

    def budget_counts(self, budget_id: str) -> list[int]:
        """The per-state check counts of one budget (kept across policy changes)."""
        counts = self.by_budget.get(budget_id)
        if counts is None:
            counts = self.by_budget[budget_id] = [0] * len(_OUTCOMES)
        return counts

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def collect(self) -> Iterator[Metric]:
        checks = CounterMetricFamily(
            _P + "checks", "Checks by budget and outcome", labels=["budget", "outcome"]
        )
        for budget, counts in sorted(self.by_budget.items()):
            for outcome, n in zip(_OUTCOMES, counts, strict=True):
                if n:
                    checks.add_metric([budget, outcome], n)
        yield checks
        yield _by_label("decisions", "Decisions by decision value", "decision", self.decisions)
        yield _by_label("peeks", "Checks that count as no request", "decision", self.peeks)
        yield _by_label("records", "Records read from the topics", "topic", self.records)
        undecodable = CounterMetricFamily(
            _P + "undecodable", "Records skipped as unusable", labels=["topic", "reason"]
        )
        for (topic, reason), n in sorted(self.undecodable.items()):
            undecodable.add_metric([topic, reason], n)
        yield undecodable
        yield _by_label(
            "refusals_published", "Refusal events published (sidecar)", "result", self.published
        )
        yield CounterMetricFamily(
            _P + "in_flight_per_key_refusals",
            "Sidecar checks refused before deciding: the key had sidecar_max_in_flight_per_key "
            "holds unsettled",
            value=self.in_flight_per_key_refusals,
        )
        if self.verdict_lag_s is not None:
            yield GaugeMetricFamily(
                _P + "verdict_lag_seconds",
                "Last verdict: applied time minus emitted_at",
                value=self.verdict_lag_s,
            )
        if self._replicas is not None:
            yield GaugeMetricFamily(
                _P + "replicas",
                "Replica count this enforcer's share is taken with (1/replicas of the headroom)",
                value=self._replicas(),
            )
        membership = self._membership
        if membership is not None and membership.count is not None:
            yield GaugeMetricFamily(
                _P + "group_members",
                "Enforcers in the enforcers' consumer group, as the last rebalance counted",
                value=membership.count,
            )
            yield CounterMetricFamily(
                _P + "group_rebalances",
                "Rebalances of the enforcers' group this member took part in",
                value=membership.rebalances,
            )
        state, holds, clock = self._state, self._holds, self._clock
        if state is None or holds is None or clock is None:
            return
        yield GaugeMetricFamily(_P + "ready", "Caught up with start offsets", value=state.ready)
        if state.fresh_at_us is not None:
            staleness = max(0.0, clock() - state.fresh_at_us / 1e6)
            yield GaugeMetricFamily(
                _P + "verdict_staleness_seconds",
                "Seconds since the verdict stream was last confirmed caught up",
                value=staleness,
            )
        yield GaugeMetricFamily(_P + "holds_outstanding", "Holds outstanding", value=len(holds))
        yield GaugeMetricFamily(
            _P + "holds_outstanding_nanos",
            "Nanos held by outstanding holds",
            value=holds.held_nanos,
        )
        dropped = CounterMetricFamily(_P + "holds_dropped", "Holds dropped", labels=["reason"])
        dropped.add_metric(["verdict"], holds.dropped_by_verdict)
        dropped.add_metric(["timeout"], holds.dropped_by_timeout)
        yield dropped
        yield GaugeMetricFamily(_P + "counters", "Verdicts held", value=len(state.verdicts))
        yield GaugeMetricFamily(_P + "budgets", "Budgets in force", value=len(state.budgets))
        yield CounterMetricFamily(
            _P + "verdicts_ignored",
            "Verdicts ignored (older seq or period)",
            value=state.verdicts_ignored,
        )


def _by_label(name: str, doc: str, label: str, values: dict[str, int]) -> CounterMetricFamily:
    family = CounterMetricFamily(_P + name, doc, labels=[label])
    for key, n in sorted(values.items()):
        family.add_metric([key], n)
    return family
