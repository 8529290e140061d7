"""The processes and Kafka topics bench_gateway runs on: spawning and pinning the proxies,
their CPU time from /proc, waiting for them to answer, the topics with real prices and
budgets, and counting the usage events the gateway published."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from runtime.kafka import PLAINTEXT, KafkaSecurity

ROOT = Path(__file__).resolve().parents[1]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def wait_http(url: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(url) as resp:
                    if resp.status < 500:
                        return
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not answer")
            await asyncio.sleep(0.2)


def spawn(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


async def count_events(bootstrap: str, topic: str, *, security: KafkaSecurity = PLAINTEXT) -> int:
    from aiokafka import AIOKafkaConsumer

    from runtime.kafka import topic_partitions

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, **security.client_kwargs()
    )
    await consumer.start()
    try:
        partitions = await topic_partitions(bootstrap, topic, security=security)
        ends = await consumer.end_offsets(partitions)
        return sum(ends.values())
    finally:
        await consumer.stop()


async def setup_topics(bootstrap: str, *, security: KafkaSecurity = PLAINTEXT) -> Any:
    import uuid
    from datetime import UTC, datetime

    from schemas.budgets import budgets_from_yaml
    from schemas.codec import BUDGET_POLICY, PRICE_TABLE
    from schemas.pricing import default_price_file, load_price_file
    from schemas.topics import Topics
    from spendbus.stack.compacted import publish
    from spendbus.stack.topics import ensure_topics

    topics = Topics(prefix=f"bench-gw-{uuid.uuid4().hex[:6]}.")
    await ensure_topics(bootstrap, topics, partitions=4, security=security)
    tables = load_price_file(default_price_file())
    await publish(
        bootstrap,
        topics.pricing,
        [(t.version.encode(), PRICE_TABLE.encode(t.to_record())) for t in tables],
        security=security,
    )
    # real budgets on the request's path: an org budget and a per-job ceiling
    budgets = budgets_from_yaml(
        [
            {"id": "bench-org", "scope": "org", "window": "month", "limit_usd": "1000000"},
            {"id": "bench-job", "scope": "session", "window": "total", "limit_requests": 10**9},
        ]
    )
    now = datetime.now(UTC)
    await publish(
        bootstrap,
        topics.budget_policies,
        [(b.budget_id.encode(), BUDGET_POLICY.encode(b.to_record(now))) for b in budgets],
        security=security,
    )
    return topics


def pin(
    procs: dict[str, subprocess.Popen[bytes]], enabled: bool, broker_pid: int | None
) -> dict[str, Any] | None:
    """The proxy under test on the last CPU; the load (this process), the fake provider and
    the Kafka broker on the others: on a small machine their CPU would otherwise queue the
    proxies' requests, and that queueing, not the proxy, would dominate the latency
    percentiles. The broker matters for the gateway alone (the pass-through never talks to
    it): on the gateway's CPU, every produce request woke a broker thread that preempted
    the gateway mid-send. Every thread of the broker is moved (a JVM's threads keep the
    affinity they were created with); a broker given by KAFKA_BOOTSTRAP is not ours to pin."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if not enabled or len(cpus) < 2:
        return None
    proxy_cpus, load_cpus = {cpus[-1]}, set(cpus[:-1])
    for name in ("passthrough", "twin", "gateway"):
        if name in procs:
            os.sched_setaffinity(procs[name].pid, proxy_cpus)
    os.sched_setaffinity(procs["upstream"].pid, load_cpus)
    os.sched_setaffinity(0, load_cpus)
    broker = "external, not pinned"
    if broker_pid is not None:
        for task in Path(f"/proc/{broker_pid}/task").iterdir():
            with contextlib.suppress(ProcessLookupError):  # a thread that just ended
                os.sched_setaffinity(int(task.name), load_cpus)
        broker = "with the load"
    return {
        "proxies": sorted(proxy_cpus),
        "load_and_upstream": sorted(load_cpus),
        "kafka_broker": broker,
    }
