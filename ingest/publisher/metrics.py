"""Prometheus metrics of one publisher.

Each publisher registers its metrics in the registry it is given; by default a
private :class:`~prometheus_client.CollectorRegistry` (so several publishers in
one process, as in tests, do not collide). A proxy exposing its own
``/metrics`` passes ``prometheus_client.REGISTRY``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from schemas.avro_schemas import expanded_schemas

#: the values ``spendbus_ingest_rejected_events_total{field}`` takes: the UsageEvent's
#: fields and ``<event>`` (the record as a whole); any other name a client sent (an
#: unknown field) is ``other``, so a client cannot mint label values (issue 21)
REJECTED_FIELD_LABELS: Final = frozenset(
    [f["name"] for f in expanded_schemas()["UsageEvent"]["fields"]] + ["<event>"]
)
OTHER_FIELD: Final = "other"


class _CallbackCounter(Collector):
    """A counter whose value a callback reads at scrape time: free on the hot path."""

    def __init__(self, name: str, documentation: str, read: Callable[[], float]) -> None:
        self._name = name
        self._documentation = documentation
        self._read = read

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(self._name, self._documentation, value=self._read())


class PublisherMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.published = Counter(
            "spendbus_ingest_published_events",
            "UsageEvents acknowledged by the broker (re-sends after a reconnect count again)",
            registry=registry,
        )
        self.batches = Counter(
            "spendbus_ingest_batches",
            "producer batches handed to Kafka (published events / batches: events per request)",
            registry=registry,
        )
        self.rejected_by_field = Counter(
            "spendbus_ingest_rejected_events",
            "events refused as invalid, by the field at fault (a field the UsageEvent does "
            "not have: other)",
            ["field"],
            registry=registry,
        )
        self.spool_bytes = Gauge(
            "spendbus_ingest_spool_bytes",
            "bytes of spooled events not yet acknowledged by the broker",
            registry=registry,
        )
        self.spool_disk_bytes = Gauge(
            "spendbus_ingest_spool_disk_bytes",
            "bytes of the spool's segment files on disk",
            registry=registry,
        )
        self.spool_full = Counter(
            "spendbus_ingest_spool_full",
            "publish calls that found the spool full, by what happened: "
            "waited (then had room), refused (SpoolFull raised), dropped (policy drop_newest)",
            ["action"],
            registry=registry,
        )
        self.dropped = Counter(
            "spendbus_ingest_dropped_events",
            "events dropped because the spool was full (policy drop_newest)",
            registry=registry,
        )
        self.send_errors = Counter(
            "spendbus_ingest_send_errors",
            "failures to reach or publish to Kafka, by exception type (the events stay spooled)",
            ["error"],
            registry=registry,
        )
        self.spool_recovered_bytes = Counter(
            "spendbus_ingest_spool_truncated_bytes",
            "bytes of torn or corrupt spool data cut off or skipped (crash recovery)",
            registry=registry,
        )
        self.connected = Gauge(
            "spendbus_ingest_kafka_connected",
            "1 while the sender holds a working producer, else 0",
            registry=registry,
        )

    def spooled_from(self, read: Callable[[], float]) -> None:
        """Register ``spendbus_ingest_spooled_events_total``, read from the publisher's count."""
        self.registry.register(
            _CallbackCounter(
                "spendbus_ingest_spooled_events",
                "UsageEvents written to the spool (accepted by publish)",
                read,
            )
        )

    def rejected(self, field: str) -> None:
        """Count one event refused for ``field`` (a name outside the schema counts as other)."""
        label = field if field in REJECTED_FIELD_LABELS else OTHER_FIELD
        self.rejected_by_field.labels(label).inc()
