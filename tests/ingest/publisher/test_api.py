"""The publisher without a reachable broker: validation, lifecycle, spool-full policies,
flush timeouts and torn-tail recovery, counted in the metrics."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import cast

import pytest

import ingest.publisher
from ingest.errors import PublisherClosed, PublishTimeout, SpoolFull, SpoolLocked
from ingest.publisher import InvalidRecord, UsagePublisher, prepare
from ingest.publisher.spool import frame
from schemas.codec import USAGE_EVENT
from schemas.records import UsageEvent
from tests.ingest.publisher.kit import config, event


def metric(pub: UsagePublisher, name: str, **labels: str) -> float:
    value = pub.metrics.registry.get_sample_value(name, labels or None)
    return 0.0 if value is None else value


def test_public_api() -> None:
    assert set(ingest.publisher.__all__) == {
        "InvalidRecord",
        "PreparedEvent",
        "PublishTimeout",
        "PublisherClosed",
        "PublisherConfig",
        "SpoolFull",
        "SpoolLocked",
        "UsagePublisher",
        "prepare",
    }


def test_prepare_encodes_once_with_the_org_as_key() -> None:
    e = event(org="  acme ")
    prepared = prepare(e)
    assert prepared.key == b"acme"  # canonical: surrounding blanks removed
    assert prepared.event_id == e["event_id"]
    assert USAGE_EVENT.decode(prepared.value) == e


def test_keys_stay_canonical_past_the_key_cache() -> None:
    orgs = [f" org-{i} " if i % 2 else f"org-{i}" for i in range(5000)]  # more than it holds
    for _ in range(2):
        for org in orgs:
            assert prepare(event(org=org)).key == org.strip().encode()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"input_tokens": -1}, "input_tokens"),
        ({"output_tokens": "12"}, "output_tokens"),
        ({"output_tokens": 1.5}, "output_tokens"),
        ({"input_tokens": True}, "input_tokens"),
        ({"org_id": ""}, "org_id"),
        ({"stream": "yes"}, "stream"),
        ({"latency_ms": -3}, "latency_ms"),
        ({"request_id": 7}, "request_id"),
        ({"input_tokenz": 1}, "input_tokenz"),
        ({"tags": {"k": "v" * 300_000}}, "<event>"),
    ],
)
def test_prepare_names_the_bad_field(change: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidRecord) as caught:
        prepare(cast(UsageEvent, {**event(), **change}))  # the wrong shape is the point
    assert caught.value.field == field


async def test_publish_before_start_and_after_stop_is_refused(tmp_path: Path) -> None:
    pub = UsagePublisher(config(tmp_path))
    with pytest.raises(PublisherClosed):
        await pub.publish(event())
    await pub.start()
    await pub.stop(timeout=0.1)
    with pytest.raises(PublisherClosed):
        await pub.publish(event())


async def test_invalid_event_in_a_batch_publishes_none_of_it(tmp_path: Path) -> None:
    async with UsagePublisher(config(tmp_path)) as pub:
        # the middle one breaks the contract: the point of the test
        batch = [event(0), cast(UsageEvent, {**event(1), "input_tokens": -5}), event(2)]
        with pytest.raises(InvalidRecord) as caught:
            await pub.publish_many(batch)
        assert caught.value.field == "input_tokens"
        assert pub.spooled_bytes == 0
        assert metric(pub, "spendbus_ingest_rejected_events_total", field="input_tokens") == 1
        assert metric(pub, "spendbus_ingest_spooled_events_total") == 0


async def test_flush_times_out_while_kafka_is_unreachable_and_the_events_stay(
    tmp_path: Path,
) -> None:
    async with UsagePublisher(config(tmp_path)) as pub:
        await pub.publish(event())
        with pytest.raises(PublishTimeout) as caught:
            await pub.flush(timeout=0.5)
        assert caught.value.retriable
        assert pub.spooled_bytes > 0
        assert not pub.status()["kafka_connected"]
        assert pub.status()["last_error"]
        errors = pub.metrics.registry.get_sample_value(
            "spendbus_ingest_send_errors_total", {"error": "KafkaConnectionError"}
        )
        assert errors and errors >= 1
        assert metric(pub, "spendbus_ingest_spool_bytes") == pub.spooled_bytes


async def test_spool_full_block_policy_waits_then_raises_logged_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = config(
        tmp_path,
        spool_max_bytes=64 * 1024,
        segment_bytes=16 * 1024,
        spool_full_timeout_s=0.2,
        max_batch_bytes=16 * 1024,
        max_record_bytes=4 * 1024,
    )
    async with UsagePublisher(cfg) as pub:
        accepted = 0
        with (
            caplog.at_level(logging.WARNING, logger="ingest.publisher"),
            pytest.raises(SpoolFull) as caught,
        ):
            for i in range(1_000):
                await pub.publish(event(i))
                accepted += 1
        assert caught.value.retriable
        assert 0 < accepted < 1_000
        assert pub.spooled_bytes <= cfg.spool_max_bytes
        assert metric(pub, "spendbus_ingest_spool_full_total", action="refused") == 1
        assert metric(pub, "spendbus_ingest_spooled_events_total") == accepted
        assert any("spool full" in r.getMessage() for r in caplog.records)


async def test_spool_full_drop_newest_drops_logged_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = config(
        tmp_path,
        spool_max_bytes=64 * 1024,
        segment_bytes=16 * 1024,
        spool_full_policy="drop_newest",
        max_batch_bytes=16 * 1024,
        max_record_bytes=4 * 1024,
    )
    async with UsagePublisher(cfg) as pub:
        with caplog.at_level(logging.WARNING, logger="ingest.publisher"):
            spooled = 0
            for i in range(0, 1_000, 10):
                spooled += await pub.publish_many([event(j) for j in range(i, i + 10)])
        assert 0 < spooled < 1_000
        assert metric(pub, "spendbus_ingest_dropped_events_total") == 1_000 - spooled
        assert (
            metric(pub, "spendbus_ingest_spool_full_total", action="dropped")
            == (1_000 - spooled) / 10
        )
        assert metric(pub, "spendbus_ingest_spooled_events_total") == spooled
        assert any("drop_newest" in r.getMessage() for r in caplog.records)


async def test_restart_recovers_a_torn_tail_and_keeps_the_whole_events(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    events = [event(i) for i in range(20)]
    async with UsagePublisher(cfg) as pub:
        await pub.publish_many(events)
    # a crash in the middle of writing one more event
    segment = sorted(tmp_path.glob("*.seg"))[-1]
    torn = frame(b"acme", prepare(event(99)).value)
    with segment.open("ab") as f:
        f.write(torn[: len(torn) // 2])

    pub = UsagePublisher(cfg)
    await pub.start()
    try:
        assert metric(pub, "spendbus_ingest_spool_truncated_bytes_total") == len(torn) // 2
        assert pub.spooled_bytes == sum(len(frame(b"acme", prepare(e).value)) for e in events)
    finally:
        await pub.stop(timeout=0.1)


async def test_fsync_always_returns_after_a_shared_fsync(tmp_path: Path) -> None:
    async with UsagePublisher(config(tmp_path, fsync="always")) as pub:
        await asyncio.gather(*(pub.publish(event(i)) for i in range(50)))
        await pub.publish_many([event(i) for i in range(50, 60)])
        assert metric(pub, "spendbus_ingest_spooled_events_total") == 60
        assert pub._synced == pub._spool.write_end  # type: ignore[union-attr]  # started: the spool is open


async def test_one_publisher_per_spool_directory(tmp_path: Path) -> None:
    async with UsagePublisher(config(tmp_path)):
        second = UsagePublisher(config(tmp_path))
        with pytest.raises(SpoolLocked):
            await second.start()
        assert second.state == "stopped"
