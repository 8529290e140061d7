"""Virtual keys (issue 21): generated strong, stored as digests keyed with a server-side
secret, legacy unsalted digests read and migrated, weak keys refused, and no secret of any
command taken as an argument."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from ingest.gateway import (
    KeysTopicFollower,
    KeyStore,
    VirtualKey,
    key_bits,
    key_digest,
    key_hmac,
    key_record,
    parse_config,
    weak_key_problem,
)
from runtime.topic_reader import read_latest_values
from schemas.codec import GATEWAY_KEY
from schemas.topics import Topics
from spendbus.cli import cli
from spendbus.stack.compacted import publish
from tests.gateway.kit import KEY_SECRET, gateway_config, gateway_stack
from tests.gateway.test_keys_topic import chat, entry, keys_cli, keys_cli_async, strong, until

PRINCIPAL: Any = {"org_id": "acme", "secret_id": "sk-1"}


def test_digests_are_keyed_with_the_server_secret_never_a_plain_hash() -> None:
    key = strong("keyed")
    plain = VirtualKey(name="k", key=key, principal=PRINCIPAL)
    store = KeyStore([plain], secret=KEY_SECRET)
    (stored,) = store._by_digest
    assert (
        stored == hmac.new(KEY_SECRET, hashlib.sha256(key.encode()).digest(), "sha256").hexdigest()
    )
    assert stored != key_digest(key) and key not in stored
    assert store.lookup(key) is plain
    # another secret, another digest: a leaked digest is no use to another deployment
    assert key_hmac(b"another-secret-0123456789", key) != stored
    # key_hmac entries work under the secret they were made with, and only that one
    given = VirtualKey(name="h", key_hmac=key_hmac(KEY_SECRET, key), principal=PRINCIPAL)
    assert KeyStore([given], secret=KEY_SECRET).lookup(key) is given
    assert KeyStore([given], secret=b"another-secret-0123456789").lookup(key) is None
    with pytest.raises(ValueError, match="needs the key secret"):
        KeyStore([given])


def test_legacy_sha256_digests_are_read_and_counted() -> None:
    key = strong("legacy")
    legacy = VirtualKey(name="l", key_sha256=key_digest(key), principal=PRINCIPAL)
    store = KeyStore([legacy], secret=KEY_SECRET)
    assert store.lookup(key) is legacy and store.legacy == 1
    # held under the keyed digest: the lookup is one HMAC, whatever the stored form
    assert set(store._by_digest) == {key_hmac(KEY_SECRET, key)}


@pytest.mark.parametrize(
    "weak",
    [
        "vk-acme-openai-0123456789",  # the old test keys: runs count little
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        "abcdefghijklmnopqrstuvwxyzabcdefghijkl",
        "password-password-1",
    ],
)
def test_weak_keys_are_named_too_weak(weak: str) -> None:
    problem = weak_key_problem(weak)
    assert problem is not None and "too weak" in problem and "spendbus keys new" in problem


def test_keys_new_makes_256_bit_keys_printed_once_with_their_keyed_digest(
    tmp_path: Path,
) -> None:
    env = {"SPENDBUS_HOME": str(tmp_path / "home")}
    made = [CliRunner().invoke(cli, ["keys", "new"], env=env) for _ in range(2)]
    for result in made:
        assert result.exit_code == 0, result.output
    keys = [r.stdout.strip() for r in made]
    assert len(set(keys)) == 2
    secret_file = tmp_path / "home" / "keys.secret"
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    secret = secret_file.read_text().strip().encode()
    assert len(secret) >= 64  # 32 random bytes as hex
    for key, result in zip(keys, made, strict=True):
        assert key.startswith("sb-") and len(key) == 3 + 43  # 32 random bytes, URL-safe
        assert weak_key_problem(key) is None and key_bits(key) >= 256
        assert result.stdout.count(key) == 1 and key not in result.stderr
        assert f"key_hmac: {key_hmac(secret, key)}" in result.stderr
    as_json = CliRunner().invoke(cli, ["keys", "new", "--json"], env=env)
    made_json = json.loads(as_json.stdout)
    assert made_json["key_hmac"] == key_hmac(secret, made_json["key"])
    # the same secret the next time: digests made today still match tomorrow
    assert secret_file.read_text().strip().encode() == secret


def test_the_key_secret_comes_from_one_place(tmp_path: Path) -> None:
    from schemas.errors import ConfigError
    from spendbus.settings import load_settings
    from spendbus.stack.key_secret import key_secret

    secret_file = tmp_path / "secret"
    secret_file.write_text("from-a-file-0123456789abcdef\n")
    secret_file.chmod(0o600)  # a secret: private (runtime/private_files.py)
    settings = load_settings({"SPENDBUS_KEY_SECRET_FILE": str(secret_file)})
    assert key_secret(settings) == b"from-a-file-0123456789abcdef"
    both = load_settings(
        {"SPENDBUS_KEY_SECRET_FILE": str(secret_file), "SPENDBUS_KEY_SECRET": "x" * 20}
    )
    with pytest.raises(ConfigError, match="both set"):
        key_secret(both)
    with pytest.raises(ConfigError, match="at least 16"):
        key_secret(load_settings({"SPENDBUS_KEY_SECRET": "short"}))
    assert "from-a-file" not in repr(settings)


def test_a_gateway_off_loopback_refuses_a_weak_key_given_in_clear(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(gateway_config("http://127.0.0.1:9")))
    result = CliRunner().invoke(
        cli, ["gateway", "run", "--config", str(path), "--host", "0.0.0.0"], env={}
    )
    assert result.exit_code == 1
    assert "too weak" in result.output and "takes no weak key" in result.output


def test_no_secret_is_taken_as_an_argument(tmp_path: Path) -> None:
    runner = CliRunner()
    for command in (["ingest", "serve"], ["enforcer", "serve"]):
        result = runner.invoke(cli, [*command, "--token", "s3cret-on-argv"], env={})
        assert result.exit_code == 2, result.output
        assert "never taken as arguments" in result.output and "--token-file" in result.output
        assert "s3cret-on-argv" not in result.output
    empty = tmp_path / "empty.token"
    empty.write_text("\n")
    empty.chmod(0o600)  # a secret: private (runtime/private_files.py)
    for command in (["ingest", "serve"], ["enforcer", "serve"]):
        result = runner.invoke(cli, [*command, "--token-file", str(empty)], env={})
        assert result.exit_code == 2 and "no bearer token" in result.output
    revoke = runner.invoke(cli, ["keys", "revoke", strong("on-argv")], env={})
    assert revoke.exit_code == 2 and "--key-file -" in revoke.output


@pytest.mark.integration
async def test_legacy_records_are_served_then_migrated_without_a_gap(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """Records written before keyed digests (plain SHA-256 record keys) keep working; `keys
    migrate` rewrites them under their keyed digests, leaves no unsalted digest live, and
    the keys work throughout, after a restart too."""
    from datetime import UTC, datetime

    now = datetime.now(UTC)
    old = [strong(f"old-{i}") for i in range(3)]
    await publish(
        kafka_bootstrap,
        topics.gateway_keys,
        [
            (
                key_digest(k).encode(),
                GATEWAY_KEY.encode(
                    key_record(VirtualKey(**entry(f"old-{i}", k, user_id=f"u{i}")), now)
                ),
            )
            for i, k in enumerate(old)
        ],
    )
    async with gateway_stack(kafka_bootstrap, topics, tmp_path) as stack:
        config = stack.gateway.config
        async with KeysTopicFollower(
            kafka_bootstrap, topics.gateway_keys, stack.gateway.keys, config
        ) as follower:
            await follower.wait_ready(30)
            for k in old:
                assert await chat(stack.url, k) == 200
            listed = await keys_cli_async(kafka_bootstrap, topics, "list")
            assert listed.output.count("legacy") == 3

            migrated = await keys_cli_async(kafka_bootstrap, topics, "migrate")
            assert migrated.exit_code == 0 and "migrated 3 legacy keys" in migrated.output
            await until(lambda: follower.applied == 6)
            await asyncio.sleep(0.5)  # the tombstones after them, applied or not
            for k in old:
                assert await chat(stack.url, k) == 200
            live = {
                k: v
                for k, v in (await read_latest_values(kafka_bootstrap, topics.gateway_keys)).items()
                if v is not None
            }
            assert sorted(live) == sorted(
                f"hmac-sha256:{key_hmac(KEY_SECRET, k)}".encode() for k in old
            )
            assert {GATEWAY_KEY.decode(v)["user_id"] for v in live.values()} == {"u0", "u1", "u2"}
            again = await keys_cli_async(kafka_bootstrap, topics, "migrate")
            assert "migrated 0 legacy keys" in again.output
        # a gateway starting now reads the keyed records and the legacy tombstones after them
        store = KeyStore(secret=KEY_SECRET)
        async with KeysTopicFollower(kafka_bootstrap, topics.gateway_keys, store, config) as fresh:
            await fresh.wait_ready(30)
            assert all(store.lookup(k) is not None for k in old) and len(store) == 3
            revoked = await keys_cli_async(
                kafka_bootstrap, topics, "revoke", "--key-file", "-", stdin=old[0]
            )
            assert revoked.exit_code == 0, revoked.output
            await until(lambda: store.lookup(old[0]) is None)


def test_migrate_prints_the_key_hmac_of_a_config_files_legacy_keys(tmp_path: Path) -> None:
    key = strong("in-config")
    data = gateway_config("http://127.0.0.1:9")
    data["keys"] = [
        {"name": "cfg", "key_sha256": key_digest(key), "principal": data["keys"][0]["principal"]}
    ]
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(data))
    result = keys_cli("127.0.0.1:9", Topics(""), "migrate", "--config", str(path))
    assert result.exit_code == 0, result.output
    digest = key_hmac(KEY_SECRET, key)
    assert f"keys.0 (cfg): key_sha256 -> key_hmac: {digest}" in result.output
    data["keys"][0] = {"name": "cfg", "key_hmac": digest, "principal": data["keys"][0]["principal"]}
    config = parse_config(data, "migrated")
    assert KeyStore(config.keys, secret=KEY_SECRET).lookup(key) is not None
