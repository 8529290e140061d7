"""Virtual keys from the compacted keys topic: `spendbus keys` publishes them hashed, the
gateway follows them live (real broker, real enforcer and publisher, fake providers only)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from click.testing import CliRunner, Result

from ingest.gateway import (
    KeysNotReady,
    KeysTopicFollower,
    KeyStore,
    VirtualKey,
    key_record,
    parse_config,
)
from runtime.topic_reader import read_latest_values
from schemas.codec import GATEWAY_KEY, VERDICT
from schemas.errors import ConfigError
from schemas.topics import Topics
from spendbus.cli import cli
from spendbus.commands.gateway import compose_configs, serve
from spendbus.fake_upstream import FakeUpstream, FakeUpstreamConfig
from spendbus.stack.compacted import publish
from tests.gateway.kit import (
    BROKE,
    KEY_OF,
    KEY_SECRET,
    PROMPT,
    exhausted_verdict,
    gateway_config,
    gateway_stack,
)

pytestmark = pytest.mark.integration

CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": PROMPT}]}


def digest(key: str) -> str:
    """The legacy (unsalted) digest of a key."""
    return hashlib.sha256(key.encode()).hexdigest()


def keyed(key: str) -> str:
    """The keyed digest the gateways look ``key`` up by (under the stacks' KEY_SECRET)."""
    return hmac.new(KEY_SECRET, hashlib.sha256(key.encode()).digest(), "sha256").hexdigest()


def published_as(key: str) -> bytes:
    """The record key `keys apply` publishes ``key`` under."""
    return f"hmac-sha256:{keyed(key)}".encode()


def strong(label: str) -> str:
    """A key strong enough for `keys apply` (deterministic: named by ``label``)."""
    return f"vk-{label}-{hashlib.sha256(label.encode()).hexdigest()[:40]}"


def entry(name: str, key: str, secret: str = "sk-openai", **principal: Any) -> dict[str, Any]:
    return {
        "name": name,
        "key": key,
        "principal": {"org_id": "globex", "secret_id": secret, **principal},
    }


def write(tmp_path: Path, data: Any, name: str = "keys.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def keys_cli(bootstrap: str, topics: Topics, *args: str, stdin: str | None = None) -> Result:
    env = {
        "KAFKA_BOOTSTRAP": bootstrap,
        "SPENDBUS_TOPIC_PREFIX": topics.prefix,
        "SPENDBUS_KEY_SECRET": KEY_SECRET.decode(),
    }
    return CliRunner().invoke(cli, ["keys", *args], env=env, input=stdin)


async def keys_cli_async(
    bootstrap: str, topics: Topics, *args: str, stdin: str | None = None
) -> Result:
    """The command runs its own event loop: in a thread beside the test's."""
    return await asyncio.to_thread(keys_cli, bootstrap, topics, *args, stdin=stdin)


async def chat(url: str, key: str) -> int:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{url}/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {key}"}
        ) as resp,
    ):
        await resp.read()
        return resp.status


@asynccontextmanager
async def serving(
    config: Any, enforcer_config: Any, publisher_config: Any, ready_timeout: float
) -> AsyncIterator[str]:
    """`spendbus gateway run`'s serve() in this loop: the gateway's URL once it listens."""
    stop = asyncio.Event()
    started: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(
        serve(
            config,
            enforcer_config,
            publisher_config,
            config.credentials({}),
            port=0,
            on_started=started.set_result,
            stop=stop,
            key_secret=KEY_SECRET,
        )
    )
    try:
        yield await asyncio.wait_for(started, ready_timeout)
    finally:
        stop.set()
        await task


async def until(predicate: Any, timeout: float = 20.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.05)


