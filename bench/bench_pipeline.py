"""Pipeline benchmark: the aggregator beside Kafka itself, measured in one run.

For each worker count (default 1 and 2; issue 8), on a fresh 4-partition usage.raw:

1. throughput: the raw aiokafka consume rate of the topic is measured first; then
   the aggregator workers (one process each, one consumer group, no ClickHouse
   sink) are started and serving, N pre-encoded UsageEvents are written in whole
   record batches, and the workers fold them: events/s per worker at steady state
   (between 10 % and 90 % of the events), its ratio to the raw rate, verdicts sent,
   and where the workers' time went (``phase_seconds`` of /stats);
2. latency at a fixed rate (default 2k events/s), after 3 s of the same load untimed:
   published -> verdict seen by a consumer of budget.verdicts (an enforcer's view),
   beside the produce -> consume floor of a plain topic at the same rate; p50/p99 of
   each. ``--only latency`` measures just this (faster A/B runs).

Prints one JSON object. Uses KAFKA_BOOTSTRAP, else starts a LocalKafka for the run, or with
``--brokers N`` a local cluster of N KRaft nodes (spendbus/stack/cluster.py; topics with
min(3, N) replicas, min.insync.replicas 2 from three): the cluster mode, where the JSON also
gives ``scaling``, the last worker count's events per worker CPU-second over the first's.

``SPENDBUS_BENCH_ROOT=<checkout>``: the workers run that checkout's code (its own compiled
extensions), the harness and the raw consumers this one's (bench/compare.py alternates the
two trees); the JSON names it as ``code_root``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `bench.benchkit`, also when run as a script

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer  # noqa: E402
from aiokafka.partitioner import DefaultPartitioner  # noqa: E402

from bench.benchkit import apply_reference, events, pct, worker  # noqa: E402
from runtime.kafka import PLAINTEXT, KafkaSecurity  # noqa: E402
from schemas.codec import USAGE_EVENT, VERDICT  # noqa: E402
from schemas.topics import Topics  # noqa: E402
from schemas.usage import new_usage_event  # noqa: E402
from spendbus.settings import load_settings  # noqa: E402
from spendbus.stack.broker_jars import ensure_broker_jars  # noqa: E402
from spendbus.stack.cluster import LocalCluster  # noqa: E402
from spendbus.stack.kafka import LocalKafka  # noqa: E402
from spendbus.stack.topics import ensure_topics  # noqa: E402
from spendbus.stack.worker import WorkerProcess  # noqa: E402


async def produce(
    bootstrap: str,
    topic: str,
    records: list[tuple[bytes, bytes]],
    *,
    security: KafkaSecurity = PLAINTEXT,
) -> None:
    """Write ``records`` in whole record batches, each to the partition its key picks."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        linger_ms=5,
        max_batch_size=512 * 1024,
        **security.client_kwargs(),
    )
    await producer.start()
    try:
        partitions = sorted(await producer.partitions_for(topic))
        choose = DefaultPartitioner()
        by_partition: dict[int, list[tuple[bytes, bytes]]] = {}
        for key, value in records:
            by_partition.setdefault(choose(key, partitions, partitions), []).append((key, value))
        futures = []
        for partition, items in by_partition.items():
            batch = producer.create_batch()
            for key, value in items:
                if batch.append(key=key, value=value, timestamp=None) is None:
                    futures.append(await producer.send_batch(batch, topic, partition=partition))
                    batch = producer.create_batch()
                    batch.append(key=key, value=value, timestamp=None)
            futures.append(await producer.send_batch(batch, topic, partition=partition))
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def raw_consume_rate(
    bootstrap: str, topic: str, n: int, *, security: KafkaSecurity = PLAINTEXT
) -> tuple[float, float]:
    """Events/s of a bare aiokafka consumer, and events per second of its CPU time."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"bench-{uuid.uuid4().hex[:6]}",
        auto_offset_reset="earliest",
        **security.client_kwargs(),
    )
    await consumer.start()
    try:
        seen = 0
        started, cpu = time.perf_counter(), time.process_time()
        while seen < n:
            for messages in (await consumer.getmany(timeout_ms=1000, max_records=10_000)).values():
                seen += len(messages)
        return n / (time.perf_counter() - started), n / (time.process_time() - cpu)
    finally:
        await consumer.stop()


async def raw_relay_rate(
    bootstrap: str,
    topic: str,
    out_topics: list[str],
    n: int,
    *,
    security: KafkaSecurity = PLAINTEXT,
) -> float:
    """Events/s of a bare aiokafka consume that writes each record on, unchanged, once to
    each of ``out_topics`` (same partition), in record batches as the counting stage
    writes: the part of the aggregator's work that is Kafka's clients alone. The stage
    writes at least two records per event (usage.priced and the dedupe changelog), so
    this rate over the raw consume rate bounds ``ratio_to_raw`` from above."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"bench-{uuid.uuid4().hex[:6]}",
        auto_offset_reset="earliest",
        **security.client_kwargs(),
    )
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        linger_ms=5,
        max_batch_size=512 * 1024,
        **security.client_kwargs(),
    )
    await asyncio.gather(consumer.start(), producer.start())
    try:
        seen = 0
        futures = []
        started = time.perf_counter()
        while seen < n:
            for tp, messages in (
                await consumer.getmany(timeout_ms=1000, max_records=10_000)
            ).items():
                seen += len(messages)
                for out in out_topics:
                    batch = producer.create_batch()
                    for m in messages:
                        if batch.append(key=m.key, value=m.value, timestamp=None) is None:
                            futures.append(
                                await producer.send_batch(batch, out, partition=tp.partition)
                            )
                            batch = producer.create_batch()
                            batch.append(key=m.key, value=m.value, timestamp=None)
                    futures.append(await producer.send_batch(batch, out, partition=tp.partition))
        await asyncio.gather(*futures)
        return n / (time.perf_counter() - started)
    finally:
        await asyncio.gather(consumer.stop(), producer.stop())


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU time of a process so far (/proc/<pid>/stat)."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def watch(running: list[WorkerProcess], n: int, samples: list[tuple[float, int, float]]) -> None:
    """Append (wall clock, events folded, CPU seconds) of the workers until ``n`` are folded."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        done = sum(w.get("/stats").get("events", 0) for w in running)
        samples.append((time.perf_counter(), done, sum(cpu_seconds(w.pid()) for w in running)))
        if done >= n:
            return
        time.sleep(0.05)
    raise TimeoutError(f"the workers folded {samples[-1][1] if samples else 0} of {n} events")


def start_workers(
    bootstrap: str,
    topics: Topics,
    home: Path,
    count: int,
    *,
    security: KafkaSecurity = PLAINTEXT,
    clickhouse_dsn: str | None = None,
) -> list[WorkerProcess]:
    """``count`` workers of one group, started together, each serving with its share (the
    first sinking into ``clickhouse_dsn`` when given: an embedded store takes one)."""
    workers = [
        worker(
            bootstrap,
            topics,
            home / f"w{i}",
            clickhouse_dsn=clickhouse_dsn if i == 0 else None,
            code_root=os.environ.get("SPENDBUS_BENCH_ROOT") or None,
        )
        for i in range(count)
    ]
    with ThreadPoolExecutor(count) as pool:
        list(pool.map(lambda w: w.start(timeout=180), workers))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the group has settled: every partition owned once
        stats = [w.get("/stats") for w in workers]
        if all(s["serving"] for s in stats) and sum(s["assigned_partitions"] for s in stats) == 4:
            break
        time.sleep(0.2)
    return workers


def stop_workers(workers: list[WorkerProcess]) -> None:
    with ThreadPoolExecutor(len(workers)) as pool:
        list(pool.map(lambda w: w.stop(), workers))


def throughput(
    bootstrap: str, n: int, home: Path, workers: int, *, security: KafkaSecurity = PLAINTEXT
) -> dict[str, Any]:
    topics = Topics(f"bench{uuid.uuid4().hex[:6]}.")
    asyncio.run(ensure_topics(bootstrap, topics, 4, security=security))
    asyncio.run(apply_reference(bootstrap, topics, security=security))
    records = events(n)
    # the raw rate is measured on a twin topic holding the same records, in the same run
    twin = Topics(f"benchraw{uuid.uuid4().hex[:6]}.")
    asyncio.run(ensure_topics(bootstrap, twin, 4, security=security))
    asyncio.run(produce(bootstrap, twin.usage_raw, records, security=security))
    raw, raw_per_cpu = asyncio.run(
        raw_consume_rate(bootstrap, twin.usage_raw, n, security=security)
    )
    relay = asyncio.run(
        raw_relay_rate(
            bootstrap,
            twin.usage_raw,
            [twin.usage_priced, twin.budget_verdicts],
            n,
            security=security,
        )
    )
    running = start_workers(bootstrap, topics, home, workers, security=security)
    try:
        # (wall clock, events done, CPU seconds of all workers), sampled from before the
        # records are written: a worker that keeps pace with the producer is measured too
        samples: list[tuple[float, int, float]] = []
        with ThreadPoolExecutor(1) as pool:
            watching = pool.submit(watch, running, n, samples)
            asyncio.run(produce(bootstrap, topics.usage_raw, records, security=security))
            watching.result()
        marks = {
            mark: next(sample for sample in samples if sample[1] >= mark * n) for mark in (0.1, 0.9)
        }
        (t10, n10, cpu10), (t90, n90, cpu90) = marks[0.1], marks[0.9]
        if t90 <= t10:
            raise SystemExit(f"{n} events were folded between two samples: raise --events")
        steady = (n90 - n10) / (t90 - t10)
        per_cpu = (n90 - n10) / max(cpu90 - cpu10, 1e-9)
        stats = [w.get("/stats") for w in running]
    finally:
        stop_workers(running)
    per_worker = steady / workers
    return {
        "events": n,
        "raw_consume_events_per_s": round(raw),
        "aggregator_events_per_s": round(steady),
        "aggregator_events_per_s_per_worker": round(per_worker),
        "ratio_to_raw": round(per_worker / raw, 4),
        # consume + write each record on twice, nothing else: the Kafka clients' share
        "raw_relay_two_writes_events_per_s": round(relay),
        "relay_ratio_to_raw": round(relay / raw, 4),
        # on a machine shared with other work, wall-clock rates measure the share each
        # process got; events per CPU-second is what one dedicated core would do
        "raw_consume_events_per_cpu_s": round(raw_per_cpu),
        "aggregator_events_per_cpu_s": round(per_cpu),
        "ratio_to_raw_per_cpu_s": round(per_cpu / raw_per_cpu, 4),
        "verdicts": sum(s.get("verdicts", 0) for s in stats),
        "events_per_worker": [s.get("events", 0) for s in stats],
        "phase_seconds": [s.get("phase_seconds") for s in stats],
    }


async def timed_consume(
    bootstrap: str,
    topic: str,
    stop: asyncio.Event,
    decode: Any,
    *,
    security: KafkaSecurity = PLAINTEXT,
) -> list[float]:
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="latest",
        group_id=None,
        **security.client_kwargs(),
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


async def paced(
    bootstrap: str,
    topic: str,
    rate: int,
    seconds: float,
    make: Any,
    *,
    security: KafkaSecurity = PLAINTEXT,
) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=0, **security.client_kwargs()
    )
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


WARMUP_SECONDS = 3.0


def latency(
    bootstrap: str,
    rate: int,
    seconds: float,
    home: Path,
    workers: int,
    *,
    security: KafkaSecurity = PLAINTEXT,
    clickhouse_dsn: str | None = None,
) -> dict[str, Any]:
    """Verdict latency at ``rate``; with ``clickhouse_dsn`` the first worker also sinks
    every event into ClickHouse meanwhile (its share of the same process and cores)."""
    topics = Topics(f"benchlat{uuid.uuid4().hex[:6]}.")
    asyncio.run(ensure_topics(bootstrap, topics, 4, security=security))
    asyncio.run(apply_reference(bootstrap, topics, security=security))
    running = start_workers(
        bootstrap, topics, home, workers, security=security, clickhouse_dsn=clickhouse_dsn
    )

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
        reader = asyncio.create_task(
            timed_consume(bootstrap, topic_out, stop, decode, security=security)
        )
        await asyncio.sleep(1.0)  # the reader is positioned at the end before anything is sent
        await paced(bootstrap, topic_in, rate, seconds, make, security=security)
        await asyncio.sleep(1.5)  # the last verdicts (a held one is due within 100 ms)
        stop.set()
        return await reader

    try:
        # steady state: the same load, untimed, first (the broker's JIT, the workers' caches
        # and every counter's first verdict are behind it; with --only latency the broker
        # has just started)
        asyncio.run(
            paced(bootstrap, topics.usage_raw, rate, WARMUP_SECONDS, usage, security=security)
        )
        verdict_lat = asyncio.run(
            measure(
                topics.budget_verdicts,
                topics.usage_raw,
                usage,
                lambda v: VERDICT.decode(v)["as_of"].timestamp(),
            )
        )
        # queueing before the fold, as the workers saw it (oldest record of each batch)
        worker_stats = [w.get("/stats") for w in running]
        sink_rows = worker_stats[0].get("sink_rows", 0)
    finally:
        stop_workers(running)
    floor_lat = asyncio.run(
        measure(topics.usage_dlq, topics.usage_dlq, floor_record, lambda v: float(v))
    )

    def ms(xs: list[float], q: float) -> float:
        return round(pct(xs, q) * 1000, 2)

    return {
        "rate_events_per_s": rate,
        "seconds": seconds,
        "verdicts_seen": len(verdict_lat),
        "verdict_latency_ms": {"p50": ms(verdict_lat, 0.5), "p99": ms(verdict_lat, 0.99)},
        "kafka_floor_ms": {"p50": ms(floor_lat, 0.5), "p99": ms(floor_lat, 0.99)},
        # where a verdict's time goes inside the workers (p50/p99/max of recent samples)
        "worker_record_age_ms": [s.get("record_age_ms") for s in worker_stats],
        "worker_checkpoint_ms": [s.get("checkpoint_ms") for s in worker_stats],
        "worker_checkpoint_stall_ms": [s.get("checkpoint_stall_ms") for s in worker_stats],
        "worker_verdict_send_ms": [s.get("verdict_send_ms") for s in worker_stats],
        "worker_loop_lag_ms": [s.get("loop_lag_ms") for s in worker_stats],
        "sink": clickhouse_dsn is not None,
        "sink_rows": sink_rows,
    }


def _scaling(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The counting rate from the first worker count to the last, per worker CPU-second
    (the cores are shared: wall-clock rates measure the share each process got)."""
    measured = [r for r in runs if "throughput" in r]
    if len(measured) < 2:
        return {}
    first, last = measured[0], measured[-1]
    per_worker_cpu = [r["throughput"]["aggregator_events_per_cpu_s"] for r in (first, last)]
    wall = [r["throughput"]["aggregator_events_per_s"] for r in (first, last)]
    return {
        "scaling": {
            "workers": [first["workers"], last["workers"]],
            # events per CPU-second of each worker, times the workers: what they would do
            # on a core each
            "events_per_worker_cpu_s": per_worker_cpu,
            "per_cpu_scaling": round(
                last["workers"] * per_worker_cpu[1] / (first["workers"] * per_worker_cpu[0]), 3
            ),
            "wall_clock_events_per_s": wall,
            "wall_clock_scaling": round(wall[1] / wall[0], 3),
        }
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--rate", type=int, default=2_000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument(
        "--workers", default="1,2", help="worker counts to measure, comma-separated (issue 8)"
    )
    parser.add_argument(
        "--only",
        choices=("throughput", "latency"),
        help="measure only this part (the other is left out of the JSON)",
    )
    parser.add_argument(
        "--brokers",
        type=int,
        default=1,
        help="brokers of the bench's own Kafka (> 1: a local KRaft cluster, issue 18)",
    )
    args = parser.parse_args()
    counts = [int(c) for c in args.workers.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        broker: LocalKafka | LocalCluster | None = None
        bootstrap = os.environ.get("KAFKA_BOOTSTRAP")
        # a cluster of your own: its KAFKA_* security settings; the bench's broker: plaintext
        security = load_settings().kafka_security if bootstrap else PLAINTEXT
        if not bootstrap:
            ensure_broker_jars()
            if args.brokers > 1:
                broker = LocalCluster(home / "kafka-cluster", brokers=args.brokers).start()
            else:
                broker = LocalKafka(data_dir=home / "kafka").start()
            bootstrap = broker.bootstrap
        try:
            runs = []
            for count in counts:
                run: dict[str, Any] = {"workers": count}
                if args.only != "latency":
                    run["throughput"] = throughput(
                        bootstrap, args.events, home / f"t{count}", count, security=security
                    )
                if args.only != "throughput":
                    run["latency"] = latency(
                        bootstrap,
                        args.rate,
                        args.seconds,
                        home / f"l{count}",
                        count,
                        security=security,
                    )
                run["load_avg_1m"] = round(os.getloadavg()[0], 2)
                runs.append(run)
            result: dict[str, Any] = {
                "bench": "pipeline",
                # the first run (1 worker by default) also at the top, where `make bench` reads it
                **{part: runs[0][part] for part in ("throughput", "latency") if part in runs[0]},
                "runs": runs,
                "brokers": args.brokers if not os.environ.get("KAFKA_BOOTSTRAP") else None,
                # the checkout whose workers were measured (None: this one)
                "code_root": os.environ.get("SPENDBUS_BENCH_ROOT") or None,
                **_scaling(runs),
                "cpus": os.cpu_count(),
                "load_avg_1m": round(os.getloadavg()[0], 2),
            }
        finally:
            if broker is not None:
                broker.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
