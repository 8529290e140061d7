"""The ingest publisher: the one way a Python proxy publishes UsageEvents.

Every event is validated, encoded once (its event_id and bytes are fixed from
then on), written ahead to a bounded on-disk spool and published in the
background by an idempotent Kafka producer; see ``README.md`` beside this file
for the guarantees.
"""

from ingest.errors import PublisherClosed, PublishTimeout, SpoolFull, SpoolLocked
from ingest.publisher.config import PublisherConfig
from ingest.publisher.publisher import PreparedEvent, UsagePublisher, prepare
from schemas.errors import InvalidRecord

__all__ = [
    "InvalidRecord",
    "PreparedEvent",
    "PublishTimeout",
    "PublisherClosed",
    "PublisherConfig",
    "SpoolFull",
    "SpoolLocked",
    "UsagePublisher",
    "prepare",
]
