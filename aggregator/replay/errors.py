"""The replay shelf's one error: a replay that cannot go on, with the reason."""

from __future__ import annotations

from aggregator.errors import AggregatorError


class ReplayError(AggregatorError):
    """A replay cannot go on: a generation that will not start, attach or cut over."""
