"""The aggregator's configuration: one frozen object; only the CLI reads the environment."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from runtime.clickhouse_access import DEFAULT_ACCESS, ClickHouseAccess
from runtime.kafka import PLAINTEXT, KafkaSecurity
from runtime.net import is_loopback
from runtime.replication import FOLLOW_CLUSTER, ReplicationPolicy
from schemas.budgets import SESSION_IDLE_SECONDS
from schemas.errors import ConfigError
from schemas.periods import MAX_FUTURE_SKEW_SECONDS
from schemas.topics import Topics, check_generation


class AggregatorConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    bootstrap: str = Field(description="Kafka bootstrap servers, host:port[,host:port]")
    #: how every Kafka client of the worker connects (the Faust app, the counting stage,
    #: the reference followers, the alert relay); PLAINTEXT unless the settings say otherwise
    kafka_security: KafkaSecurity = PLAINTEXT
    clickhouse_dsn: str | None = Field(
        default=None,
        repr=False,  # a DSN may carry a password
        description="chdb:///abs/path (embedded) or http(s)://host:8123; None = no sink",
    )
    topic_prefix: str = ""
    #: replicas of every topic the worker creates (its changelogs, Faust's own topics):
    #: followed from the cluster unless the settings say otherwise (runtime/replication.py)
    replication: ReplicationPolicy = FOLLOW_CLUSTER
    #: the generation this worker builds ('' = the default one; docs/replay.md): picks the
    #: derived topics (usage.priced, budget.verdicts, alert staging) through ``topics``
    generation: str = ""
    #: Faust app id (consumer group, table namespace): ``Topics.aggregator_app_id``
    app_id: str = "spendbus-aggregator"
    data_dir: Path = Path(".spendbus/aggregator")
    #: rocksdb:// for durable local table state (recovered from changelogs), memory:// for tests
    store: str = "rocksdb://"
    partitions: int = Field(default=4, ge=1)
    #: the address the web server binds (Faust's web_bind); off loopback every page
    #: needs the token
    web_host: str = "127.0.0.1"
    web_port: int = Field(default=6066, ge=0, le=65535)
    #: the bearer token of the web pages: /sql always needs it (no token: /sql answers
    #: 403), /stats and /metrics need it when web_host is not loopback
    web_token: SecretStr | None = None
    #: a /sql body must arrive within this many seconds of its head (408 after): a slow
    #: sender holds no handler longer
    web_body_timeout_s: float = Field(default=60.0, gt=0)
    #: TLS options and password of an https:// ClickHouse server (clickhouse_dsn)
    clickhouse_access: ClickHouseAccess = DEFAULT_ACCESS
    #: most usage.raw records the counting stage reads and folds as one batch (getmany)
    batch_size: int = Field(default=5000, ge=1)
    #: a counter whose spend moved (state unchanged) sends its Verdict at most this often;
    #: a change of state or period goes out at once (aggregator/counting/verdicts.py)
    batch_seconds: float = Field(default=0.05, gt=0, le=0.1)
    #: how often the counting stage flushes its outputs and changelogs and commits offsets;
    #: also bounds what a crash re-delivers (the fences absorb it)
    commit_seconds: float = Field(default=1.0, gt=0, le=10.0)
    #: new event ids held in memory before a checkpoint writes them to the local RocksDB;
    #: reaching it checkpoints early (the in-memory part of the dedupe is bounded by it)
    max_pending_event_ids: int = Field(default=100_000, ge=1000)
    #: an event whose occurred_at is further ahead than this of when it reached Kafka is
    #: dead-lettered (reason future_event) instead of counted (aggregator/README.md)
    max_future_skew_seconds: float = Field(default=MAX_FUTURE_SKEW_SECONDS, ge=0, le=86_400)
    #: a session counter idle this long is pruned, with a tombstone on its verdict
    #: (aggregator/counting/pruning.py), as are the counters of removed budgets
    session_idle_seconds: float = Field(default=SESSION_IDLE_SECONDS, gt=0)
    #: how often the counting stage looks for counters to prune
    prune_seconds: float = Field(default=60.0, gt=0)
    #: run the sink stage in an OS process of its own, which owns the store (the worker
    #: starts, restarts and stops it: aggregator/sink/process.py); off (the default): on
    #: the worker's own event loop, beside the counting stage
    sink_process: bool = False
    #: an embedded store's engine in a process of its own, which cannot open a file
    #: outside the store and is killed when a query outlives its time limit
    #: (aggregator/sink/engine_host.py); off: the engine in the process that owns the store
    engine_process: bool = True
    sink_batch_size: int = Field(default=50_000, ge=1, le=100_000)
    sink_batch_seconds: float = Field(default=0.5, gt=0)
    session_timeout_s: float = Field(default=10.0, ge=3.0)
    log_level: str = "WARNING"

    @field_validator("generation")
    @classmethod
    def _valid_generation(cls, value: str) -> str:
        try:
            return check_generation(value)
        except ConfigError as exc:  # pydantic reports ValueErrors with the field's name
            raise ValueError(str(exc)) from None

    @model_validator(mode="after")
    def _token_off_loopback(self) -> AggregatorConfig:
        if self.web_token is None and not is_loopback(self.web_host):
            raise ValueError(
                f"the worker's web server would listen on {self.web_host!r} without a token: "
                "set SPENDBUS_WEB_TOKEN_FILE (or SPENDBUS_WEB_TOKEN), or bind 127.0.0.1"
            )
        if self.web_token is not None and not self.web_token.get_secret_value():
            raise ValueError("web_token must not be empty")
        return self

    @property
    def counting_group(self) -> str:
        """The consumer group of the counting stage on usage.raw (its committed offsets)."""
        return self.app_id

    @property
    def sink_app_id(self) -> str:
        """The consumer group of the sink stage on usage.priced and budget.verdicts."""
        return f"{self.app_id}-sink"

    @property
    def worker_app_id(self) -> str:
        """The Faust app id: Faust's own group and topics (it reads no topic of ours; each
        stage's group speaks another assignor protocol, so it is a group apart)."""
        return f"{self.app_id}-worker"

    @property
    def counter_changelog(self) -> str:
        """Compacted topic of the counters' state, co-partitioned with usage.raw."""
        return f"{self.app_id}-counter-state-changelog"

    @property
    def seen_changelog(self) -> str:
        """Compacted topic of the event-id dedupe state, co-partitioned with usage.raw."""
        return f"{self.app_id}-seen-events-changelog"

    @property
    def topics(self) -> Topics:
        """Every topic name this worker reads and writes, for its generation."""
        return Topics(self.topic_prefix, self.generation)
