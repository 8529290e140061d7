"""Publisher throughput from one process: UsageEvents per second until the broker acknowledged.

Publishes ``--events`` events (default 200k) to a local broker (KAFKA_BOOTSTRAP, or a
LocalKafka started for the run) and prints one JSON object with the median of
``--runs`` runs of each path:

- ``publish_many``:     dicts in batches of 1000: validate + encode + spool + send
- ``publish``:          one ``await publish(event)`` per event
- ``publish_prepared``: events validated and encoded beforehand: the spool + send path alone
- ``direct_no_spool``:  the same producer settings and batching straight to Kafka, no spool
                        (what the write-ahead spool costs is the gap to ``publish_prepared``)

``events_per_cpu_s`` divides by the CPU time of the publishing process instead of the wall
clock: on a shared machine (the broker runs beside it) it tells what one core does.

Each run uses fresh topics and a fresh spool; the clock runs from the first publish to
the broker's acknowledgement of the last event (``flush()``).

    .venv/bin/python bench/bench_publisher.py [--events N] [--runs R]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import murmur2
from fastavro import schemaless_writer

from ingest.publisher import PreparedEvent, PublisherConfig, UsagePublisher, prepare
from runtime.kafka import PLAINTEXT, KafkaSecurity
from schemas.codec import USAGE_EVENT
from schemas.records import UsageEvent
from schemas.topics import Topics
from schemas.usage import new_usage_event, validate_usage_event
from spendbus.settings import load_settings
from spendbus.stack.topics import ensure_topics

BATCH = 1000
Event = UsageEvent


def make_events(n: int) -> list[Event]:
    return [
        new_usage_event(
            provider="anthropic",
            api="anthropic-messages",
            model="claude-sonnet-4",
            secret_id=f"sec-{i % 500}",
            org_id=f"org-{i % 100}",
            gateway_id="gw-bench",
            input_tokens=1000 + i % 977,
            output_tokens=200 + i % 101,
            cache_read_tokens=i % 3 * 100,
            user_id=f"user-{i % 2000}@example.com",
            project_id=f"proj-{i % 50}",
            stream=True,
            latency_ms=800,
            request_id=f"req_{i:012d}",
        )
        for i in range(n)
    ]


async def _fresh_topics(bootstrap: str, *, security: KafkaSecurity = PLAINTEXT) -> Topics:
    topics = Topics(prefix=f"bench{uuid.uuid4().hex[:8]}.")
    await ensure_topics(bootstrap, topics, partitions=4, security=security)
    return topics


Timing = tuple[float, float]  # (wall seconds, CPU seconds of this process)


def _clock() -> Timing:
    return time.perf_counter(), time.process_time()


def _since(start: Timing) -> Timing:
    return time.perf_counter() - start[0], time.process_time() - start[1]


async def _with_publisher(
    bootstrap: str,
    body: Callable[[UsagePublisher], Awaitable[None]],
    *,
    security: KafkaSecurity = PLAINTEXT,
) -> Timing:
    topics = await _fresh_topics(bootstrap, security=security)
    with tempfile.TemporaryDirectory() as spool:
        config = PublisherConfig(
            bootstrap=bootstrap,
            kafka_security=security,
            topic_prefix=topics.prefix,
            spool_dir=Path(spool),
        )
        async with UsagePublisher(config) as publisher:
            await publisher.publish(make_events(1)[0])  # connect, learn partitions, get a PID
            await publisher.flush(60)
            started = _clock()
            await body(publisher)
            await publisher.flush(300)
            return _since(started)


async def run_publish_many(
    bootstrap: str, events: list[Event], *, security: KafkaSecurity = PLAINTEXT
) -> Timing:
    async def body(publisher: UsagePublisher) -> None:
        for i in range(0, len(events), BATCH):
            await publisher.publish_many(events[i : i + BATCH])

    return await _with_publisher(bootstrap, body, security=security)


async def run_publish(
    bootstrap: str, events: list[Event], *, security: KafkaSecurity = PLAINTEXT
) -> Timing:
    async def body(publisher: UsagePublisher) -> None:
        for event in events:
            await publisher.publish(event)

    return await _with_publisher(bootstrap, body, security=security)


async def run_prepared(
    bootstrap: str, prepared: list[PreparedEvent], *, security: KafkaSecurity = PLAINTEXT
) -> Timing:
    async def body(publisher: UsagePublisher) -> None:
        for i in range(0, len(prepared), BATCH):
            await publisher.publish_prepared(prepared[i : i + BATCH])

    return await _with_publisher(bootstrap, body, security=security)


async def run_direct(
    bootstrap: str, prepared: list[PreparedEvent], *, security: KafkaSecurity = PLAINTEXT
) -> Timing:
    """The sender's batching without the spool: what Kafka alone costs from Python."""
    topics = await _fresh_topics(bootstrap, security=security)
    defaults = PublisherConfig(bootstrap=bootstrap, spool_dir=Path("."))
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        compression_type=defaults.compression,
        max_batch_size=defaults.max_batch_bytes,
        linger_ms=0,
        **security.client_kwargs(),
    )
    await producer.start()
    try:
        partitions = sorted(await producer.partitions_for(topics.usage_raw))
        started = _clock()
        futures = []
        partition_of: dict[bytes, int] = {}
        for i in range(0, len(prepared), BATCH):
            builders: dict[int, Any] = {}
            for event in prepared[i : i + BATCH]:
                p = partition_of.get(event.key)
                if p is None:
                    p = partition_of[event.key] = partitions[
                        (murmur2(event.key) & 0x7FFFFFFF) % len(partitions)
                    ]
                builder = builders.get(p)
                if builder is None:
                    builder = builders[p] = producer.create_batch()
                if builder.append(timestamp=None, key=event.key, value=event.value) is None:
                    futures.append(
                        await producer.send_batch(builder, topics.usage_raw, partition=p)
                    )
                    builder = builders[p] = producer.create_batch()
                    builder.append(timestamp=None, key=event.key, value=event.value)
            for p, builder in builders.items():
                futures.append(await producer.send_batch(builder, topics.usage_raw, partition=p))
        await asyncio.gather(*futures)
        return _since(started)
    finally:
        await producer.stop()


