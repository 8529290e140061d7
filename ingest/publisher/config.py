"""The publisher's configuration: one frozen, validated value object.

Only the command line (``spendbus ingest``) reads the environment; a proxy
embedding the publisher builds a :class:`PublisherConfig` itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from runtime.kafka import PLAINTEXT, KafkaSecurity
from schemas.topics import Topics

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

SpoolFullPolicy = Literal["block", "drop_newest"]
FsyncPolicy = Literal["always", "interval", "never"]
Compression = Literal["lz4", "gzip", "zstd", "snappy", "none"]


def default_compression() -> Compression:
    """lz4 when aiokafka can use it (it needs the ``cramjam`` package), else gzip."""
    from aiokafka.codec import has_lz4

    return "lz4" if has_lz4() else "gzip"


class PublisherConfig(BaseModel):
    """Everything a :class:`~ingest.publisher.UsagePublisher` needs.

    Defaults favour a proxy: never lose an acknowledged ``publish()``, keep the
    hot path off the disk's fsync latency (fsync every ``fsync_interval_ms``),
    and wait up to ``spool_full_timeout_s`` for room before refusing an event.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Kafka bootstrap servers, ``host:port[,host:port...]``
    bootstrap: str = Field(min_length=1)
    #: how the sender's producer connects (PLAINTEXT unless set)
    kafka_security: KafkaSecurity = PLAINTEXT
    #: prefix of every topic name (see :class:`schemas.topics.Topics`)
    topic_prefix: str = ""
    #: the spool directory; one publisher (one process) per directory
    spool_dir: Path
    #: bound on the bytes of spooled events not yet acknowledged by the broker
    spool_max_bytes: int = Field(default=1 * GiB, ge=64 * KiB)
    #: a segment file is sealed and a new one started past this size
    segment_bytes: int = Field(default=64 * MiB, ge=4 * KiB)
    #: what a publish does when the spool is full: ``block`` waits up to
    #: ``spool_full_timeout_s`` for room then raises SpoolFull; ``drop_newest``
    #: drops the new events at once (logged, counted in spool_full_total)
    spool_full_policy: SpoolFullPolicy = "block"
    spool_full_timeout_s: float = Field(default=5.0, ge=0)
    #: ``always``: publish() returns after fsync (group commit: concurrent
    #: publishers share one fsync); ``interval``: a background fsync every
    #: ``fsync_interval_ms`` (a process crash loses nothing, a power loss at most
    #: that window); ``never``: leave it to the OS
    fsync: FsyncPolicy = "interval"
    fsync_interval_ms: int = Field(default=200, ge=1)
    #: how long a batch waits for more records once its first is spooled (Kafka's linger.ms;
    #: its default since Kafka 4.0 is 5 ms too)
    linger_ms: int = Field(default=5, ge=0)
    compression: Compression = Field(default_factory=default_compression)
    #: bytes of one producer batch (per partition), before compression
    max_batch_bytes: int = Field(default=512 * KiB, ge=16 * KiB, le=8 * MiB)
    #: the sender reads at most this much from the spool per round
    read_chunk_bytes: int = Field(default=1 * MiB, ge=16 * KiB)
    #: spooled bytes sent but not yet acknowledged, at most
    max_in_flight_bytes: int = Field(default=16 * MiB, ge=64 * KiB)
    #: an encoded event larger than this is refused as invalid (the broker would refuse it)
    max_record_bytes: int = Field(default=256 * KiB, ge=1 * KiB)
    #: produce request timeout; also bounds how long one send may block
    send_timeout_ms: int = Field(default=30_000, ge=1_000)
    #: backoff between reconnection attempts, doubling up to the max
    retry_backoff_ms: int = Field(default=100, ge=1)
    retry_backoff_max_ms: int = Field(default=5_000, ge=1)
    #: the acknowledged position is written to disk at most this often
    cursor_interval_ms: int = Field(default=100, ge=1)
    client_id: str = "spendbus-ingest"

    @model_validator(mode="after")
    def _check(self) -> PublisherConfig:
        if self.segment_bytes > self.spool_max_bytes:
            raise ValueError("segment_bytes must not exceed spool_max_bytes")
        if self.retry_backoff_max_ms < self.retry_backoff_ms:
            raise ValueError("retry_backoff_max_ms must be >= retry_backoff_ms")
        if self.max_record_bytes > self.max_batch_bytes:
            raise ValueError("max_record_bytes must not exceed max_batch_bytes")
        if self.compression in ("lz4", "zstd", "snappy"):
            from aiokafka.codec import has_lz4, has_snappy, has_zstd

            available = {"lz4": has_lz4, "zstd": has_zstd, "snappy": has_snappy}
            if not available[self.compression]():
                raise ValueError(f"compression {self.compression!r} needs the cramjam package")
        return self

    @property
    def topic(self) -> str:
        """The topic events are published to: ``<prefix>usage.raw``."""
        return Topics(self.topic_prefix).usage_raw
