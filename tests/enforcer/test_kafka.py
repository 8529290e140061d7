"""The enforcer on real topics of a real broker (tests/conftest.py: kafka_bootstrap, topics).

The aggregator is another stage; producing its Verdict records directly is the
honest test of this one. Clocks are injected (staleness without sleeping minutes).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from click.testing import CliRunner

from enforcer import Enforcer, EnforcerConfig, InvalidContext, Sidecar
from ingest.publisher import PublisherConfig, UsagePublisher
from schemas.codec import BUDGET_POLICY, PRICE_TABLE, USAGE_EVENT, VERDICT
from schemas.ids import counter_key
from schemas.records import Verdict
from schemas.topics import Topics
from schemas.usage import ALLOWED, BUDGET_EXCEEDED, FAILED_OPEN, IN_FLIGHT_BUDGET_EXCEEDED
from tests.enforcer.kit import NOW, PRICES, FakeClock, budget, ctx, verdict

pytestmark = pytest.mark.integration

USD = 1_000_000_000
Message = tuple[str, str | None, bytes | None]


async def produce(bootstrap: str, messages: Iterable[Message]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks="all")
    await producer.start()
    try:
        futures = [
            await producer.send(topic, value, key=None if key is None else key.encode())
            for topic, key, value in messages
        ]
        await producer.flush()
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


def policy(topics: Topics, b: Any) -> Message:
    return topics.budget_policies, b.budget_id, BUDGET_POLICY.encode(b.to_record(NOW))


def prices(topics: Topics) -> Message:
    return topics.pricing, PRICES.version, PRICE_TABLE.encode(PRICES.to_record())


def verdict_msg(topics: Topics, record: Verdict) -> Message:
    return topics.budget_verdicts, record["counter_key"], VERDICT.encode(record)


async def eventually(predicate: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


def config(bootstrap: str, topics: Topics, **values: Any) -> EnforcerConfig:
    return EnforcerConfig(bootstrap=bootstrap, topic_prefix=topics.prefix, **values)


ORG = budget("org-monthly", limit_usd=10)


async def test_blocked_once_exhausted_and_unblocked_at_rollover(
    kafka_bootstrap: str, topics: Topics
) -> None:
    await produce(
        kafka_bootstrap,
        [
            policy(topics, ORG),
            prices(topics),
            verdict_msg(topics, verdict(ORG, ["acme"], spent_nanos=5 * USD, seq=1)),
        ],
    )
    clock = FakeClock()
    async with Enforcer(config(kafka_bootstrap, topics), clock=clock) as e:
        assert e.check(ctx()).decision == FAILED_OPEN  # not ready yet: fail_mode decides
        await e.wait_ready(30)
        assert e.ready and len(e.state.budgets) == 1 and len(e.state.prices) == 1
        first = e.check(ctx())
        assert first.decision == ALLOWED and first.hold_id is not None
        e.release(first.hold_id)

        # the aggregator marks exhaustion
        await produce(
            kafka_bootstrap,
            [verdict_msg(topics, verdict(ORG, ["acme"], spent_nanos=10 * USD, seq=2))],
        )
        await eventually(lambda: not e.check(ctx()).allowed)
        d = e.check(ctx())
        assert d.decision == BUDGET_EXCEEDED and d.status == 402 and d.budget_id == "org-monthly"
        # a stale, lower-seq verdict arriving late changes nothing
        await produce(
            kafka_bootstrap,
            [
                verdict_msg(topics, verdict(ORG, ["acme"], spent_nanos=0, seq=1)),
                verdict_msg(topics, verdict(ORG, ["globex"], spent_nanos=0, seq=1)),
            ],
        )
        await eventually(lambda: len(e.state.verdicts) == 2)
        assert e.check(ctx()).decision == BUDGET_EXCEEDED and e.state.verdicts_ignored == 1

        # the period rolls over: yesterday's verdict no longer blocks (once the stream is
        # confirmed fresh on the new clock, which the follower does by itself)
        clock.set(NOW.replace(month=12, day=1, hour=0))
        await eventually(lambda: not e.stale)
        d = e.check(ctx())
        assert d.allowed and d.counters[0].period == "m:2026-12"


@pytest.mark.parametrize("mode", ["open", "closed"])
async def test_fail_open_and_closed_after_staleness(
    kafka_bootstrap: str, topics: Topics, mode: str
) -> None:
    warn = budget("soft", action="warn", limit_usd=1, match={"org_id": ["warned"]})
    acme = budget("acme", limit_usd=10, match={"org_id": ["acme"]})
    await produce(kafka_bootstrap, [policy(topics, acme), policy(topics, warn), prices(topics)])
    clock = FakeClock()
    async with Enforcer(
        config(kafka_bootstrap, topics, fail_mode=mode, grace_s=60), clock=clock
    ) as e:
        await e.wait_ready(30)
        assert e.check(ctx()).allowed and not e.stale
        # the verdict stream stops answering (partitions paused: no fetch response arrives)
        consumer = e.follower._consumer
        assert consumer is not None
        verdict_tps = [tp for tp in consumer.assignment() if tp.topic == topics.budget_verdicts]
        consumer.pause(*verdict_tps)
        await asyncio.sleep(1.0)  # let in-flight fetches land
        clock.advance(61)
        await asyncio.sleep(1.0)
        assert e.stale
        d = e.check(ctx())
        if mode == "open":
            assert d.allowed and d.decision == FAILED_OPEN and d.outcome == "failed_open"
        else:
            assert d.status == 503 and ("Retry-After", "30") in d.headers
            assert d.outcome == "failed_closed"
        assert e.metrics.decisions[d.decision] == 1
        assert e.check(ctx(org_id="warned")).decision == ALLOWED  # warn budgets never block
        # the stream answers again: fresh, decisions are normal again
        consumer.resume(*verdict_tps)
        await eventually(lambda: not e.stale)
        assert e.check(ctx()).decision == ALLOWED


async def test_restart_rebuilds_state_from_the_compacted_topics(
    kafka_bootstrap: str, topics: Topics
) -> None:
    per_user = budget("per-user", "user", limit_usd=1)
    n = 10_000
    messages = [policy(topics, per_user), prices(topics)]
    for i in range(n):
        spent = USD if i % 2 == 0 else USD // 10
        messages.append(
            verdict_msg(topics, verdict(per_user, ["acme", f"u{i}"], spent_nanos=spent))
        )
    # a superseded value and poison messages are part of the history too
    messages.append(verdict_msg(topics, verdict(per_user, ["acme", "u1"], spent_nanos=USD, seq=2)))
    messages.append((topics.budget_verdicts, "garbage", b"\xc3\x01not-avro"))
    messages.append((topics.budget_verdicts, "plain", b"{}"))
    messages.append(
        (
            topics.budget_policies,
            "x",
            BUDGET_POLICY.encode({**per_user.to_record(NOW), "window": "fortnight"}),
        )
    )
    messages.append((topics.budget_verdicts, counter_key("gone", ["acme"]), None))
    # a rolling verdict whose buckets do not fit its record (Verdict v3): counted, skipped
    rolling = budget("rolling", window="rolling:5h", limit_usd=1)
    torn = verdict(rolling, ["acme"], buckets={0: (USD, 0, 0)})
    torn["bucket_tokens"] = []
    messages.append(verdict_msg(topics, torn))
    await produce(kafka_bootstrap, messages)

    def decisions(e: Enforcer) -> list[str]:
        return [e.peek(ctx(user_id=f"u{i}")).decision for i in range(0, n, 97)]

    clock = FakeClock()
    started = time.monotonic()
    async with Enforcer(config(kafka_bootstrap, topics), clock=clock) as first:
        await first.wait_ready(60)
        first_load = time.monotonic() - started
        assert len(first.state.verdicts) == n
        before = decisions(first)
        assert first.peek(ctx(user_id="u1")).decision == BUDGET_EXCEEDED  # seq 2 won
        assert first.peek(ctx(user_id="u3")).allowed
        assert first.metrics.undecodable == {
            (topics.budget_verdicts, "unknown_fingerprint"): 1,
            (topics.budget_verdicts, "bad_magic"): 1,
            (topics.budget_policies, "contract"): 1,
            (topics.budget_verdicts, "bad_buckets"): 1,
        }

    started = time.monotonic()
    async with Enforcer(config(kafka_bootstrap, topics), clock=clock) as second:
        await second.wait_ready(60)
        reload = time.monotonic() - started
        assert len(second.state.verdicts) == n and decisions(second) == before
    assert BUDGET_EXCEEDED in before and ALLOWED in before
    print(f"\n10k counters: first load {first_load:.2f}s, restart {reload:.2f}s")
    assert reload < 30


async def read_usage(bootstrap: str, topic: str, count: int, timeout: float = 15.0) -> list[Any]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(4)]  # the topics fixture's partitions
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        out: list[Any] = []
        deadline = time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=200)
            for messages in batch.values():
                out.extend((m.key, USAGE_EVENT.decode(m.value)) for m in messages)
        return out
    finally:
        await consumer.stop()


async def test_reserve_and_settle_stops_a_burst_through_the_sidecar(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    tight = budget("tight", limit_nanos=100_000_000)  # $0.10; each request's worst case $0.018
    await produce(
        kafka_bootstrap,
        [policy(topics, tight), prices(topics), verdict_msg(topics, verdict(tight, ["acme"]))],
    )
    clock = FakeClock()
    cfg = config(kafka_bootstrap, topics, sidecar_port=0, sidecar_token="tok")
    publisher = UsagePublisher(
        PublisherConfig(
            bootstrap=kafka_bootstrap, topic_prefix=topics.prefix, spool_dir=tmp_path / "spool"
        )
    )
    await publisher.start()
    sidecar = Sidecar(cfg, clock=clock, refusals=publisher)
    await sidecar.start()
    try:
        await sidecar.enforcer.wait_ready(30)
        url = f"http://127.0.0.1:{sidecar.port}"
        body = {
            "org_id": "acme",
            "secret_id": "sk-1",
            "provider": "anthropic",
            "api": "messages",
            "model": "claude-sonnet-4-5",
            "input_tokens": 1000,
            "max_output_tokens": 1000,
        }
        headers = {"Authorization": "Bearer tok"}
        async with aiohttp.ClientSession() as http:
            peek = await (
                await http.post(f"{url}/v1/check", json={**body, "reserve": False}, headers=headers)
            ).json()
            assert peek["allowed"]  # one request alone fits

            async def one() -> dict[str, Any]:
                async with http.post(f"{url}/v1/check", json=body, headers=headers) as r:
                    assert r.status == 200
                    return await r.json()  # type: ignore[no-any-return]  # aiohttp's json() is Any

            answers = await asyncio.gather(*(one() for _ in range(20)))
            allowed = [a for a in answers if a["allowed"]]
            refused = [a for a in answers if not a["allowed"]]
            assert len(allowed) == 5 and len(refused) == 15
            assert {a["decision"] for a in refused} == {IN_FLIGHT_BUDGET_EXCEEDED}
            assert all(a["published"] for a in refused)

            # the allowed ones finish: each usage event is published, then settled
            for a in allowed:
                usage = {
                    "model": "claude-sonnet-4-5",
                    "occurred_at": "2026-11-30T12:00:01Z",
                    "input_tokens": 1000,
                    "output_tokens": 100,
                }
                r = await http.post(
                    f"{url}/v1/settle",
                    json={"hold_id": a["hold_id"], "usage": usage},
                    headers=headers,
                )
                assert (await r.json())["settled"]
            actual = 1000 * 3_000 + 100 * 15_000
            assert sidecar.enforcer.holds.held_nanos == 5 * actual
            # the aggregator's verdict covering them arrives: holds drop, spend is the verdict's
            covering = verdict(
                tight, ["acme"], spent_nanos=5 * actual, seq=2, at=NOW + timedelta(seconds=1)
            )
            await produce(kafka_bootstrap, [verdict_msg(topics, covering)])
            await eventually(lambda: len(sidecar.enforcer.holds) == 0)
            usage_rows = await (
                await http.get(
                    f"{url}/v1/usage",
                    params={"org_id": "acme", "secret_id": "sk-1"},
                    headers=headers,
                )
            ).json()
            assert usage_rows["counters"][0]["spent_nanos"] == 5 * actual
            assert usage_rows["counters"][0]["held_nanos"] == 0

            metrics = await (await http.get(f"{url}/metrics")).text()
            assert (
                'spendbus_enforcer_checks_total{budget="tight",outcome="in_flight"} 15.0' in metrics
            )
            assert 'spendbus_enforcer_holds_dropped_total{reason="verdict"} 5.0' in metrics
            assert 'spendbus_enforcer_refusals_published_total{result="ok"} 15.0' in metrics
    finally:
        await sidecar.stop()
        await publisher.stop()

    # every refusal reached the usage stream as a zero-token event, keyed by org
    events = await read_usage(kafka_bootstrap, topics.usage_raw, 15)
    assert len(events) == 15
    for key, event in events:
        assert key == b"acme" and event["outcome"] == "refused"
        assert (
            event["decision"] == IN_FLIGHT_BUDGET_EXCEEDED
            and event["decision_budget_id"] == "tight"
        )
        assert event["input_tokens"] == 0 and event["output_tokens"] == 0
        assert event["status_code"] == 402 and event["api"] == "messages"


async def test_hostile_ids_cannot_reach_another_counter(
    kafka_bootstrap: str, topics: Topics
) -> None:
    per_user = budget("per-user", "user", limit_usd=1)
    session = budget("job", "session", window="total", limit_usd=1)
    await produce(
        kafka_bootstrap,
        [
            policy(topics, per_user),
            policy(topics, session),
            prices(topics),
            verdict_msg(topics, verdict(per_user, ["a", "b"], spent_nanos=USD)),
            verdict_msg(topics, verdict(session, ["a", "b", "c"], spent_nanos=USD)),
        ],
    )
    async with Enforcer(config(kafka_bootstrap, topics), clock=FakeClock()) as e:
        await e.wait_ready(30)
        assert e.check(ctx(org_id="a", user_id="b")).decision == BUDGET_EXCEEDED
        assert e.check(ctx(org_id="a", user_id="x", session_id="c", secret_id="b")).allowed
        exhausted = {counter_key("per-user", ["a", "b"]), counter_key("job", ["a", "b", "c"])}
        hostile: list[dict[str, Any]] = [
            {"org_id": "a", "user_id": "b,"},
            {"org_id": "a,1:b", "user_id": "x"},
            {"org_id": "1:a,", "user_id": "b"},
            {"org_id": "a", "user_id": "1:b,"},
            {"org_id": "a", "user_id": "b", "session_id": None},
            {"org_id": "a", "user_id": "b,1:c", "session_id": ""},
            {"org_id": "a", "user_id": "b|c"},
            {"org_id": "a", "user_id": "", "secret_id": "b,1:c"},
            {"org_id": "a", "user_id": "", "groups": ["b"], "tags": {"user_id": "b"}},
        ]
        for fields in hostile:
            d = e.check(ctx(**fields))
            touched = {c.counter for c in d.counters}
            if fields == {**fields, "org_id": "a", "user_id": "b"}:
                assert d.decision == BUDGET_EXCEEDED  # the same user is the same counter
                continue
            assert d.allowed and not touched & exhausted, fields
        for fields in ({"org_id": ""}, {"user_id": "b" * 100_000}, {"org_id": "a" * 513}):
            with pytest.raises(InvalidContext):
                ctx(**fields)


def test_spendbus_check_from_the_shell(kafka_bootstrap: str, topics: Topics) -> None:
    from spendbus.commands.enforcer import check

    asyncio.run(
        produce(
            kafka_bootstrap,
            [
                policy(topics, ORG),
                prices(topics),
                verdict_msg(topics, verdict(ORG, ["acme"], spent_nanos=10 * USD, at=NOW)),
            ],
        )
    )
    env = {"KAFKA_BOOTSTRAP": kafka_bootstrap, "SPENDBUS_TOPIC_PREFIX": topics.prefix}
    runner = CliRunner()
    # NOW is in the past: the monthly verdict of 2026-11 does not count in the current month
    result = runner.invoke(
        check, ["--org-id", "globex", "--secret-id", "s", "--model", "claude-sonnet-4-5"], env=env
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["allowed"] and out["decision"] == ALLOWED and out["hold_id"] is None
    # a check naming no model cannot be priced: the USD budget refuses it (unpriced: refuse)
    unpriced = runner.invoke(check, ["--org-id", "globex", "--secret-id", "s"], env=env)
    assert json.loads(unpriced.output)["body"]["reason"] == "model_unpriced", unpriced.output
    bad = runner.invoke(check, ["--org-id", "", "--secret-id", "s"], env=env)
    assert bad.exit_code == 1 and "org_id" in bad.output  # an error, not a refusal


def test_spendbus_check_exits_2_when_refused(kafka_bootstrap: str, topics: Topics) -> None:
    from spendbus.commands.enforcer import check

    lifetime = budget("lifetime", window="total", limit_usd=1)
    asyncio.run(
        produce(
            kafka_bootstrap,
            [
                policy(topics, lifetime),
                prices(topics),
                verdict_msg(topics, verdict(lifetime, ["acme"], spent_nanos=USD)),
            ],
        )
    )
    env = {"KAFKA_BOOTSTRAP": kafka_bootstrap, "SPENDBUS_TOPIC_PREFIX": topics.prefix}
    result = CliRunner().invoke(
        check, ["--org-id", "acme", "--secret-id", "s", "--tag", "team=x"], env=env
    )
    assert result.exit_code == 2, result.output
    out = json.loads(result.output)
    assert out["decision"] == BUDGET_EXCEEDED and out["body"]["budget_id"] == "lifetime"


async def test_enforcer_serve_command_runs_and_stops_on_sigterm(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    import os
    import signal
    import sys

    await produce(kafka_bootstrap, [policy(topics, ORG), prices(topics)])
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP": kafka_bootstrap,
        "SPENDBUS_TOPIC_PREFIX": topics.prefix,
        "SPENDBUS_ENFORCER_TOKEN": "from-env",
        "SPENDBUS_HOME": str(tmp_path),  # the refusal spool's default place
    }
    code = "from spendbus.commands.enforcer import enforcer; enforcer(['serve', '--port', '0'])"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, env=env, stderr=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stderr is not None
        url = None
        while url is None:
            line = await asyncio.wait_for(proc.stderr.readline(), 60)
            assert line, "serve exited before listening"
            if line.startswith(b'{"listening"'):
                url = json.loads(line)["listening"]
        async with aiohttp.ClientSession() as http:
            for _ in range(200):
                r = await http.get(f"{url}/readyz")
                if r.status == 200:
                    break
                await asyncio.sleep(0.1)
            assert r.status == 200
            body = {"org_id": "acme", "secret_id": "s", "model": "claude-sonnet-4-5"}
            assert (await http.post(f"{url}/v1/check", json=body)).status == 401
            r = await http.post(
                f"{url}/v1/check", json=body, headers={"Authorization": "Bearer from-env"}
            )
            assert (await r.json())["allowed"]
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
