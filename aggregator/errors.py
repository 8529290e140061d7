"""The aggregator's errors, one tree under ``schemas.errors.SpendbusError``::

    SpendbusError                    (schemas.errors)
    └── AggregatorError              the aggregator failed
        ├── CountingError            the counting stage cannot go on: the worker stops
        │                            (aggregator/counting/errors.py)
        ├── SinkError                the ClickHouse sink failed, and its kinds
        │                            (aggregator/sink/errors.py)
        └── ReplayError              a replay cannot go on (aggregator/replay/errors.py)

The alerts shelf raises none of its own: the publisher retries what Kafka and the store
refuse and reports it in its figures.
"""

from __future__ import annotations

from schemas.errors import SpendbusError


class AggregatorError(SpendbusError):
    """Root of the aggregator's errors."""