async def test_applied_keys_authenticate_revocation_and_new_keys_apply_live(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    first, second, later = strong("globex-ana"), strong("globex-bob"), strong("globex-cy")
    applied = await keys_cli_async(
        kafka_bootstrap,
        topics,
        "apply",
        str(
            write(
                tmp_path,
                [
                    entry("globex-ana", first, user_id="ana@globex.io", groups=["eng"]),
                    {
                        "name": "globex-bob",
                        "key_sha256": digest(second),
                        "principal": {
                            "org_id": "globex",
                            "secret_id": "sk-openai",
                            "project_id": "p9",
                            "grant_id": "g-7",
                            "tags": {"team": "ml"},
                        },
                    },
                ],
            )
        ),
    )
    assert applied.exit_code == 0, applied.output
    assert "applied 2 keys" in applied.output

    async with gateway_stack(kafka_bootstrap, topics, tmp_path) as stack:
        assert await chat(stack.url, first) == 401  # not followed yet: only the file's keys
        async with KeysTopicFollower(
            kafka_bootstrap, topics.gateway_keys, stack.gateway.keys, stack.gateway.config
        ) as follower:
            await follower.wait_ready(30)
            # ready means caught up: every key is in the store when wait_ready returns
            assert set(follower.topic_keys) == {keyed(first), keyed(second)}
            assert stack.gateway.keys.lookup(first) is not None
            assert stack.gateway.keys.lookup(second) is not None
            assert await chat(stack.url, first) == 200
            assert await chat(stack.url, second) == 200
            assert await chat(stack.url, KEY_OF["sk-openai"]) == 200  # the file's keys still work
            events = await stack.events(3)
            by_user = {e["user_id"]: e for e in events}
            assert by_user["ana@globex.io"]["org_id"] == "globex"
            assert by_user["ana@globex.io"]["groups"] == ["eng"]
            assert by_user["ana@globex.io"]["session_id"].startswith("auto:globex-ana:")
            bob = next(e for e in events if e["grant_id"] == "g-7")
            assert (bob["project_id"], bob["tags"], bob["secret_id"]) == (
                "p9",
                {"team": "ml"},
                "sk-openai",
            )

            listed = await keys_cli_async(kafka_bootstrap, topics, "list")
            assert listed.exit_code == 0, listed.output
            # bob was given as a legacy key_sha256: published under its keyed digest all the same
            assert keyed(first)[:12] in listed.output and keyed(second)[:12] in listed.output
            assert "globex-bob" in listed.output and "legacy" not in listed.output
            assert first not in listed.output and keyed(first) not in listed.output

            # the key itself only on standard input, never as an argument
            on_argv = await keys_cli_async(kafka_bootstrap, topics, "revoke", first)
            assert on_argv.exit_code == 2 and "never taken as an argument" in on_argv.output
            assert follower.revoked == 0
            revoked = await keys_cli_async(
                kafka_bootstrap, topics, "revoke", "--key-file", "-", stdin=first + "\n"
            )
            assert revoked.exit_code == 0, revoked.output
            assert first not in revoked.output
            await until(lambda: follower.revoked == 1)
            assert await chat(stack.url, first) == 401
            # by the prefix `keys list` shows
            revoked = await keys_cli_async(kafka_bootstrap, topics, "revoke", keyed(second)[:12])
            assert revoked.exit_code == 0, revoked.output
            await until(lambda: follower.revoked == 2)
            assert await chat(stack.url, second) == 401
            again = await keys_cli_async(
                kafka_bootstrap, topics, "revoke", "--key-file", "-", stdin=first
            )
            assert again.exit_code == 1 and "no live key matches" in again.output

            new = write(tmp_path, {"keys": [entry("globex-cy", later)]}, "later.yaml")
            assert (await keys_cli_async(kafka_bootstrap, topics, "apply", str(new))).exit_code == 0
            await until(lambda: follower.applied == 3)
            assert await chat(stack.url, later) == 200
            assert follower.skipped == {}


@pytest.mark.parametrize(
    ("entries", "named"),
    [
        (
            [
                entry("ok-one", "vk-ok-one-0123456789"),
                entry("bad", "vk-bad-0123456789", org_id=" "),
            ],
            "entry 1 ('bad'): field 'principal.org_id': must not be blank",
        ),
        ([entry("short", "vk-short")], "entry 0 ('short'): field 'key'"),
        (
            [{**entry("both", "vk-both-0123456789"), "key_sha256": "ab" * 32}],
            "entry 0 ('both'): field '<config>': give exactly one of key, key_hmac and key_sha256",
        ),
        (
            [entry("x", "vk-x-0123456789ab", team="a")],
            "entry 0 ('x'): field 'principal.team': Extra inputs are not permitted",
        ),
        (
            [entry("dup", "vk-dup-0123456789"), entry("dup", "vk-dup-9876543210")],
            "entry 1 ('dup'): field 'name': 'dup' is used by entry 0 too",
        ),
        (
            [entry("a", "vk-same-0123456789"), entry("b", "vk-same-0123456789")],
            "entry 1 ('b'): the same key is given by entry 0 too",
        ),
        ([entry("sp ace", "vk-space-0123456789")], "entry 0 ('sp ace'): field 'name'"),
        ({"keys": [], "upstreams": {}}, "expected a list of key entries"),
        ("keys: [unclosed", "not valid YAML"),
    ],
)
def test_invalid_entries_are_refused_by_file_entry_and_field_and_nothing_is_published(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path, entries: Any, named: str
) -> None:
    path = write(tmp_path, entries)
    result = keys_cli(kafka_bootstrap, topics, "apply", str(path))
    assert result.exit_code == 1
    assert f"{path}: {named}" in result.output
    assert asyncio.run(read_latest_values(kafka_bootstrap, topics.gateway_keys)) == {}


def test_checks_against_a_gateway_config_and_live_names(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    gateway_file = write(tmp_path, gateway_config("http://127.0.0.1:9"), "gateway.yaml")
    unknown = write(tmp_path, [entry("x", strong("x"), secret="sk-nope")])
    result = keys_cli(
        kafka_bootstrap, topics, "apply", str(unknown), "--gateway-config", str(gateway_file)
    )
    assert result.exit_code == 1
    assert "entry 0 ('x'): field 'principal.secret_id': no secret named 'sk-nope'" in result.output
    shadowed = write(tmp_path, [entry("acme-openai", strong("other"))])
    result = keys_cli(
        kafka_bootstrap, topics, "apply", str(shadowed), "--gateway-config", str(gateway_file)
    )
    assert result.exit_code == 1 and "defines this key or name itself" in result.output
    assert asyncio.run(read_latest_values(kafka_bootstrap, topics.gateway_keys)) == {}

    first = write(tmp_path, [entry("taken", strong("taken"))], "first.yaml")
    assert keys_cli(kafka_bootstrap, topics, "apply", str(first)).exit_code == 0
    clash = write(tmp_path, [entry("taken", strong("other"))], "clash.yaml")
    result = keys_cli(kafka_bootstrap, topics, "apply", str(clash))
    assert result.exit_code == 1
    assert "entry 0 ('taken'): field 'name': already the name of live key" in result.output
    live = asyncio.run(read_latest_values(kafka_bootstrap, topics.gateway_keys))
    assert list(live) == [published_as(strong("taken"))]
    # re-applying the same key (a changed principal) is an update, not a clash
    update = write(tmp_path, [entry("taken", strong("taken"), user_id="u1")], "u.yaml")
    assert keys_cli(kafka_bootstrap, topics, "apply", str(update)).exit_code == 0
    live = asyncio.run(read_latest_values(kafka_bootstrap, topics.gateway_keys))
    value = live[published_as(strong("taken"))]
    assert value is not None and GATEWAY_KEY.decode(value)["user_id"] == "u1"


async def test_the_topic_never_holds_a_plaintext_key(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    plain = [strong("secret-alpha"), strong("secret-beta")]
    path = write(tmp_path, [entry(f"k{i}", k) for i, k in enumerate(plain)])
    assert (await keys_cli_async(kafka_bootstrap, topics, "apply", str(path))).exit_code == 0
    key_file = tmp_path / "revoke.key"
    key_file.write_text(plain[0] + "\n")
    key_file.chmod(0o600)  # a secret: private (runtime/private_files.py)
    revoked = await keys_cli_async(kafka_bootstrap, topics, "revoke", "--key-file", str(key_file))
    assert revoked.exit_code == 0, revoked.output
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        topics.gateway_keys,
        bootstrap_servers=kafka_bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_id=None,
    )
    await consumer.start()
    records: list[Any] = []
    try:
        async with asyncio.timeout(20):
            while len(records) < 3:  # two keys and one tombstone: every record, not only live ones
                for messages in (await consumer.getmany(timeout_ms=500)).values():
                    records.extend(messages)
    finally:
        await consumer.stop()
    assert [r.key for r in records] == [published_as(k) for k in (*plain, plain[0])]
    assert records[2].value is None
    for record in records:
        raw = record.key + (record.value or b"")
        for key in plain:
            assert key.encode() not in raw
            assert key[3:].encode() not in raw  # nor the key without its prefix


async def test_unusable_records_are_skipped_logged_and_counted_never_fatal(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from datetime import UTC, datetime

    config = parse_config(gateway_config("http://127.0.0.1:9"), "test")
    now = datetime.now(UTC)

    def value(name: str, secret: str = "sk-openai", org: str = "globex") -> bytes:
        vk = VirtualKey(**entry(name, "vk-any-0123456789", secret))
        return GATEWAY_KEY.encode({**key_record(vk, now), "org_id": org})

    good, dropped, later = "vk-good-0123456789", "vk-dropped-0123456789", "vk-later-0123456789"
    file_key = KEY_OF["sk-openai"]
    await publish(
        kafka_bootstrap,
        topics.gateway_keys,
        [
            (digest(dropped).encode(), value("dropped")),  # usable, then unusable below
            (digest("vk-garbage-0123456789").encode(), b"not avro at all"),
            (b"not-a-digest", value("nokey")),
            (
                digest("vk-verdict-0123456789").encode(),
                VERDICT.encode(exhausted_verdict(BROKE, ["broke"])),
            ),
            (digest("vk-secret-0123456789").encode(), value("nosecret", secret="sk-none")),
            (digest("vk-blank-0123456789").encode(), value("blank", org=" ")),
            (digest(file_key).encode(), value("hijack")),  # the file's key, another principal
            (digest("vk-clash-0123456789").encode(), value("acme-openai")),  # a file key's name
            (digest(dropped).encode(), GATEWAY_KEY.header + b"\x02"),  # truncated body
            (digest(good).encode(), value("good")),
        ],
    )
    async with gateway_stack(kafka_bootstrap, topics, tmp_path) as stack:
        caplog.set_level(logging.WARNING, logger="spendbus.gateway.keys")
        follower = KeysTopicFollower(
            kafka_bootstrap,
            topics.gateway_keys,
            stack.gateway.keys,
            config,
            registry=stack.gateway.metrics.registry,
        )
        async with follower:
            await follower.wait_ready(30)
            assert dict(follower.skipped) == {
                "bad_magic": 1,
                "bad_key": 1,
                "wrong_schema": 1,
                "unknown_secret": 1,
                "invalid": 1,
                "shadowed_by_file": 1,
                "name_conflict": 1,
                "malformed": 1,
            }
            assert set(follower.topic_keys) == {keyed(good)}
            assert await chat(stack.url, good) == 200
            assert await chat(stack.url, dropped) == 401  # its last record is unusable
            assert await chat(stack.url, "vk-clash-0123456789") == 401
            events = await stack.events(1)
            assert events[0]["org_id"] == "globex"
            # the file's key keeps the file's principal
            assert stack.gateway.keys.lookup(file_key).principal.org_id == "acme"  # type: ignore[union-attr]  # the file's key is known: found
            logged = " ".join(r.getMessage() for r in caplog.records)
            for reason in ("bad_magic", "bad_key", "wrong_schema", "unknown_secret", "malformed"):
                assert f"({reason})" in logged
            assert "no secret named 'sk-none'" in logged and "field 'org_id'" in logged
            assert "no longer works" in logged and "vk-" not in logged
            async with (
                aiohttp.ClientSession() as session,
                session.get(f"{stack.url}/metrics") as resp,
            ):
                metrics = await resp.text()
            assert 'spendbus_gateway_keys_topic_records_total{result="bad_magic"} 1.0' in metrics
            # `keys list` names the unreadable records; `keys revoke` removes one by its hash
            garbage = digest("vk-garbage-0123456789")
            listed = await keys_cli_async(kafka_bootstrap, topics, "list")
            assert f"record {garbage[:12]}:" in listed.output and "bad_magic" in listed.output
            revoked = await keys_cli_async(kafka_bootstrap, topics, "revoke", garbage)
            assert revoked.exit_code == 0 and "unreadable record" in revoked.output
            live = await read_latest_values(kafka_bootstrap, topics.gateway_keys)
            assert live[garbage.encode()] is None
            # still following: a later key applies
            await publish(
                kafka_bootstrap, topics.gateway_keys, [(digest(later).encode(), value("later"))]
            )
            await until(lambda: follower.applied == 3)
            assert await chat(stack.url, later) == 200


async def test_the_command_listens_only_once_caught_up(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """`spendbus gateway run`'s composition: a key applied before start works on the very first
    request, and a missing keys topic stops the start with its name."""
    many = [entry(f"bulk-{i}", strong(f"bulk-{i}")) for i in range(300)]
    path = write(tmp_path, many)
    assert (await keys_cli_async(kafka_bootstrap, topics, "apply", str(path))).exit_code == 0
    async with FakeUpstream(FakeUpstreamConfig(port=0)) as upstream:
        data = gateway_config(
            upstream.url,
            kafka={"bootstrap": kafka_bootstrap, "topic_prefix": topics.prefix},
            publisher={"spool_dir": str(tmp_path / "spool")},
            keys_topic={"follow": True, "ready_timeout_s": 30},
        )
        config = parse_config(data, "gateway.yaml")
        enforcer_config, publisher_config = compose_configs(config, "gateway.yaml")
        async with serving(config, enforcer_config, publisher_config, 60) as url:
            assert await chat(url, strong("bulk-299")) == 200
            assert await chat(url, strong("bulk-0")) == 200


async def test_a_missing_topic_or_a_follower_not_started_is_named(
    kafka_bootstrap: str, topics: Topics
) -> None:
    config = parse_config(gateway_config("http://127.0.0.1:9"), "test")
    absent = f"{topics.prefix}absent.gateway.keys"
    follower = KeysTopicFollower(kafka_bootstrap, absent, KeyStore(), config)
    with pytest.raises(KeysNotReady, match="not started"):
        await follower.wait_ready(0.1)
    with pytest.raises(ConfigError, match=f"topic '{absent}' does not exist"):
        await follower.start()


async def test_ready_only_once_every_record_up_to_the_start_end_offsets_is_applied(
    kafka_bootstrap: str, topics: Topics
) -> None:
    """More than one fetch of records (a partition fetch is at most 1 MiB): ready must wait for
    all of them, and the store holds every key the moment wait_ready returns."""
    from datetime import UTC, datetime

    config = parse_config(gateway_config("http://127.0.0.1:9"), "test")
    now = datetime.now(UTC)
    count = 15_000
    records = [
        (
            digest(f"vk-bulk-{i:06d}-0123456789").encode(),
            GATEWAY_KEY.encode(
                key_record(VirtualKey(**entry(f"bulk-{i}", f"vk-bulk-{i:06d}-0123456789")), now)
            ),
        )
        for i in range(count)
    ]
    assert sum(len(k) + len(v) for k, v in records) > 1024 * 1024
    await publish(kafka_bootstrap, topics.gateway_keys, records)
    store = KeyStore()
    async with KeysTopicFollower(kafka_bootstrap, topics.gateway_keys, store, config) as follower:
        await follower.wait_ready(60)
        assert len(store) == count and follower.applied == count
        assert store.lookup(f"vk-bulk-{count - 1:06d}-0123456789") is not None


def test_the_shipped_example_keys_fit_the_example_gateway() -> None:
    from ingest.gateway import load_config, parse_key_entries

    infra = Path(__file__).resolve().parents[2] / "infra" / "gateway"
    gateway = load_config(infra / "gateway.example.yaml")
    keys_file = infra / "keys.example.yaml"
    entries = parse_key_entries(yaml.safe_load(keys_file.read_text()), str(keys_file))
    assert entries and all(vk.principal.secret_id in gateway.secrets for vk in entries)
    assert not {vk.name for vk in entries} & {vk.name for vk in gateway.keys}
