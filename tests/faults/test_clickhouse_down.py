"""ClickHouse unavailable under load: counters and verdicts go on, then the sink catches up exactly.

The embedded store (chdb) lives inside the worker, so "unavailable" is produced on what it
stands on: its filesystem (a size-limited tmpfs mounted for the test) fills up while the
worker runs under load. Every INSERT then fails in the engine (NOT_ENOUGH_SPACE, code 243),
which is the real retry path of aggregator/agents.py: ``ClickHouseWriter._until_done``
retries the same batch, kept as the sink's pending insert with the same dedup token, with
backoff, and acknowledges nothing to Kafka meanwhile. The counting stage does not wait for
it: the enforcer's verdicts must reach the exact ledger sums during the outage. When space
comes back the sink must catch up with every event once and the exact total.

Mounting needs root (CI runs as root); elsewhere the test is skipped with the reason. A lock
held by another process on the store is no reliable outage: chdb-core 26.9 does not always
take its lock on ``<path>/status`` when a second process opens a store a worker wrote. The
outage lasts
SPENDBUS_CH_DOWN_SECONDS: a few seconds in `make test`, a minute under `make test-faults`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import subprocess
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from schemas.codec import USAGE_EVENT
from schemas.records import UsageEvent
from schemas.topics import Topics, usage_raw_key
from schemas.usage import new_usage_event
from spendbus.stack.compacted import publish
from tests.pipeline_kit import Pipeline

pytestmark = [pytest.mark.integration, pytest.mark.faults]

DOWN_SECONDS = float(os.environ.get("SPENDBUS_CH_DOWN_SECONDS", "8"))
#: events published per second of load, before, during and after the outage
RATE = 40
TICK = 0.25


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 128 MiB tmpfs of its own for the store, so the test can fill it (needs root)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=128m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a filesystem to fill (needs root): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path) -> Path:
    """Write zeros until the filesystem refuses (ENOSPC), down to the last page; returns the
    filler file (unbuffered, so no failed flush is left for close to raise)."""
    filler = disk / "filler"
    with filler.open("wb", buffering=0) as out:
        for size in (1 << 20, 4096):
            with contextlib.suppress(OSError):
                while True:
                    out.write(b"\0" * size)
    return filler


def make_events(rng: random.Random, n: int, start: int) -> list[UsageEvent]:
    return [
        new_usage_event(
            provider="anthropic",
            api="anthropic-messages",
            model="claude-sonnet-4-5",
            secret_id=f"sk-{i % 7}",
            org_id=f"org-{i % 5}",
            gateway_id="ch-down",
            input_tokens=rng.randint(1, 9_000),
            output_tokens=rng.randint(1, 900),
        )
        for i in range(start, start + n)
    ]


class Load:
    """Publishes RATE events per second to usage.raw and keeps the ledger of what it sent."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.rng = random.Random(7)
        self.sent: list[UsageEvent] = []

    async def run_for(self, seconds: float) -> None:
        per_tick = max(1, int(RATE * TICK))
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            events = make_events(self.rng, per_tick, len(self.sent))
            await publish(
                self.pipeline.bootstrap,
                self.pipeline.topics.usage_raw,
                [(usage_raw_key(e["org_id"]), USAGE_EVENT.encode(e)) for e in events],
            )
            self.sent.extend(events)
            await asyncio.sleep(TICK)

    def per_secret(self) -> dict[tuple[str, str], int]:
        spent: dict[tuple[str, str], int] = defaultdict(int)
        for e in self.sent:
            spent[(e["org_id"], e["secret_id"])] += self.pipeline.prices.price_event(e).cost_nanos
        return dict(spent)

    def cost_nanos(self) -> int:
        return sum(self.pipeline.prices.price_event(e).cost_nanos for e in self.sent)


def test_clickhouse_disk_full_under_load_then_catch_up_exact(
    kafka_bootstrap: str,
    topics: Topics,
    tmp_path: Path,
    clickhouse_server_dsn: str | None,
    request: pytest.FixtureRequest,
) -> None:
    if clickhouse_server_dsn is not None:
        pytest.skip("the outage is made on the embedded store; this session uses a server")
    outage = "disk full"
    disk = request.getfixturevalue("small_disk")
    dsn = f"chdb://{disk / 'clickhouse'}"
    pipeline = Pipeline(kafka_bootstrap, topics, tmp_path / "home", dsn)
    pipeline.apply_reference()
    pipeline.worker.start(timeout=180)
    load = Load(pipeline)
    try:
        asyncio.run(load.run_for(2))
        before = pipeline.sql_until(
            "SELECT count() FROM usage_events", lambda rows: int(rows[0][0]) == len(load.sent)
        )
        assert int(before[0][0]) == len(load.sent), "the sink did not work before the outage"

        # ClickHouse goes away: its disk is full
        filler = fill(disk)
        sent_before_outage = len(load.sent)
        asyncio.run(load.run_for(DOWN_SECONDS))

        # counters and verdicts kept flowing: the enforcer sees every event charged so far
        during = load.per_secret()
        assert pipeline.verdict_spend_until(during) == during
        stats = pipeline.stats()
        assert stats["sink_failures"] > 0, f"the sink never failed: {stats}"
        stored = int(pipeline.sql("SELECT count() FROM usage_events")[0][0])
        assert stored < len(load.sent), "rows were stored on a full disk"
        sent_during = len(load.sent) - sent_before_outage

        # ClickHouse is back
        filler.unlink()
        asyncio.run(load.run_for(2))

        rows = pipeline.sql_until(
            "SELECT count(), uniqExact(event_id), sum(cost_nanos) FROM usage_events",
            lambda rows: int(rows[0][0]) >= len(load.sent),
            timeout=180,
        )
        stored, unique, nanos = int(rows[0][0]), int(rows[0][1]), int(rows[0][2] or 0)
        expected_nanos = load.cost_nanos()
        print(
            f"ledger ({outage}, {DOWN_SECONDS:g}s down): events sent={len(load.sent)} "
            f"(during the outage {sent_during}) charged in ClickHouse={stored} "
            f"unique={unique} difference={stored - len(load.sent)}; "
            f"nanos expected={expected_nanos} stored={nanos} difference={nanos - expected_nanos}; "
            f"sink failures={pipeline.stats()['sink_failures']}"
        )
        assert (stored, unique, nanos) == (len(load.sent), len(load.sent), expected_nanos), (
            f"stats: {pipeline.stats()}\nworker log:\n{pipeline.worker.log_tail(60)}"
        )
        final = load.per_secret()
        assert pipeline.verdict_spend_until(final) == final
    finally:
        pipeline.worker.stop()
