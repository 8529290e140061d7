"""`spendbus gateway run`: config errors name the file and the field; the real process serves."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiokafka import AIOKafkaConsumer
from click.testing import CliRunner

from schemas.codec import USAGE_EVENT
from schemas.topics import Topics
from spendbus.cli import cli
from spendbus.fake_upstream import FakeUpstream, FakeUpstreamConfig
from spendbus.stack.topics import ensure_topics
from tests.gateway.kit import KEY_OF, gateway_config, gateway_process, request_for

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, data: Any, name: str = "gateway.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def run_cli(path: Path, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(cli, ["gateway", "run", "--config", str(path)], env=env)


def base(**overrides: Any) -> dict[str, Any]:
    data = gateway_config("http://127.0.0.1:9", kafka={"bootstrap": "127.0.0.1:9"})
    data.update(overrides)
    return data


@pytest.mark.parametrize(
    ("change", "field", "reason"),
    [
        ({"listen": {"port": 99999}}, "listen.port", "less than or equal to 65535"),
        (
            {"secrets": {"sk-x": {"upstream": "nowhere", "api_key": "k"}}},
            "secrets.sk-x.upstream",
            "no upstream named 'nowhere'",
        ),
        (
            {"upstreams": {"openai": {"api": "cohere", "base_url": "http://x"}}},
            "upstreams.openai.api",
            "openai",
        ),
        (
            {"upstreams": {"openai": {"api": "openai", "base_url": "ftp://x"}}},
            "upstreams.openai.base_url",
            "http://",
        ),
        ({"enforcer": {"fail_mode": "sideways"}}, "enforcer.fail_mode", "'open' or 'closed'"),
        ({"publisher": {"spool_full_policy": "pray"}}, "publisher.spool_full_policy", "block"),
        ({"kafka": {"bootstrap": "x", "brokers": 3}}, "kafka.brokers", "Extra inputs"),
        ({"surprise": 1}, "surprise", "Extra inputs"),
    ],
)
def test_a_bad_field_is_named_with_the_file(
    tmp_path: Path, change: dict[str, Any], field: str, reason: str
) -> None:
    path = write(tmp_path, base(**change))
    result = run_cli(path)
    assert result.exit_code == 1
    assert str(path) in result.output
    assert f"field {field!r}" in result.output
    assert reason in result.output


def test_the_gateways_publisher_batches_for_longer_unless_the_file_says(tmp_path: Path) -> None:
    from ingest.gateway import parse_config
    from ingest.publisher import PublisherConfig
    from spendbus.commands.gateway import GATEWAY_LINGER_MS, compose_configs

    spool = {"spool_dir": str(tmp_path / "spool")}
    _, publisher = compose_configs(parse_config(base(publisher=spool), "gateway.yaml"), "g.yaml")
    default = PublisherConfig.model_fields["linger_ms"].default
    assert publisher.linger_ms == GATEWAY_LINGER_MS != default
    chosen = parse_config(base(publisher={**spool, "linger_ms": 0}), "gateway.yaml")
    assert compose_configs(chosen, "g.yaml")[1].linger_ms == 0


def test_keys_must_be_usable_and_unique(tmp_path: Path) -> None:
    data = base()
    data["keys"][0]["key_sha256"] = "ab" * 32  # both the key and its digest
    result = run_cli(write(tmp_path, data))
    assert result.exit_code == 1 and "field 'keys.0'" in result.output
    data = base()
    data["keys"][1]["key"] = data["keys"][0]["key"]
    result = run_cli(write(tmp_path, data))
    assert "field 'keys.1'" in result.output and "twice" in result.output
    data = base()
    data["keys"][0]["principal"]["secret_id"] = "sk-unknown"
    result = run_cli(write(tmp_path, data))
    assert "field 'keys.0.principal.secret_id'" in result.output


def test_a_missing_credential_variable_is_named(tmp_path: Path) -> None:
    data = base()
    data["secrets"]["sk-openai"] = {"upstream": "openai", "api_key_env": "GW_TEST_UNSET_KEY"}
    result = run_cli(write(tmp_path, data), env={"GW_TEST_UNSET_KEY": ""})
    assert result.exit_code == 1
    assert "field 'secrets.sk-openai.api_key_env'" in result.output
    assert "GW_TEST_UNSET_KEY is not set" in result.output


def test_unreadable_files_are_named(tmp_path: Path) -> None:
    missing = tmp_path / "absent.yaml"
    result = run_cli(missing)
    assert result.exit_code != 0 and "absent.yaml" in result.output
    broken = write(tmp_path, "upstreams: [unclosed", "broken.yaml")
    result = run_cli(broken)
    assert result.exit_code == 1 and "broken.yaml: not valid YAML" in result.output
    listed = write(tmp_path, "- a\n- b\n", "list.yaml")
    assert "expected a mapping" in run_cli(listed).output


@pytest.mark.integration
async def test_the_command_serves_and_publishes_until_terminated(
    kafka_bootstrap: str, unique: str, tmp_path: Path
) -> None:
    topics = Topics(prefix=f"t{unique}.")
    await ensure_topics(kafka_bootstrap, topics, partitions=1)
    async with FakeUpstream(FakeUpstreamConfig(port=0)) as upstream:
        data = gateway_config(
            upstream.url,
            kafka={"bootstrap": kafka_bootstrap, "topic_prefix": topics.prefix},
            publisher={"spool_dir": str(tmp_path / "spool")},
            listen={"host": "127.0.0.1", "port": 0},
        )
        data["secrets"]["sk-openai"] = {"upstream": "openai", "api_key_env": "GW_TEST_OPENAI"}
        path = write(tmp_path, data)
        env = {**os.environ, "GW_TEST_OPENAI": "from-the-environment"}
        async with gateway_process(path, cwd=ROOT, env=env) as url:
            path_, body, key = request_for("openai-chat", True)
            async with (
                aiohttp.ClientSession() as session,
                session.post(
                    url + path_, json=body, headers={"Authorization": f"Bearer {key}"}
                ) as resp,
            ):
                assert resp.status == 200
                assert (await resp.read()).rstrip().endswith(b"data: [DONE]")
        consumer = AIOKafkaConsumer(
            topics.usage_raw,
            bootstrap_servers=kafka_bootstrap,
            auto_offset_reset="earliest",
            group_id=None,
        )
        await consumer.start()
        try:
            batches = await consumer.getmany(timeout_ms=10_000)
        finally:
            await consumer.stop()
        events = [USAGE_EVENT.decode(m.value) for ms in batches.values() for m in ms]
        assert [(e["secret_id"], e["usage_source"]) for e in events] == [("sk-openai", "reported")]
        assert events[0]["output_tokens"] == upstream.stats.total.usage["output_tokens"]
        assert KEY_OF["sk-openai"] not in json.dumps(events[0], default=str)
