"""What happened, as it happened: every served call's cost as its usage event is published
(the ground truth), each hold's estimate beside it, when the enforcers heard the verdicts,
and the aggregator's final verdict and the provider's own counts to check it against."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from enforcer import Enforcer
from ingest.publisher import UsagePublisher
from runtime.kafka import PLAINTEXT, KafkaSecurity
from schemas.codec import VERDICT
from schemas.ids import decompose
from schemas.pricing import PriceBook
from schemas.records import UsageEvent, Verdict
from schemas.topics import Topics
from schemas.usage import TOKEN_FIELDS


@dataclass
class Ledger:
    """Every served call's cost as its usage event is published (the ground truth)."""

    prices: PriceBook
    started: float = field(default_factory=time.monotonic)
    nanos: int = 0
    tokens: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TOKEN_FIELDS, 0))
    #: per served call: (seconds since start it was admitted, ... it ended, cost nanos)
    calls: list[tuple[float, float, int]] = field(default_factory=list)
    #: cumulative spend after each call, and when (for "when was the cap crossed")
    cumulative: list[tuple[float, int]] = field(default_factory=list)
    refusal_events: int = 0
    estimated: int = 0

    def record(self, event: Mapping[str, Any]) -> None:
        if event["outcome"] not in ("allowed", "failed_open"):
            self.refusal_events += 1
            return
        now = time.monotonic() - self.started
        cost = self.prices.price_event(event).cost_nanos
        self.nanos += cost
        for name in TOKEN_FIELDS:
            self.tokens[name] += event[name]
        if event["usage_source"] != "reported":
            self.estimated += 1
        latency = (event.get("latency_ms") or 0) / 1000
        self.calls.append((max(0.0, now - latency), now, cost))
        self.cumulative.append((now, self.nanos))


class RecordingSink:
    """The replica's publisher, plus the ledger entry of each event (``UsageSink``)."""

    def __init__(self, publisher: UsagePublisher, ledger: Ledger) -> None:
        self.publisher = publisher
        self.ledger = ledger

    async def publish(self, event: UsageEvent) -> None:
        self.ledger.record(event)
        await self.publisher.publish(event)


class EstimateProbe:
    """The enforcer as the gateway's gate, noting each hold's estimate beside the actual cost."""

    def __init__(self, enforcer: Enforcer, prices: PriceBook) -> None:
        self.enforcer = enforcer
        self.prices = prices
        self.pairs: list[tuple[int, int]] = []
        self.decisions: dict[str, int] = {}

    def context(self, **fields: Any) -> Any:
        return self.enforcer.context(**fields)

    def check(self, ctx: Any, *, reserve: bool = True) -> Any:
        decision = self.enforcer.check(ctx, reserve=reserve)
        self.decisions[decision.decision] = self.decisions.get(decision.decision, 0) + 1
        return decision

    def settle(self, hold_id: int | None, event: Mapping[str, Any]) -> bool:
        hold = self.enforcer.holds.get(hold_id) if hold_id is not None else None
        if hold is not None and hold.occurred_us is None:
            self.pairs.append((hold.nanos, self.prices.price_event(event).cost_nanos))
        return self.enforcer.settle(hold_id, event)

    def release(self, hold_id: int | None) -> bool:
        return self.enforcer.release(hold_id)

    def usage(self, ctx: Any) -> list[Any]:
        return list(self.enforcer.usage(ctx))

    @property
    def ready(self) -> bool:
        return self.enforcer.ready

    @property
    def stale(self) -> bool:
        return self.enforcer.stale


def listen(
    enforcer: Enforcer,
    key: str,
    ledger: Ledger,
    seen: list[tuple[float, int]] | None,
    lag_ms: list[float],
) -> None:
    """Note when this enforcer receives the budget's verdicts, and how old their news is."""
    cid = tuple(decompose(key))

    def on_verdict(counter: tuple[str, ...], period: str, as_of_us: int, seq: int) -> None:
        if counter != cid:
            return
        lag_ms.append((time.time() - as_of_us / 1e6) * 1000)
        if seen is not None:
            spent = enforcer.state.verdicts[counter].spent_nanos
            seen.append((time.monotonic() - ledger.started, spent))

    enforcer.state.on_verdict(on_verdict)


async def final_verdict(
    bootstrap: str,
    topics: Topics,
    key: str,
    expect: int,
    timeout: float,
    *,
    security: KafkaSecurity = PLAINTEXT,
) -> Verdict | None:
    """The counter's newest verdict once it reaches ``expect`` (the worker caught up), else
    the newest seen within ``timeout``."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, **security.client_kwargs()
    )
    await consumer.start()
    newest: Verdict | None = None
    try:
        # the consumer's own cluster view only knows assigned topics: ask for all
        cluster = await consumer._client.fetch_all_metadata()
        partitions = [
            TopicPartition(topics.budget_verdicts, p)
            for p in sorted(cluster.partitions_for_topic(topics.budget_verdicts) or ())
        ]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        deadline = time.monotonic() + timeout
        wanted = key.encode()
        while time.monotonic() < deadline:
            for messages in (await consumer.getmany(timeout_ms=200)).values():
                for message in messages:
                    if message.key != wanted or message.value is None:
                        continue
                    verdict = VERDICT.decode(message.value)
                    if newest is None or verdict["seq"] > newest["seq"]:
                        newest = verdict
            if newest is not None and newest["spent_nanos"] >= expect:
                break
    finally:
        await consumer.stop()
    return newest


def upstream_stats(url: str, method: str) -> dict[str, Any]:
    request = urllib.request.Request(f"{url}/stats", method=method)
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read()
    return json.loads(text) if text.strip() else {}
