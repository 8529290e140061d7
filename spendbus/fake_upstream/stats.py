"""What the fake providers served, in total and by route: requests, bytes, faults and
the usage billed (``usage`` the body carried whole, ``usage_unreported`` it did not)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .usage import FakeUsage

_USAGE_FIELDS = tuple(FakeUsage(0, 0).as_dict())


@dataclass
class RouteStats:
    requests: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    errors: int = 0
    cuts: int = 0
    stream_errors: int = 0
    client_disconnects: int = 0
    #: Realtime: responses started, cancels honoured, client text and binary frames
    responses: int = 0
    cancels: int = 0
    client_events: int = 0
    binary_in: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    usage: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_USAGE_FIELDS, 0))
    usage_unreported: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(_USAGE_FIELDS, 0)
    )

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "errors": self.errors,
            "cuts": self.cuts,
            "stream_errors": self.stream_errors,
            "client_disconnects": self.client_disconnects,
            "responses": self.responses,
            "cancels": self.cancels,
            "client_events": self.client_events,
            "binary_in": self.binary_in,
            "statuses": dict(sorted(self.statuses.items())),
            "usage": dict(self.usage),
            "usage_unreported": dict(self.usage_unreported),
        }


class Stats:
    """Counters of everything served, in total and by route."""

    def __init__(self) -> None:
        self.total = RouteStats()
        self.routes: dict[str, RouteStats] = {}

    def reset(self) -> None:
        self.total = RouteStats()
        self.routes = {}

    def each(self, route: str) -> tuple[RouteStats, RouteStats]:
        per = self.routes.get(route)
        if per is None:
            per = self.routes[route] = RouteStats()
        return self.total, per

    def add(self, route: str, name: str, amount: int = 1) -> None:
        for stats in self.each(route):
            setattr(stats, name, getattr(stats, name) + amount)

    def status(self, route: str, status: int) -> None:
        for stats in self.each(route):
            stats.statuses[str(status)] = stats.statuses.get(str(status), 0) + 1

    def billed(self, route: str, usage: FakeUsage, *, reported: bool) -> None:
        for stats in self.each(route):
            bucket = stats.usage if reported else stats.usage_unreported
            for name, value in usage.as_dict().items():
                bucket[name] += value

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.total.as_dict(),
            "routes": {route: s.as_dict() for route, s in sorted(self.routes.items())},
        }
