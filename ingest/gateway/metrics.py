"""The gateway's Prometheus counters (``GET /metrics``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from runtime.http_log import expose_malformed_requests
from schemas.usage import USAGE_SOURCES

#: the API families the gateway meters (its metrics' ``family`` label)
FAMILIES = ("openai", "anthropic", "gemini", "bedrock")


class GatewayMetrics:
    """Requests, responses by usage source, cuts, publish results and realtime refusals,
    in one registry."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.registry = registry or CollectorRegistry()
        expose_malformed_requests(self.registry)  # refused heads (runtime/http_log.py)
        self.requests = Counter(
            "spendbus_gateway_requests",
            "Requests by API family and outcome",
            ["family", "outcome"],
            registry=self.registry,
        )
        self.cuts = Counter(
            "spendbus_gateway_cuts",
            "Responses that did not end normally, by cause",
            ["cut"],
            registry=self.registry,
        )
        self.published = Counter(
            "spendbus_gateway_events",
            "Usage events by publish result",
            ["result"],
            registry=self.registry,
        )
        # the hot path's children, looked up once (a labels() call costs microseconds)
        self.allowed = {family: self.requests.labels(family, "allowed") for family in FAMILIES}
        # seed 003's responses by outcome, here rather than only in ClickHouse: how each
        # metered response's usage was known (schemas.usage.USAGE_SOURCES); every child is
        # made now, so a source never seen still reads 0 instead of being absent
        self.responses = Counter(
            "spendbus_gateway_responses",
            "Metered responses by how their usage was known: reported by the provider, "
            "estimated (cut, unreadable), or none (an upstream error without usage)",
            ["family", "usage_source"],
            registry=self.registry,
        )
        self.by_usage_source = {
            (family, source): self.responses.labels(family, source)
            for family in FAMILIES
            for source in USAGE_SOURCES
        }
        self.published_ok = self.published.labels("ok")
        self.realtime_frames_refused = Counter(
            "spendbus_gateway_realtime_frames_refused",
            "Realtime client frames not forwarded because the gateway cannot read them",
            ["reason"],  # binary, not_json, too_deep, duplicate_key, no_type
            registry=self.registry,
        )
        self.realtime_server_refused = Counter(
            "spendbus_gateway_realtime_server_responses_refused",
            "Realtime responses the server started (voice activity) refused and cancelled",
            registry=self.registry,
        )
        self.upstream_errors = Counter(
            "spendbus_gateway_upstream_unreachable",
            "Requests whose upstream could not be reached (hold released, not charged)",
            ["family"],
            registry=self.registry,
        )
