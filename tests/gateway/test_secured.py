"""`spendbus gateway run`'s composition on a SASL_SSL broker, as a principal holding only the
gateway role's ACLs: its keys follower, enforcer and publisher all connect with the settings."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from click.testing import CliRunner

from ingest.gateway import parse_config
from schemas.codec import USAGE_EVENT
from schemas.topics import Topics
from spendbus.cli import cli
from spendbus.commands.gateway import compose_configs
from spendbus.fake_upstream import FakeUpstream, FakeUpstreamConfig
from spendbus.stack.topics import ensure_topics
from tests.gateway.kit import KEY_SECRET, gateway_config
from tests.gateway.test_keys_topic import chat, entry, serving, strong, write
from tests.kafka_security_kit import SecuredKafka

pytestmark = pytest.mark.integration


def test_the_gateway_follows_keys_and_publishes_as_the_gateway_principal(
    secured_kafka: SecuredKafka, unique: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topics = Topics(prefix=f"g{unique}.")
    admin = secured_kafka.security("admin")
    asyncio.run(ensure_topics(secured_kafka.bootstrap, topics, 2, security=admin))
    operator_env = {
        **secured_kafka.env("admin"),
        "SPENDBUS_TOPIC_PREFIX": topics.prefix,
        "SPENDBUS_KEY_SECRET": KEY_SECRET.decode(),  # the one the gateway below keys with
    }
    runner = CliRunner()
    granted = runner.invoke(
        cli, ["acls", "--role", "gateway", "--principal", "User:gw", "--apply"], env=operator_env
    )
    assert granted.exit_code == 0, granted.output
    key = strong("secured")
    applied = runner.invoke(
        cli, ["keys", "apply", str(write(tmp_path, [entry("secured", key)]))], env=operator_env
    )
    assert applied.exit_code == 0, applied.output

    for name, value in {**secured_kafka.env("gw"), "SPENDBUS_TOPIC_PREFIX": topics.prefix}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SPENDBUS_HOME", str(tmp_path / "home"))

    async def run_gateway() -> int:
        async with FakeUpstream(FakeUpstreamConfig(port=0)) as upstream:
            data = gateway_config(
                upstream.url,
                keys=[],  # every key comes from the topic
                publisher={"spool_dir": str(tmp_path / "spool")},
                keys_topic={"follow": True, "ready_timeout_s": 60},
            )
            config = parse_config(data, "gateway.yaml")
            enforcer_config, publisher_config = compose_configs(config, "gateway.yaml")
            assert enforcer_config.kafka_security.sasl_username == "gw"
            assert publisher_config.kafka_security.sasl_username == "gw"
            async with serving(config, enforcer_config, publisher_config, 90) as url:
                return await chat(url, key)

    assert asyncio.run(run_gateway()) == 200

    # the usage event the gateway published as User:gw, read back by the operator
    from aiokafka import AIOKafkaConsumer

    async def read_usage() -> list[dict[str, object]]:
        consumer = AIOKafkaConsumer(
            topics.usage_raw,
            bootstrap_servers=secured_kafka.bootstrap,
            auto_offset_reset="earliest",
            group_id=None,
            **admin.client_kwargs(),
        )
        await consumer.start()
        try:
            batches = await consumer.getmany(timeout_ms=10_000)
            return [USAGE_EVENT.decode(m.value) for ms in batches.values() for m in ms]
        finally:
            await consumer.stop()

    events = asyncio.run(read_usage())
    assert [e["org_id"] for e in events] == ["globex"]