def _fastavro_encode(event: Event) -> bytes:
    """What ``USAGE_EVENT.encode`` was before its generated writer: fastavro's generic one."""
    buf = io.BytesIO()
    buf.write(USAGE_EVENT.header)
    schemaless_writer(buf, USAGE_EVENT.parsed, event)
    return buf.getvalue()


def _micro(events: list[Event], repeats: int = 9) -> dict[str, Any]:
    """CPU microseconds per event of the steps of ``prepare``, interleaved repeats, medians."""
    sample = events[:5_000]
    steps: dict[str, Callable[[Event], object]] = {
        "prepare": prepare,
        "validate": validate_usage_event,
        "encode": USAGE_EVENT.encode,
        "encode_fastavro": _fastavro_encode,
    }
    samples: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            started = time.process_time()
            for event in sample:
                step(event)
            samples[name].append((time.process_time() - started) / len(sample) * 1e6)
    us = {name: round(statistics.median(values), 2) for name, values in samples.items()}
    return {
        "prepare_us_per_event": us["prepare"],
        "steps_us_per_event": us,
        "encode_speedup_vs_fastavro": round(us["encode_fastavro"] / us["encode"], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    broker = None
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP")
    # a cluster of your own: its KAFKA_* security settings; the bench's broker: plaintext
    security = load_settings().kafka_security if bootstrap else PLAINTEXT
    if not bootstrap:
        from spendbus.stack.broker_jars import ensure_broker_jars
        from spendbus.stack.kafka import LocalKafka

        ensure_broker_jars()
        broker = LocalKafka(data_dir=Path(tempfile.mkdtemp(prefix="bench-kafka-")), port=0)
        broker.start()
        bootstrap = broker.bootstrap
    try:
        events = make_events(args.events)
        prepared = [prepare(e) for e in events]
        paths: dict[str, Callable[[], Coroutine[Any, Any, Timing]]] = {
            "publish_many": lambda: run_publish_many(bootstrap, events, security=security),
            "publish": lambda: run_publish(bootstrap, events, security=security),
            "publish_prepared": lambda: run_prepared(bootstrap, prepared, security=security),
            "direct_no_spool": lambda: run_direct(bootstrap, prepared, security=security),
        }
        runs: dict[str, list[float]] = {name: [] for name in paths}
        cpu_runs: dict[str, list[float]] = {name: [] for name in paths}
        for _ in range(args.runs):  # interleaved, so a noisy moment does not hit one path only
            for name, path in paths.items():
                wall, cpu = asyncio.run(path())
                runs[name].append(args.events / wall)
                cpu_runs[name].append(args.events / cpu)
        medians = {name: round(statistics.median(r)) for name, r in runs.items()}
        defaults = PublisherConfig(bootstrap=bootstrap, spool_dir=Path("."))
        result = {
            "bench": "publisher",
            "events": args.events,
            "runs": args.runs,
            "events_per_s": medians,
            "runs_events_per_s": {name: [round(x) for x in r] for name, r in runs.items()},
            # events per CPU second of the publishing process: what the number would be
            # with a core to itself (the broker and other processes share this machine)
            "events_per_cpu_s": {name: round(statistics.median(r)) for name, r in cpu_runs.items()},
            "spool_cost_pct": round(
                100 * (1 - medians["publish_prepared"] / medians["direct_no_spool"]), 1
            ),
            **_micro(events),
            "event_bytes": round(statistics.mean(len(p.value) for p in prepared[:1000])),
            "compression": defaults.compression,
            "fsync": defaults.fsync,
            "target_events_per_s": 50_000,
            "cpus": os.cpu_count(),
            "load_avg_1m": round(os.getloadavg()[0], 2),
        }
        print(json.dumps(result))
    finally:
        if broker is not None:
            broker.stop()


if __name__ == "__main__":
    main()
