"""The whole pipeline on a SASL_SSL broker with deny-by-default ACLs, each role as its own
principal holding only what `spendbus acls` grants it; wrong credentials and an untrusted CA
fail fast with the setting named; no password in any output or log."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import TopicAuthorizationFailedError

from enforcer import Enforcer, EnforcerConfig
from ingest.publisher import PublisherConfig, UsagePublisher
from runtime.topic_reader import read_latest_values
from schemas.codec import GATEWAY_KEY
from schemas.topics import Topics
from spendbus.stack.compacted import publish
from spendbus.stack.topics import ensure_topics
from tests.integration.test_thin_slice import make_events
from tests.kafka_security_kit import SecuredKafka
from tests.pipeline_kit import Pipeline

pytestmark = pytest.mark.integration


def spendbus(
    env: dict[str, str], *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """One CLI run; the security settings only in its environment, never in argv."""
    return subprocess.run(
        [sys.executable, "-m", "spendbus", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def assert_no_password(secured: SecuredKafka, *texts: str) -> None:
    for text in texts:
        for user, password in secured.passwords.items():
            assert password not in text, f"{user}'s password shown"


def grant(secured: SecuredKafka, role: str, user: str, topics: Topics) -> str:
    """`spendbus acls --role R --principal User:U --apply`, run as the admin."""
    env = {**secured.env("admin"), "SPENDBUS_TOPIC_PREFIX": topics.prefix}
    done = spendbus(env, "acls", "--role", role, "--principal", f"User:{user}", "--apply")
    assert done.returncode == 0, done.stderr + done.stdout
    assert "created" in done.stdout and f"User:{user}" in done.stdout
    assert_no_password(secured, done.stdout, done.stderr)
    return done.stdout


@pytest.fixture
def secured_topics(secured_kafka: SecuredKafka, unique: str) -> Topics:
    names = Topics(prefix=f"s{unique}.")
    asyncio.run(
        ensure_topics(
            secured_kafka.bootstrap, names, partitions=4, security=secured_kafka.security("admin")
        )
    )
    return names


def test_the_pipeline_runs_on_sasl_ssl_with_each_role_least_privileged(
    secured_kafka: SecuredKafka, secured_topics: Topics, tmp_path: Path, clickhouse_dsn: str
) -> None:
    topics = secured_topics
    for role, user in (("aggregator", "worker"), ("gateway", "gw"), ("sidecar", "sidecar")):
        grant(secured_kafka, role, user, topics)
    pipeline = Pipeline(
        secured_kafka.bootstrap,
        topics,
        tmp_path,
        clickhouse_dsn,
        security=secured_kafka.security("admin"),  # budgets and prices: the operator's
        worker_env=secured_kafka.env("worker"),
    )
    pipeline.apply_reference()
    pipeline.worker.start(timeout=180)
    try:
        events = make_events(600, seed=16)

        async def publish_as_gateway() -> None:
            config = PublisherConfig(
                bootstrap=secured_kafka.bootstrap,
                kafka_security=secured_kafka.security("gw"),
                topic_prefix=topics.prefix,
                spool_dir=tmp_path / "spool",
            )
            async with UsagePublisher(config) as publisher:
                await publisher.publish_many(events + events[:10])  # ten re-sent
                await publisher.flush(timeout=60)

        asyncio.run(publish_as_gateway())
        expected = sum(pipeline.prices.price_event(e).cost_nanos for e in events)
        rows = pipeline.sql_until(
            "SELECT count(), sum(cost_nanos) FROM usage_events",
            lambda rows: int(rows[0][0]) >= len(events),
        )
        assert (int(rows[0][0]), int(rows[0][1] or 0)) == (len(events), expected)
        assert pipeline.stats()["duplicates"] == 10

        secret, org = events[0]["secret_id"], events[0]["org_id"]
        per_secret = sum(
            pipeline.prices.price_event(e).cost_nanos for e in events if e["secret_id"] == secret
        )

        async def enforce_as_sidecar() -> tuple[Any, int]:
            config = EnforcerConfig(
                bootstrap=secured_kafka.bootstrap,
                kafka_security=secured_kafka.security("sidecar"),
                topic_prefix=topics.prefix,
            )
            async with Enforcer(config) as enforcer:
                await enforcer.wait_ready(60)

                def spent() -> int:
                    statuses = enforcer.usage(enforcer.context(org_id=org, secret_id=secret))
                    return next((s.spent_nanos for s in statuses if s.budget_id == "per-secret"), 0)

                for _ in range(300):
                    if spent() == per_secret:
                        break
                    await asyncio.sleep(0.2)
                return enforcer.peek(enforcer.context(org_id=org, secret_id=secret)), spent()

        decision, spent = asyncio.run(enforce_as_sidecar())
        assert spent == per_secret
        assert decision.status == 402 and decision.body["budget_id"] == "per-secret"
        assert decision.body["spent_nanos"] == per_secret
    finally:
        pipeline.worker.stop()
    log = pipeline.worker.log_file.read_text(errors="replace")
    assert_no_password(secured_kafka, log)


def test_the_gateway_role_publishes_reads_verdicts_and_keys_and_may_not_write_budgets(
    secured_kafka: SecuredKafka, secured_topics: Topics
) -> None:
    topics = secured_topics
    admin, gw = secured_kafka.security("admin"), secured_kafka.security("gw")
    bootstrap = secured_kafka.bootstrap
    printed = grant(secured_kafka, "gateway", "gw", topics)
    assert f"WRITE on TOPIC {topics.usage_raw}" in printed
    assert f"WRITE on TOPIC {topics.budget_policies}" not in printed
    # what the operator and the aggregator would have written
    key: dict[str, Any] = {
        "name": "team-a",
        "org_id": "acme",
        "secret_id": "sk-1",
        "project_id": None,
        "grant_id": None,
        "user_id": None,
        "groups": [],
        "tags": {},
        "applied_at": datetime.now(UTC),
    }
    asyncio.run(
        publish(
            bootstrap, topics.gateway_keys, [(b"f" * 64, GATEWAY_KEY.encode(key))], security=admin
        )
    )
    asyncio.run(publish(bootstrap, topics.budget_verdicts, [(b"c1", b"v1")], security=admin))

    async def as_gateway() -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, **gw.client_kwargs()
        )
        await producer.start()
        try:
            await producer.send_and_wait(topics.usage_raw, b"usage", key=b"acme")
            with pytest.raises(TopicAuthorizationFailedError):
                await producer.send_and_wait(topics.budget_policies, b"budget", key=b"b1")
        finally:
            await producer.stop()

    asyncio.run(as_gateway())
    assert asyncio.run(read_latest_values(bootstrap, topics.budget_verdicts, security=gw)) == {
        b"c1": b"v1"
    }
    keys = asyncio.run(read_latest_values(bootstrap, topics.gateway_keys, security=gw))
    value = keys[b"f" * 64]
    assert value is not None and GATEWAY_KEY.decode(value)["name"] == "team-a"

    # the CLI as the gateway's principal: refused with a clear error, no password shown
    budget_file = Path(secured_kafka.folder) / f"{topics.prefix}budgets.yaml"
    budget_file.write_text('- {id: b1, scope: org, window: month, limit_usd: "1"}\n')
    env = {**secured_kafka.env("gw"), "SPENDBUS_TOPIC_PREFIX": topics.prefix}
    done = spendbus(env, "budgets", "apply", str(budget_file))
    assert done.returncode != 0
    assert "not authorized" in (done.stdout + done.stderr).lower()
    assert_no_password(secured_kafka, done.stdout, done.stderr)
    policies = asyncio.run(read_latest_values(bootstrap, topics.budget_policies, security=admin))
    assert b"b1" not in policies


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ("password", "KAFKA_SASL_PASSWORD"),
        ("cafile", "KAFKA_SSL_CAFILE"),
        ("protocol", "KAFKA_SECURITY_PROTOCOL"),
        ("username", "KAFKA_SASL_USERNAME"),
    ],
)
def test_bad_security_settings_fail_fast_naming_the_setting_and_the_broker(
    secured_kafka: SecuredKafka, secured_topics: Topics, tmp_path: Path, change: str, named: str
) -> None:
    env = {
        **secured_kafka.env("worker"),
        "SPENDBUS_TOPIC_PREFIX": secured_topics.prefix,
        "SPENDBUS_HOME": str(tmp_path),
    }
    if change == "password":
        wrong = tmp_path / "wrong.password"
        wrong.write_text("not-the-password\n")
        wrong.chmod(0o600)  # a secret: private (runtime/private_files.py)
        env["KAFKA_SASL_PASSWORD_FILE"] = str(wrong)
    elif change == "cafile":
        env["KAFKA_SSL_CAFILE"] = str(secured_kafka.untrusted_ca)
    elif change == "protocol":  # TLS against the plaintext listener
        env["KAFKA_BOOTSTRAP"] = secured_kafka.broker.bootstrap
    else:
        del env["KAFKA_SASL_USERNAME"]
    for command in (("aggregator", "run", "--no-sink"), ("status", "--json")):
        done = spendbus(env, *command, timeout=90)
        output = done.stdout + done.stderr
        assert done.returncode != 0, output
        assert named in output, output
        if change != "username":  # a missing setting is refused before any broker is asked
            assert env["KAFKA_BOOTSTRAP"] in output, output
        assert "Traceback" not in output, output
        assert_no_password(secured_kafka, output)


def test_status_shows_the_security_but_never_the_password(
    secured_kafka: SecuredKafka, secured_topics: Topics, tmp_path: Path
) -> None:
    env = {
        **secured_kafka.env("admin"),
        "SPENDBUS_TOPIC_PREFIX": secured_topics.prefix,
        "SPENDBUS_HOME": str(tmp_path),
    }
    # the password in the environment this time, the form most likely to leak
    del env["KAFKA_SASL_PASSWORD_FILE"]
    env["KAFKA_SASL_PASSWORD"] = secured_kafka.passwords["admin"]
    done = spendbus(env, "status", "--json")
    report = json.loads(done.stdout)
    assert report["kafka"]["reachable"] is True, done.stdout + done.stderr
    assert report["kafka"]["security"].startswith("SASL_SSL, SCRAM-SHA-512 as 'admin'")
    assert {t["name"] for t in report["topics"] if t["exists"]} >= {secured_topics.usage_raw}
    assert_no_password(secured_kafka, done.stdout, done.stderr)
    shown = spendbus({**env, "COLUMNS": "300"}, "status")
    assert "SASL_SSL, SCRAM-SHA-512 as 'admin'" in shown.stdout, shown.stdout + shown.stderr
    assert_no_password(secured_kafka, shown.stdout, shown.stderr)


def test_the_operator_role_runs_the_cli_without_being_a_super_user(
    secured_kafka: SecuredKafka, unique: str, tmp_path: Path
) -> None:
    topics = Topics(prefix=f"o{unique}.")
    grant(secured_kafka, "operator", "ops", topics)
    ops = secured_kafka.security("ops")
    created = asyncio.run(ensure_topics(secured_kafka.bootstrap, topics, 2, security=ops))
    assert topics.usage_raw in created and topics.gateway_keys in created
    env = {
        **secured_kafka.env("ops"),
        "SPENDBUS_TOPIC_PREFIX": topics.prefix,
        "SPENDBUS_HOME": str(tmp_path),
    }
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text("- {id: ops-b, scope: org, window: month, limit_tokens: 1000}\n")
    runs = [
        spendbus(env, "budgets", "apply", str(budgets)),
        spendbus(env, "budgets", "list", "--json"),
        spendbus(env, "dlq", "list"),
        spendbus(env, "status", "--json"),
    ]
    for done in runs:
        assert done.returncode == 0, [*done.args[-3:], done.stdout, done.stderr]
        assert "not authorized" not in done.stdout + done.stderr, done.stderr
        assert_no_password(secured_kafka, done.stdout, done.stderr)
    assert "ops-b" in runs[1].stdout
    report = json.loads(runs[3].stdout)
    assert report["kafka"]["reachable"] is True
