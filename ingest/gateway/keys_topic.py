"""Virtual keys from the compacted keys topic (``Topics.gateway_keys``), followed live.

Each record is keyed by ``hmac-sha256:`` and the keyed digest of a virtual key
(``key_hmac``: HMAC-SHA256 under the server-side key secret; the key itself is
never on the topic), or, written before keyed digests, by the plain SHA-256 hex
(still read: converted under the secret; ``spendbus keys migrate`` rewrites
them); its value is a ``VirtualKey`` Avro record (the key
entry's name and principal), and a tombstone revokes the key.

The follower reads the topic from the start and is ready once it reached the
end offsets it saw when it started; it keeps applying records after that, so
a key applied or revoked later takes effect without a restart. Rules, the same
on every gateway and after every restart (what compaction leaves is each
key's last record):

- a key of the config file wins: a topic record with the same digest, or with
  the same name for another digest, is skipped (``shadowed_by_file``,
  ``name_conflict``);
- a record that cannot be used (bad key, undecodable bytes, invalid fields, a
  ``secret_id`` this gateway has no credential for) is skipped with its reason
  logged and counted, and the key it names stops working: its last record is
  what counts, and that record is unusable.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import re
from datetime import datetime
from types import TracebackType
from typing import Any, Final

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from prometheus_client import CollectorRegistry, Counter
from pydantic import ValidationError

from runtime.kafka import PLAINTEXT, KafkaSecurity, topic_partitions
from runtime.topic_reader import read_until, start_at_beginning
from schemas.codec import GATEWAY_KEY
from schemas.errors import DecodeError, SpendbusError
from schemas.virtual_keys import KEYED_PREFIX, key_topic_record

from .config import GatewayConfig, Principal, VirtualKey
from .identity import KeyStore

log = logging.getLogger("spendbus.gateway.keys")

#: a record key: a keyed digest, or (legacy) the plain SHA-256 hex of a virtual key
DIGEST_PATTERN: Final = re.compile(r"(?:hmac-sha256:)?[0-9a-f]{64}")


def record_key(vk_digest: str) -> str:
    """The topic record key of a keyed digest."""
    return KEYED_PREFIX + vk_digest


class KeysNotReady(SpendbusError):
    """The keys topic was not caught up in time (the gateway does not serve without its keys)."""


def key_record(vk: VirtualKey, applied_at: datetime) -> dict[str, Any]:
    """The topic value of ``vk`` (its digest is the record key)."""
    p = vk.principal
    return key_topic_record(
        name=vk.name,
        org_id=p.org_id,
        secret_id=p.secret_id,
        project_id=p.project_id,
        grant_id=p.grant_id,
        user_id=p.user_id,
        groups=p.groups,
        tags=dict(p.tags),
        applied_at=applied_at,
    )


def key_from_record(key: str, record: dict[str, Any]) -> VirtualKey:
    """The VirtualKey a topic record (its record key and value) names; pydantic's
    ValidationError when a field is invalid."""
    keyed = key.startswith(KEYED_PREFIX)
    hex_digest = key.removeprefix(KEYED_PREFIX)
    return VirtualKey(
        name=record["name"],
        key_hmac=hex_digest if keyed else None,
        key_sha256=None if keyed else hex_digest,
        principal=Principal(
            org_id=record["org_id"],
            secret_id=record["secret_id"],
            project_id=record["project_id"],
            grant_id=record["grant_id"],
            user_id=record["user_id"],
            groups=tuple(record["groups"]),
            tags=record["tags"],
        ),
    )


class KeysTopicFollower:
    """Follows ``topic`` into ``store`` (the gateway's KeyStore), beside ``config.keys``.

    ``start`` → ``wait_ready`` (caught up with the end offsets seen at start) → live
    updates until ``stop``. ``skipped`` counts unusable records by reason.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        store: KeyStore,
        config: GatewayConfig,
        *,
        client_id: str = "spendbus-gateway-keys",
        registry: CollectorRegistry | None = None,
        security: KafkaSecurity = PLAINTEXT,
    ) -> None:
        self.bootstrap = bootstrap
        self.security = security
        self.topic = topic
        self.store = store
        self.client_id = client_id
        self._secrets = frozenset(config.secrets)
        self._file_keys = {store.digest(vk): vk for vk in config.keys}
        self._file_names = {vk.name: store.digest(vk) for vk in config.keys}
        #: the topic's usable keys by digest (what the store holds besides the file's keys)
        self.topic_keys: dict[str, VirtualKey] = {}
        #: name -> digest of the topic's usable keys (a name conflict is one lookup)
        self._topic_names: dict[str, str] = {}
        #: digest -> the record key (keyed or legacy form) its live record came from
        self._record_keys: dict[str, str] = {}
        self.skipped: collections.Counter[str] = collections.Counter()
        self.applied = 0
        self.revoked = 0
        self._records = Counter(
            "spendbus_gateway_keys_topic_records",
            "Records of the keys topic by result (applied, revoked, or the reason it was skipped)",
            ["result"],
            registry=registry or CollectorRegistry(),
        )
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._failure: BaseException | None = None

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        partitions = await topic_partitions(self.bootstrap, self.topic, security=self.security)
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            client_id=self.client_id,
            group_id=None,  # every gateway reads the whole topic; no offsets to commit
            enable_auto_commit=False,
            **self.security.client_kwargs(),
        )
        await consumer.start()
        try:
            ends = await start_at_beginning(consumer, partitions)
        except BaseException:
            await consumer.stop()
            raise
        self._consumer = consumer
        self._task = asyncio.create_task(self._follow(consumer, ends), name="gateway-keys-topic")

    async def wait_ready(self, timeout_s: float | None = None) -> None:
        """Return once caught up; KeysNotReady after ``timeout_s`` or when following failed."""
        if self._task is None:
            raise KeysNotReady(f"keys topic {self.topic!r}: the follower is not started")
        ready = asyncio.ensure_future(self._ready.wait())
        try:
            await asyncio.wait(
                {ready, self._task}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            ready.cancel()
        if self._ready.is_set():
            return
        if self._failure is not None:
            raise KeysNotReady(
                f"keys topic {self.topic!r}: following failed: {self._failure!r}"
            ) from self._failure
        raise KeysNotReady(
            f"keys topic {self.topic!r}: not caught up with its end offsets in {timeout_s} s"
        )

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None

    async def __aenter__(self) -> KeysTopicFollower:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # -- following -------------------------------------------------------------------------
    async def _follow(self, consumer: AIOKafkaConsumer, ends: dict[TopicPartition, int]) -> None:
        try:
            async for _, messages in read_until(consumer, ends):
                for message in messages:
                    self.apply(message)
            self._caught_up()
            while True:
                batches = await consumer.getmany(timeout_ms=1000)
                for messages in batches.values():
                    for message in messages:
                        self.apply(message)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # wait_ready reports it; a live gateway keeps the keys it has
            self._failure = exc
            log.exception("keys topic %r: following stopped", self.topic)
            raise

    def _caught_up(self) -> None:
        log.info(
            "keys topic %r caught up: %d keys from the topic, %d from the file, skipped %s",
            self.topic,
            len(self.topic_keys),
            len(self._file_keys),
            dict(self.skipped) or "none",
        )
        self._ready.set()

    def apply(self, message: ConsumerRecord[Any, Any]) -> None:
        """Apply one record of the topic (public for the follower's unit tests)."""
        where = f"{message.topic}[{message.partition}]@{message.offset}"
        raw_key = message.key
        key = raw_key.decode("ascii", "replace") if isinstance(raw_key, bytes) else ""
        if not DIGEST_PATTERN.fullmatch(key):
            self._skip("bad_key", where, "record key is not the digest of a key", None)
            return
        digest = (
            key.removeprefix(KEYED_PREFIX)
            if key.startswith(KEYED_PREFIX)
            else self.store.digest_of_sha256(key)
        )
        if digest in self._file_keys:
            if message.value is not None:
                self._skip("shadowed_by_file", where, "the config file defines this key", None)
            return
        holder_key = self._record_keys.get(digest, key)
        if holder_key != key and holder_key.startswith(KEYED_PREFIX):
            # the legacy record of a key already migrated (`keys migrate`, `keys apply`):
            # its tombstone or an older value must not revoke or replace the keyed one
            self._records.labels("superseded").inc()
            return
        if message.value is None:
            if self._drop(digest):
                self.revoked += 1
                self._records.labels("revoked").inc()
            return
        try:
            vk = key_from_record(key, GATEWAY_KEY.decode(message.value))
        except DecodeError as exc:
            self._skip(exc.reason, where, str(exc), digest)
            return
        except ValidationError as exc:
            field = ".".join(str(p) for p in exc.errors()[0]["loc"])
            reason = exc.errors()[0]["msg"].removeprefix("Value error, ")
            self._skip("invalid", where, f"field {field!r}: {reason}", digest)
            return
        if vk.principal.secret_id not in self._secrets:
            self._skip(
                "unknown_secret",
                where,
                f"no secret named {vk.principal.secret_id!r} in this gateway's config",
                digest,
            )
            return
        holder = self._file_names.get(vk.name) or self._topic_names.get(vk.name, digest)
        if holder != digest:
            self._skip("name_conflict", where, f"name {vk.name!r} is another key's", digest)
            return
        self._drop(digest)  # an update may rename the key
        self.topic_keys[digest] = vk
        self._topic_names[vk.name] = digest
        self._record_keys[digest] = key
        self.store.put(vk)
        self.applied += 1
        self._records.labels("applied").inc()

    def _drop(self, digest: str) -> bool:
        """Forget the topic's key ``digest``; True if it was live."""
        vk = self.topic_keys.pop(digest, None)
        if vk is None:
            return False
        self._topic_names.pop(vk.name, None)
        self._record_keys.pop(digest, None)
        self.store.remove(digest)
        return True

    def _skip(self, reason: str, where: str, detail: str, digest: str | None) -> None:
        """Count and log an unusable record; the key it names (if any) stops working."""
        self.skipped[reason] += 1
        self._records.labels(reason).inc()
        dropped = digest is not None and self._drop(digest)
        log.warning(
            "keys topic %s skipped (%s): %s%s",
            where,
            reason,
            detail,
            f"; key {digest[:12]} no longer works" if dropped and digest else "",
        )


__all__ = [
    "DIGEST_PATTERN",
    "KEYED_PREFIX",
    "KeysNotReady",
    "KeysTopicFollower",
    "key_from_record",
    "key_record",
    "record_key",
]
