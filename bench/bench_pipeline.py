"""Pipeline benchmark: the aggregator beside Kafka itself, measured in one run.

1. throughput: N pre-encoded UsageEvents are written to a fresh usage.raw; the raw
   aiokafka consume rate of that topic is measured, then an aggregator worker
   (one process, no ClickHouse sink) folds the same topic from the start:
   events/s per worker and its ratio to the raw rate;
2. latency at a fixed rate (default 2k events/s): published -> verdict seen by a
   consumer of budget.verdicts (an enforcer's view), beside the produce -> consume
   floor of a plain topic at the same rate; p50/p99 of each.

Prints one JSON object. Uses KAFKA_BOOTSTRAP, else starts a LocalKafka for the run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from schemas.budgets import budgets_from_yaml
from schemas.codec import BUDGET_POLICY, PRICE_TABLE, USAGE_EVENT, VERDICT
from schemas.pricing import default_price_file, load_price_file
from schemas.topics import Topics
from schemas.usage import new_usage_event
from spendbus.stack.compacted import publish
from spendbus.stack.kafka import LocalKafka, ensure_broker_jars, free_port
from spendbus.stack.topics import ensure_topics
from spendbus.stack.worker import WorkerProcess

BUDGETS = [
    {"id": "per-secret", "scope": "secret", "window": "month", "limit_usd": "1000000"},
    {"id": "per-org", "scope": "org", "window": "day", "limit_tokens": 10**15},
    {"id": "per-user", "scope": "user", "window": "rolling:1h", "limit_usd": "1000000"},
]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def events(n: int, orgs: int = 50) -> list[tuple[bytes, bytes]]:
    out = []
    for i in range(n):
        org = f"org-{i % orgs}"
        e = new_usage_event(
            provider="anthropic",
            api="anthropic-messages",
            model="claude-sonnet-4-5",
            secret_id=f"sk-{i % (orgs * 4)}",
            org_id=org,
            user_id=f"user-{i % 500}@{org}.com",
            gateway_id="bench",
            input_tokens=1000 + i % 5000,
            output_tokens=100 + i % 900,
        )
        out.append((org.encode(), USAGE_EVENT.encode(e)))
    return out


async def produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=5, max_batch_size=512 * 1024
    )
    await producer.start()
    try:
        futures = [await producer.send(topic, key=k, value=v) for k, v in records]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def raw_consume_rate(bootstrap: str, topic: str, n: int) -> float:
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"bench-{uuid.uuid4().hex[:6]}",
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        seen = 0
        started = time.perf_counter()
        while seen < n:
            for messages in (await consumer.getmany(timeout_ms=1000, max_records=10_000)).values():
                seen += len(messages)
        return n / (time.perf_counter() - started)
    finally:
        await consumer.stop()


def start_worker(bootstrap: str, topics: Topics, home: Path) -> WorkerProcess:
    port = free_port()
    worker = WorkerProcess(
        run_dir=home / "run",
        env={
            "KAFKA_BOOTSTRAP": bootstrap,
            "SPENDBUS_TOPIC_PREFIX": topics.prefix,
            "SPENDBUS_HOME": str(home),
            "SPENDBUS_PARTITIONS": "4",
            "SPENDBUS_WEB_PORT": str(port),
        },
        web_port=port,
        # no ClickHouse sink: the cost of pricing, counters and verdicts alone
        args=("--no-sink",),
    )
    return worker


async def apply_reference(bootstrap: str, topics: Topics) -> None:
    now = datetime.now(UTC)
    tables = load_price_file(default_price_file())
    await publish(
        bootstrap,
        topics.pricing,
        [(t.version.encode(), PRICE_TABLE.encode(t.to_record())) for t in tables],
    )
    await publish(
        bootstrap,
        topics.budget_policies,
        [
            (b.budget_id.encode(), BUDGET_POLICY.encode(b.to_record(now)))
            for b in budgets_from_yaml(BUDGETS)
        ],
    )


def throughput(bootstrap: str, n: int, home: Path) -> dict[str, Any]:
    topics = Topics(f"bench{uuid.uuid4().hex[:6]}.")
    asyncio.run(ensure_topics(bootstrap, topics, 4))
    asyncio.run(apply_reference(bootstrap, topics))
    asyncio.run(produce(bootstrap, topics.usage_raw, events(n)))
    raw = asyncio.run(raw_consume_rate(bootstrap, topics.usage_raw, n))
    worker = start_worker(bootstrap, topics, home)
    worker.start(timeout=180)
    try:
        first = None
        started = time.perf_counter()
        while True:
            stats = worker.get("/stats")
            if first is None and stats.get("events", 0) > 0:
                first = (time.perf_counter(), stats["events"])
            if stats.get("events", 0) >= n:
                break
            time.sleep(0.05)
        elapsed = time.perf_counter() - started
        steady = (n - first[1]) / (time.perf_counter() - first[0]) if first else n / elapsed
    finally:
        worker.stop()
    return {
        "events": n,
        "raw_consume_events_per_s": round(raw),
        "aggregator_events_per_s": round(steady),
        "ratio_to_raw": round(steady / raw, 4),
        "verdicts": stats.get("verdicts"),
    }


async def timed_consume(
    bootstrap: str, topic: str, stop: asyncio.Event, decode: Any
) -> list[float]:
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="latest", group_id=None
    )
    await consumer.start()
    latencies: list[float] = []
    try:
        while not stop.is_set():
            for messages in (await consumer.getmany(timeout_ms=100)).values():
                now = time.time()
                latencies.extend(now - decode(m.value) for m in messages)
    finally:
        await consumer.stop()
    return latencies


async def paced(bootstrap: str, topic: str, rate: int, seconds: float, make: Any) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
    await producer.start()
    try:
        interval = 1.0 / rate
        started = time.perf_counter()
        sent = 0
        while time.perf_counter() - started < seconds:
            due = started + sent * interval
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            key, value = make(sent)
            await producer.send(topic, key=key, value=value)
            sent += 1
        await producer.flush()
    finally:
        await producer.stop()


def latency(bootstrap: str, rate: int, seconds: float, home: Path) -> dict[str, Any]:
    topics = Topics(f"benchlat{uuid.uuid4().hex[:6]}.")
    asyncio.run(ensure_topics(bootstrap, topics, 4))
    asyncio.run(apply_reference(bootstrap, topics))
    worker = start_worker(bootstrap, topics, home)
    worker.start(timeout=180)

    def usage(i: int) -> tuple[bytes, bytes]:
        org = f"org-{i % 50}"
        e = new_usage_event(
            provider="openai",
            api="openai-chat",
            model="gpt-4o",
            secret_id=f"sk-{i % 200}",
            org_id=org,
            gateway_id="bench",
            input_tokens=500,
            output_tokens=50,
            occurred_at=datetime.now(UTC),
        )
        return org.encode(), USAGE_EVENT.encode(e)

    def floor_record(i: int) -> tuple[bytes, bytes]:
        return f"org-{i % 50}".encode(), repr(time.time()).encode()

    async def measure(topic_out: str, topic_in: str, make: Any, decode: Any) -> list[float]:
        stop = asyncio.Event()
        reader = asyncio.create_task(timed_consume(bootstrap, topic_out, stop, decode))
        await asyncio.sleep(1.0)  # the reader is positioned at the end before anything is sent
        await paced(bootstrap, topic_in, rate, seconds, make)
        await asyncio.sleep(1.5)  # the last verdicts (coalesced per batch)
        stop.set()
        return await reader

    try:
        verdict_lat = asyncio.run(
            measure(
                topics.budget_verdicts,
                topics.usage_raw,
                usage,
                lambda v: VERDICT.decode(v)["as_of"].timestamp(),
            )
        )
    finally:
        worker.stop()
    floor_lat = asyncio.run(
        measure(topics.usage_dlq, topics.usage_dlq, floor_record, lambda v: float(v))
    )
    ms = lambda xs, q: round(pct(xs, q) * 1000, 2)  # noqa: E731
    return {
        "rate_events_per_s": rate,
        "seconds": seconds,
        "verdicts_seen": len(verdict_lat),
        "verdict_latency_ms": {"p50": ms(verdict_lat, 0.5), "p99": ms(verdict_lat, 0.99)},
        "kafka_floor_ms": {"p50": ms(floor_lat, 0.5), "p99": ms(floor_lat, 0.99)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--rate", type=int, default=2_000)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        broker = None
        bootstrap = os.environ.get("KAFKA_BOOTSTRAP")
        if not bootstrap:
            ensure_broker_jars()
            broker = LocalKafka(data_dir=home / "kafka").start()
            bootstrap = broker.bootstrap
        try:
            result = {
                "bench": "pipeline",
                "workers": 1,
                "throughput": throughput(bootstrap, args.events, home / "t"),
                "latency": latency(bootstrap, args.rate, args.seconds, home / "l"),
                "cpus": os.cpu_count(),
                "load_avg_1m": round(os.getloadavg()[0], 2),
            }
        finally:
            if broker is not None:
                broker.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
