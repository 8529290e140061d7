"""infra/gateway/gateway.example.yaml as shipped: it runs against the stack `spendbus up`
made (whatever port its broker took), spools under SPENDBUS_HOME, and a broker nobody
runs is one line naming the setting, the address and what to do."""

from __future__ import annotations

import os
from pathlib import Path

import aiohttp
import pytest
import yaml
from click.testing import CliRunner

from schemas.topics import Topics
from spendbus.cli import cli
from spendbus.stack.broker_probe import free_port
from spendbus.stack.topics import ensure_topics
from tests.gateway.kit import gateway_process

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "infra" / "gateway" / "gateway.example.yaml"
#: the example's clear key, for a try on loopback
LOOPBACK_KEY = "vk-loopback-only-0000"


def test_the_examples_clear_key_is_as_weak_as_its_comment_says(tmp_path: Path) -> None:
    from ingest.gateway import key_bits, load_config
    from ingest.gateway.config import MIN_KEY_BITS

    config = load_config(EXAMPLE)
    clear = [vk.key for vk in config.keys if vk.key is not None]
    assert clear == [LOOPBACK_KEY] and key_bits(LOOPBACK_KEY) < MIN_KEY_BITS
    # so a gateway listening anywhere but loopback refuses to start with it
    result = CliRunner().invoke(
        cli, ["gateway", "run", "--config", str(EXAMPLE), "--host", "0.0.0.0"]
    )
    assert result.exit_code == 1 and "too weak" in result.output


def test_the_example_leaves_the_broker_prefix_and_spool_to_the_environment() -> None:
    data = yaml.safe_load(EXAMPLE.read_text())
    assert not data.get("kafka"), "a pinned address misses the port `spendbus up` picked"
    assert "spool_dir" not in (data.get("publisher") or {}), "it would ignore SPENDBUS_HOME"


@pytest.mark.parametrize("where", ["file", "environment"])
def test_a_broker_nobody_runs_is_one_line_naming_the_setting(tmp_path: Path, where: str) -> None:
    address = f"127.0.0.1:{free_port()}"
    env = {"SPENDBUS_HOME": str(tmp_path / "home"), "KAFKA_BOOTSTRAP": ""}
    config = EXAMPLE
    if where == "file":
        data = yaml.safe_load(EXAMPLE.read_text())
        data["kafka"] = {"bootstrap": address}
        config = tmp_path / "gateway.yaml"
        config.write_text(yaml.safe_dump(data))
        setting = f"{config}: kafka.bootstrap"
    else:
        env["KAFKA_BOOTSTRAP"] = address
        setting = "KAFKA_BOOTSTRAP"
    result = CliRunner().invoke(
        cli, ["gateway", "run", "--config", str(config), "--port", "0"], env=env
    )
    assert result.exit_code == 1, result.exception
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert address in lines[0] and setting in lines[0] and "spendbus up" in lines[0]


def test_without_a_local_broker_the_example_says_to_start_one(tmp_path: Path) -> None:
    env = {"SPENDBUS_HOME": str(tmp_path / "home"), "KAFKA_BOOTSTRAP": ""}
    result = CliRunner().invoke(
        cli, ["gateway", "run", "--config", str(EXAMPLE), "--port", "0"], env=env
    )
    assert result.exit_code == 1
    assert result.output.count("\n") == 1 and "spendbus up" in result.output


@pytest.mark.integration
async def test_the_example_runs_as_shipped_against_the_stack(
    kafka_bootstrap: str, unique: str, tmp_path: Path
) -> None:
    """As `spendbus up` leaves it: the broker's address and the topic prefix come from the
    environment, no credential variable is set, the spool lands in SPENDBUS_HOME."""
    topics = Topics(prefix=f"t{unique}.")
    await ensure_topics(kafka_bootstrap, topics, partitions=1)
    home = tmp_path / "home"
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("ACME_", "SPENDBUS_", "KAFKA_"))
    }
    env |= {
        "KAFKA_BOOTSTRAP": kafka_bootstrap,
        "SPENDBUS_TOPIC_PREFIX": topics.prefix,
        "SPENDBUS_HOME": str(home),
        "PYTHONPATH": str(ROOT),
    }
    async with gateway_process(EXAMPLE, "--port", "0", cwd=tmp_path, env=env) as url:
        headers = {"Authorization": f"Bearer {LOOPBACK_KEY}"}
        async with (
            aiohttp.ClientSession() as session,
            session.get(url + "/v1/spend", headers=headers) as resp,
        ):
            assert resp.status == 200, await resp.text()
        assert (home / "gateway-spool" / "gateway-eu-1").is_dir()
        assert not (tmp_path / ".spendbus").exists()
