"""The counting stage's one error: it cannot go on, so the worker must stop."""

from __future__ import annotations

from aggregator.errors import AggregatorError


class CountingError(AggregatorError):
    """The counting stage cannot go on (a delivery failed): the worker must stop."""
