"""The notifier's Prometheus metrics, labelled by webhook id (never its URL)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge


@dataclass
class NotifyMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.delivered = Counter(
            "spendbus_notify_delivered", "alerts delivered (2xx)", ["webhook"], registry=r
        )
        self.failed = Counter(
            "spendbus_notify_failed", "alerts given up (recorded failed)", ["webhook"], registry=r
        )
        self.retried = Counter(
            "spendbus_notify_retries",
            "attempts that failed and were retried",
            ["webhook"],
            registry=r,
        )
        self.skipped_repeats = Counter(
            "spendbus_notify_repeats_skipped",
            "alerts already finished for the webhook, seen again on the topic",
            ["webhook"],
            registry=r,
        )
        self.queued = Gauge(
            "spendbus_notify_queued", "alerts waiting for the webhook", ["webhook"], registry=r
        )
        self.unreadable = Counter(
            "spendbus_notify_unreadable_alerts", "alert records that cannot be decoded", registry=r
        )
