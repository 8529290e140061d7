"""What the admin API reads and writes: the compacted budget, raise and key topics (the
very records the CLI writes) followed live, and the audit topic.

A write is published with ``acks=all`` and applied to the view once acknowledged, then
its audit entry is published the same way; only then is the request answered, so a GET
that follows reads it (read your writes). Writes go one at a time (one lock): a create's
"does it exist?" and its publish cannot interleave with another's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Final

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from admin.access import Caller
from admin.alerts import AlertLog
from admin.answers import Answer, answers_key, new_answer, request_digest, seal, slot_key, unseal
from admin.errors import ApiError
from runtime.compacted import CompactedView, publish_with
from runtime.kafka import PLAINTEXT, KafkaSecurity
from schemas.admin_audit import decode_entry, encode_entry, new_audit_entry
from schemas.budgets import Budget
from schemas.codec import BUDGET_POLICY, BUDGET_RAISE, GATEWAY_KEY, VERDICT
from schemas.errors import ContractError
from schemas.generations import GenerationSwitch
from schemas.raises import BudgetRaise, RaiseBook
from schemas.topics import CONTROL_KEY, Topics

#: seconds a write waits for the broker's acknowledgement before answering 503
ACK_TIMEOUT_S: Final = 15.0

log = logging.getLogger("spendbus.admin.store")


def _verdict_or_none(value: bytes) -> dict[str, Any] | None:
    try:
        return dict(VERDICT.decode(value))
    except ContractError:  # what the enforcers skip too
        return None


@dataclass(frozen=True)
class AdminConfig:
    bootstrap: str
    topics: Topics
    #: the server-side secret virtual keys are digested with (the gateways')
    key_secret: bytes
    security: KafkaSecurity = PLAINTEXT


@dataclass
class AdminStore:
    config: AdminConfig
    view: CompactedView = field(init=False)
    _producer: AIOKafkaProducer | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: held through an idempotent POST: a retry sent while the first is in flight waits
    _once_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: seals the Idempotency-Key answers on admin.idempotency (admin/answers.py)
    _answers_key: AESGCM = field(init=False)
    #: the current generation's verdicts, followed from the first counters read on
    _verdicts: CompactedView | None = None
    _verdicts_topic: str = ""
    _verdicts_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: (topic, key) -> (the value decoded, what it decoded to): a read decodes only
    #: what changed since the last one
    _decoded: dict[tuple[str, bytes], tuple[bytes, Any]] = field(default_factory=dict)
    #: the shared alert topic and the notifier's deliveries, as the view reads them
    alert_log: AlertLog = field(default_factory=AlertLog)

    def __post_init__(self) -> None:
        t = self.config.topics
        self.view = CompactedView(
            self.config.bootstrap,
            [
                t.budget_policies,
                t.budget_raises,
                t.gateway_keys,
                t.admin_audit,
                t.generations,
                t.shared_alerts,
                t.notify_deliveries,
                t.admin_idempotency,
            ],
            security=self.config.security,
            on_change=self._changed,
        )
        self._answers_key = answers_key(self.config.key_secret)

    def _changed(self, topic: str, key: bytes, value: bytes | None) -> None:
        topics = self.config.topics
        if topic == topics.shared_alerts:
            if value is not None:
                self.alert_log.add_alert(value)
            return
        if topic == topics.notify_deliveries:
            self.alert_log.add_delivery(key, value)

    async def start(self) -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=self.config.bootstrap,
            acks="all",
            enable_idempotence=True,
            request_timeout_ms=int(ACK_TIMEOUT_S * 1000),
            **self.config.security.client_kwargs(),
        )
        await producer.start()
        try:
            await self.view.start()
        except BaseException:
            await producer.stop()
            raise
        self._producer = producer

    async def stop(self) -> None:
        if self._verdicts is not None:
            await self._verdicts.stop()
            self._verdicts = None
        await self.view.stop()
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

    # --- reads ---------------------------------------------------------------------------
    def _decode(self, topic: str, key: bytes, value: bytes, decode: Callable[[bytes], Any]) -> Any:
        held = self._decoded.get((topic, key))
        if held is not None and held[0] == value:
            return held[1]
        decoded = decode(value)
        self._decoded[(topic, key)] = (value, decoded)
        return decoded

    def _decoded_values(
        self, topic: str, values: dict[bytes, bytes], decode: Callable[[bytes], Any]
    ) -> dict[bytes, Any]:
        """``values`` decoded, each only once while it stays the same (tombstoned keys'
        entries are let go)."""
        out = {key: self._decode(topic, key, value, decode) for key, value in values.items()}
        gone = [k for k in self._decoded if k[0] == topic and k[1] not in values]
        for k in gone:
            del self._decoded[k]
        return out

    def budgets(self) -> dict[str, Budget]:
        topic = self.config.topics.budget_policies
        decoded = self._decoded_values(
            topic,
            self.view.values(topic),
            lambda value: Budget.from_record(BUDGET_POLICY.decode(value)),
        )
        return {budget.budget_id: budget for budget in decoded.values()}

    def raises(self) -> dict[str, BudgetRaise]:
        topic = self.config.topics.budget_raises
        decoded = self._decoded_values(
            topic,
            self.view.values(topic),
            lambda value: BudgetRaise.from_record(BUDGET_RAISE.decode(value)),
        )
        return {key.decode(): found for key, found in decoded.items()}

    def keys(self) -> dict[str, dict[str, Any]]:
        """record key -> decoded VirtualKey record of every live, readable key."""
        out = {}
        for key, value in self.view.values(self.config.topics.gateway_keys).items():
            try:
                out[key.decode()] = GATEWAY_KEY.decode(value)
            except Exception:  # an unreadable record serves no one: the gateways skip it too
                continue
        return out

    def raise_book(self) -> RaiseBook:
        book = RaiseBook()
        for raise_id, found in self.raises().items():
            book.apply(raise_id, found.to_record())
        return book

    async def verdicts(self) -> list[dict[str, Any]]:
        """The live verdicts of the generation the enforcers follow (what they check)."""
        topics = self.config.topics
        switch = self.view.get(topics.generations, CONTROL_KEY)
        generation = "" if switch is None else GenerationSwitch.decode(switch).generation
        topic = topics.of_generation(generation).budget_verdicts
        async with self._verdicts_lock:
            if self._verdicts is None or self._verdicts_topic != topic:
                if self._verdicts is not None:  # a cutover: follow the new generation
                    await self._verdicts.stop()
                    self._verdicts = None
                view = CompactedView(self.config.bootstrap, [topic], security=self.config.security)
                await view.start()
                self._verdicts, self._verdicts_topic = view, topic
            values = self._verdicts.values(topic)
        decoded = self._decoded_values(topic, values, _verdict_or_none)
        return [v for v in decoded.values() if v is not None]

    def audit(self) -> list[dict[str, Any]]:
        entries = []
        for value in self.view.values(self.config.topics.admin_audit).values():
            try:
                entries.append(decode_entry(value))
            except ContractError:  # not the API's: no change of its to show
                continue
        return sorted(entries, key=lambda e: (e["at"], e["audit_id"]))

    # --- writes --------------------------------------------------------------------------
    @asynccontextmanager
    async def writing(self) -> AsyncIterator[None]:
        async with self._lock:
            yield

    async def write(
        self,
        caller: Caller,
        *,
        topic: str,
        records: list[tuple[bytes, bytes | None]],
        action: str,
        resource: str,
        resource_id: str,
        org_id: str | None,
        before: Any,
        after: Any,
    ) -> None:
        """Publish ``records`` then their audit entry, each acknowledged (hold ``writing``)."""
        entry = new_audit_entry(
            token_id=caller.token_id,
            role=caller.role,
            remote=caller.remote,
            action=action,
            resource=resource,
            resource_id=resource_id,
            org_id=org_id,
            before=before,
            after=after,
        )
        audit: list[tuple[bytes, bytes | None]] = [encode_entry(entry)]
        await self._publish(topic, records)
        await self._publish(self.config.topics.admin_audit, audit)

    async def _publish(self, topic: str, records: list[tuple[bytes, bytes | None]]) -> None:
        assert self._producer is not None, "the store is started with the app"
        try:
            async with asyncio.timeout(ACK_TIMEOUT_S):
                placed = await publish_with(self._producer, topic, records)
        except TimeoutError:
            raise ApiError(
                503, f"the broker did not acknowledge within {ACK_TIMEOUT_S:g} s; retry"
            ) from None
        self.view.apply_written(topic, placed, records)

    # --- Idempotency-Key -----------------------------------------------------------------
    async def once(
        self,
        caller: Caller,
        idempotency_key: str | None,
        route: str,
        request: bytes,
        answer: Callable[[], Awaitable[tuple[int, dict[str, Any]]]],
    ) -> tuple[int, dict[str, Any]]:
        """``answer()``, or the answer a POST with the same Idempotency-Key (same caller,
        same route) got; the same key with another body is a 422."""
        if idempotency_key is None:
            return await answer()
        if not 1 <= len(idempotency_key) <= 200:
            raise ApiError(422, "header 'Idempotency-Key': 1-200 characters", "Idempotency-Key")
        slot = slot_key(caller.token_id, route, idempotency_key)
        async with self._once_lock:
            remembered = self._remembered(slot)
            if remembered is None:  # another server may have answered it moments ago
                await self._caught_up(self.config.topics.admin_idempotency)
                remembered = self._remembered(slot)
            if remembered is not None:
                if remembered.request_digest != request_digest(request):
                    raise ApiError(
                        422,
                        "header 'Idempotency-Key': already used for another request body",
                        "Idempotency-Key",
                    )
                return remembered.status, remembered.body
            status, body = await answer()
            if status < 300:
                await self._remember(slot, new_answer(request, status, body))
            return status, body

    async def _caught_up(self, topic: str) -> None:
        try:
            async with asyncio.timeout(ACK_TIMEOUT_S):
                await self.view.caught_up(topic)
        except TimeoutError:
            raise ApiError(
                503, f"the broker did not answer within {ACK_TIMEOUT_S:g} s; retry"
            ) from None

    def _remembered(self, slot: bytes) -> Answer | None:
        """The unexpired answer kept under ``slot`` (by any server), if any."""
        sealed = self.view.get(self.config.topics.admin_idempotency, slot)
        if sealed is None:
            return None
        remembered = unseal(self._answers_key, slot, sealed)
        if remembered is None:  # sealed under another key secret: this server cannot use it
            log.warning("an Idempotency-Key answer does not open with this key secret")
            return None
        return None if remembered.expired() else remembered

    async def _remember(self, slot: bytes, answer: Answer) -> None:
        """Publish the sealed answer (acks=all). The change it answers is made: should the
        broker not take the answer, the caller still gets it, and only a retry of it would
        act again (logged)."""
        records: list[tuple[bytes, bytes | None]] = [(slot, seal(self._answers_key, slot, answer))]
        try:
            await self._publish(self.config.topics.admin_idempotency, records)
        except (ApiError, KafkaError) as exc:
            log.warning("an Idempotency-Key answer was not kept (%s)", type(exc).__name__)
