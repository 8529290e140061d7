"""Who may use the sidecar (issue 32, item 4): a token by default (made on first start,
0600), a unix socket fenced by its permissions, or ``--insecure-loopback`` said out loud;
hold ids that are opaque, random and good only for the caller that took them."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import stat
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import BaseTestServer, TestClient, TestServer
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from click.testing import CliRunner

from enforcer import Enforcer, EnforcerConfig, Sidecar, create_app
from enforcer.sidecar import create_server
from enforcer.sidecar_routes import HOLD_ID_BYTES, HoldIds
from schemas.codec import BUDGET_POLICY, PRICE_TABLE, USAGE_EVENT, VERDICT
from schemas.errors import ConfigError
from schemas.topics import Topics
from tests.enforcer.kit import NOW, PRICES, FakeClock, budget, loaded_enforcer, verdict

#: the ``two_callers`` fixture: a test client, the enforcer behind it and its clock
TwoCallers = tuple[TestClient[web.Request, None], Enforcer, FakeClock]

USD = 1_000_000_000
ANN, BOB = "token-of-ann-0123456789abcdef", "token-of-bob-0123456789abcdef"
AS_ANN = {"Authorization": f"Bearer {ANN}"}
AS_BOB = {"Authorization": f"Bearer {BOB}"}
ORG = budget("org", limit_usd=100)
CTX = {
    "org_id": "acme",
    "secret_id": "sk-1",
    "model": "claude-sonnet-4-5",
    "input_tokens": 1000,
    "max_output_tokens": 1000,
}
USAGE = {"model": "claude-sonnet-4-5", "occurred_at": "2026-11-30T12:00:01Z", "input_tokens": 5}


class SidecarServer(BaseTestServer):
    """What ``serve`` runs (create_server), as a test server."""

    def __init__(self, enforcer: Enforcer) -> None:
        super().__init__()
        self.enforcer = enforcer

    async def _make_runner(self, **kwargs: Any) -> web.ServerRunner:
        return web.ServerRunner(create_server(self.enforcer), **kwargs)


@pytest.fixture(params=["server", "app"])
async def two_callers(
    request: pytest.FixtureRequest,
) -> AsyncIterator[tuple[TestClient[web.Request, None], Enforcer, FakeClock]]:
    """A sidecar that accepts two tokens (ann's, bob's), served both ways."""
    e, clock = loaded_enforcer(
        [ORG],
        [verdict(ORG, ["acme"])],
        sidecar_token=ANN,
        sidecar_tokens=(BOB,),
        hold_timeout_s=60,
    )
    server: BaseTestServer = (
        SidecarServer(e) if request.param == "server" else TestServer(create_app(e))
    )
    client: TestClient[web.Request, None] = TestClient(server)
    async with client as c:
        yield c, e, clock


async def _hold(c: TestClient[web.Request, None], headers: dict[str, str]) -> str:
    r = await c.post("/v1/check", json=CTX, headers=headers)
    assert r.status == 200
    hold = (await r.json())["hold_id"]
    assert isinstance(hold, str)
    return hold


async def _settle(
    c: TestClient[web.Request, None], headers: dict[str, str], body: dict[str, Any]
) -> tuple[int, Any]:
    r = await c.post("/v1/settle", json=body, headers=headers)
    return r.status, await r.json()


async def test_a_hold_is_settled_or_released_only_by_the_caller_that_took_it(
    two_callers: TwoCallers,
) -> None:
    c, e, _ = two_callers
    anns = await _hold(c, AS_ANN)
    held = e.holds.held_nanos
    never = await _settle(c, AS_ANN, {"hold_id": "x" * 22, "release": True})
    assert never[0] == 404 and never[1]["error"] == "unknown_hold"
    # bob knows ann's id (leaked, logged...): he can neither release nor settle it, and
    # gets the very answer of an id that was never given
    assert await _settle(c, AS_BOB, {"hold_id": anns, "release": True}) == never
    assert await _settle(c, AS_BOB, {"hold_id": anns, "usage": USAGE}) == never
    assert len(e.holds) == 1 and e.holds.held_nanos == held
    # ann still can
    assert await _settle(c, AS_ANN, {"hold_id": anns, "usage": USAGE}) == (200, {"settled": True})
    assert e.holds.held_nanos == 5 * 3_000
    # and bob's own holds are his
    bobs = await _hold(c, AS_BOB)
    assert (await _settle(c, AS_ANN, {"hold_id": bobs, "release": True}))[0] == 404
    status, answer = await _settle(c, AS_BOB, {"hold_id": bobs, "release": True})
    assert (status, answer) == (200, {"settled": False, "released": True})
    # released: forgotten, a second release is the unknown id's 404
    assert await _settle(c, AS_BOB, {"hold_id": bobs, "release": True}) == never


async def test_hold_ids_are_random_opaque_strings_not_the_enforcers_counter(
    two_callers: TwoCallers,
) -> None:
    c, e, _ = two_callers
    ids = [await _hold(c, AS_ANN) for _ in range(100)]
    assert len(set(ids)) == len(ids)
    for wire in ids:
        raw = base64.urlsafe_b64decode(wire + "==")
        assert len(raw) == HOLD_ID_BYTES  # 128 random bits each
    # the enforcer's own ids are 1, 2, 3, ...: none of them names a hold on the wire
    for guess in [*(str(i) for i in range(1, 120)), *(str(i).zfill(22) for i in range(1, 5))]:
        assert (await _settle(c, AS_ANN, {"hold_id": guess, "release": True}))[0] == 404
    for number in (1, 2, 50):
        assert (await _settle(c, AS_ANN, {"hold_id": number, "release": True}))[0] == 400
    assert len(e.holds) == 100
    # consecutive ids share nothing a counter would leave (no common prefix beyond chance)
    prefixes = {wire[:4] for wire in ids}
    assert len(prefixes) > 90


async def test_expired_holds_forget_their_ids_and_the_ids_kept_are_bounded(
    two_callers: TwoCallers,
) -> None:
    c, e, clock = two_callers
    old = [await _hold(c, AS_ANN) for _ in range(50)]
    clock.advance(61)  # past hold_timeout_s: the follower's sweep drops them
    e.holds.expire(int(clock() * 1_000_000))
    assert len(e.holds) == 0
    for wire in old[:5]:
        assert (await _settle(c, AS_ANN, {"hold_id": wire, "usage": USAGE}))[0] == 404
    fresh = await _hold(c, AS_ANN)
    assert (await _settle(c, AS_ANN, {"hold_id": fresh, "release": True}))[0] == 200

    # the same, counted: ids kept = holds in flight (+ those expired since the last check)
    ids = HoldIds(e.holds)
    for _ in range(3):
        for _ in range(200):
            d = e.check(loaded_ctx())
            assert d.hold_id is not None
            ids.issue(d.hold_id, "ann")
        assert len(ids) <= 201 and len(e.holds) == 200
        clock.advance(61)
        e.holds.expire(int(clock() * 1_000_000))
    d = e.check(loaded_ctx())
    assert d.hold_id is not None
    ids.issue(d.hold_id, "ann")
    assert len(ids) == 1


def loaded_ctx() -> Any:
    from enforcer import Context

    return Context.from_mapping(CTX)


async def test_the_sidecar_will_not_listen_open_unless_told() -> None:
    sidecar = Sidecar(EnforcerConfig(sidecar_port=0))
    with pytest.raises(ConfigError, match="needs a bearer token"):
        await sidecar.start()  # refused before it reads anything or listens
    with pytest.raises(Exception, match="both set"):
        EnforcerConfig(sidecar_token="t", sidecar_insecure_loopback=True)
    with pytest.raises(Exception, match="sidecar_token is required"):
        EnforcerConfig(sidecar_host="0.0.0.0", sidecar_insecure_loopback=True)


def test_serve_refuses_contradictions_and_a_token_file_others_may_read(tmp_path: Path) -> None:
    from spendbus.cli import cli

    runner = CliRunner()
    home = tmp_path / "home"
    env = {"SPENDBUS_HOME": str(home), "KAFKA_BOOTSTRAP": "127.0.0.1:1"}
    off = runner.invoke(
        cli, ["enforcer", "serve", "--insecure-loopback", "--host", "0.0.0.0"], env=env
    )
    assert off.exit_code == 2 and "only on loopback" in off.output
    both = runner.invoke(
        cli,
        ["enforcer", "serve", "--insecure-loopback"],
        env={**env, "SPENDBUS_ENFORCER_TOKEN": "s3cret-in-env"},
    )
    assert both.exit_code == 2 and "keep one" in both.output
    assert "s3cret-in-env" not in both.output
    home.mkdir()
    token_file = home / "enforcer.token"
    token_file.write_text("readable-by-all\n")
    token_file.chmod(0o644)
    loose = runner.invoke(cli, ["enforcer", "serve"], env=env)
    assert loose.exit_code == 2 and f"chmod 600 {token_file.resolve()}" in loose.output
    assert "readable-by-all" not in loose.output


# --- on the broker, as `spendbus enforcer serve` runs ------------------------------------


async def _seed(bootstrap: str, topics: Topics) -> None:
    """acme has spent its lifetime budget (its checks are refused); globex has not."""
    lifetime = budget("lifetime", window="total", limit_usd=1)
    broke = verdict(lifetime, ["acme"], spent_nanos=USD)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for topic, key, value in (
            (topics.budget_policies, "lifetime", BUDGET_POLICY.encode(lifetime.to_record(NOW))),
            (topics.pricing, PRICES.version, PRICE_TABLE.encode(PRICES.to_record())),
            (topics.budget_verdicts, broke["counter_key"], VERDICT.encode(broke)),
        ):
            await producer.send_and_wait(topic, value, key=key.encode())
    finally:
        await producer.stop()


class Serving:
    """``spendbus enforcer serve ARGS`` in a process; ``line`` is its "listening" line."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.args, self.env, self.log = args, env, log
        self.line: dict[str, Any] = {}

    async def __aenter__(self) -> Serving:
        code = f"from spendbus.cli import cli; cli(['enforcer', 'serve', *{self.args!r}])"
        self.out = self.log.open("wb")
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", code, env={**os.environ, **self.env}, stderr=self.out
        )
        deadline = time.monotonic() + 90  # a guard against a hang, not a measurement
        while not self.line:
            assert self.proc.returncode is None, self.log.read_text()
            assert time.monotonic() < deadline, self.log.read_text()
            for text in self.log.read_text().splitlines():
                if text.startswith('{"listening"'):
                    self.line = json.loads(text)
            await asyncio.sleep(0.1)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(self.proc.wait(), 30)
        self.out.close()


async def _ready(http: aiohttp.ClientSession, url: str) -> None:
    for _ in range(600):
        if (await http.get(f"{url}/readyz")).status == 200:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the sidecar never became ready")


async def _refusals_on_usage_raw(bootstrap: str, topic: str, want: int) -> list[dict[str, Any]]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(4)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        out: list[dict[str, Any]] = []
        deadline = time.monotonic() + 30  # a guard, not a measurement
        while len(out) < want and time.monotonic() < deadline:
            for messages in (await consumer.getmany(timeout_ms=200)).values():
                out.extend(USAGE_EVENT.decode(m.value) for m in messages)
        return out
    finally:
        await consumer.stop()


async def test_serve_makes_its_token_on_first_start_and_answers_401_without_it(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """The matrix: no token / a wrong one / the one in <home>/enforcer.token, each route."""
    await _seed(kafka_bootstrap, topics)
    home = tmp_path / "home"
    env = {
        "KAFKA_BOOTSTRAP": kafka_bootstrap,
        "SPENDBUS_TOPIC_PREFIX": topics.prefix,
        "SPENDBUS_HOME": str(home),
    }
    log = tmp_path / "serve.log"
    async with Serving(["--port", "0"], env, log) as serving, aiohttp.ClientSession() as http:
        url = serving.line["listening"]
        token_file = Path(serving.line["token_file"])
        assert token_file == (home / "enforcer.token").resolve()
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = token_file.read_text().strip()
        assert len(token) >= 43
        await _ready(http, url)
        right = {"Authorization": f"Bearer {token}"}
        wrong = {"Authorization": f"Bearer {token[:-1]}x"}
        allowed = {**CTX, "org_id": "globex"}
        refused = {**CTX, "org_id": "acme"}
        # a hold the right caller took, for the settle routes
        hold = (await (await http.post(f"{url}/v1/check", json=allowed, headers=right)).json())[
            "hold_id"
        ]
        query = {"org_id": "acme", "secret_id": "sk-1"}
        routes: list[tuple[str, str, dict[str, Any] | None, dict[str, str] | None]] = [
            ("POST", "/v1/check", allowed, None),
            ("POST", "/v1/check", {**allowed, "reserve": False}, None),
            ("POST", "/v1/check", refused, None),  # a refusal: published when authorized
            ("POST", "/v1/settle", {"hold_id": hold, "usage": USAGE}, None),
            ("POST", "/v1/settle", {"hold_id": hold, "release": True}, None),
            ("GET", "/v1/usage", None, query),
            ("GET", "/v1/spend", None, query),
        ]
        for headers in ({}, wrong, {"Authorization": token}, {"Authorization": f"Basic {token}"}):
            for method, path, body, params in routes:
                r = await http.request(
                    method, url + path, json=body, params=params, headers=headers
                )
                assert r.status == 401, (method, path, headers.keys(), await r.text())
                assert r.headers["WWW-Authenticate"] == "Bearer"
        metrics = await (await http.get(f"{url}/metrics")).text()
        assert 'spendbus_enforcer_refusals_published_total{result="ok"} 1.0' not in metrics
        assert 'budget="lifetime",outcome="refused"' not in metrics  # nothing was decided
        # with the token: every route answers
        answers = []
        for method, path, body, params in routes:
            r = await http.request(method, url + path, json=body, params=params, headers=right)
            answers.append((r.status, await r.json()))
        assert [status for status, _ in answers] == [200, 200, 200, 200, 404, 200, 200]
        assert answers[0][1]["allowed"] and isinstance(answers[0][1]["hold_id"], str)
        assert not answers[2][1]["allowed"] and answers[2][1]["published"]
        assert answers[3][1] == {"settled": True}
        assert answers[4][1]["error"] == "unknown_hold"  # settled just before
        assert answers[5][1]["counters"][0]["budget_id"] == "lifetime"
        for path in ("/healthz", "/readyz", "/metrics"):
            assert (await http.get(url + path)).status == 200
        metrics = await (await http.get(f"{url}/metrics")).text()
        assert 'spendbus_enforcer_refusals_published_total{result="ok"} 1.0' in metrics
    events = await _refusals_on_usage_raw(kafka_bootstrap, topics.usage_raw, 1)
    assert [(e["org_id"], e["outcome"]) for e in events] == [("acme", "refused")]
    # the path is said, the token never
    text = log.read_text()
    assert str(token_file) in text and token not in text
    # a second start reads the same file: the clients' token stays good
    second_log = tmp_path / "serve-again.log"
    async with Serving(["--port", "0"], env, second_log) as again, aiohttp.ClientSession() as http:
        assert Path(again.line["token_file"]) == token_file
        assert token_file.read_text().strip() == token
        await _ready(http, again.line["listening"])
        r = await http.post(again.line["listening"] + "/v1/check", json=allowed, headers=right)
        assert r.status == 200
    assert token not in second_log.read_text()


async def test_insecure_loopback_serves_without_a_token_and_warns(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    await _seed(kafka_bootstrap, topics)
    home = tmp_path / "home"
    env = {
        "KAFKA_BOOTSTRAP": kafka_bootstrap,
        "SPENDBUS_TOPIC_PREFIX": topics.prefix,
        "SPENDBUS_HOME": str(home),
    }
    log = tmp_path / "serve.log"
    args = ["--port", "0", "--insecure-loopback", "--no-publish-refusals"]
    async with Serving(args, env, log) as serving, aiohttp.ClientSession() as http:
        url = serving.line["listening"]
        assert "token_file" not in serving.line
        await _ready(http, url)
        r = await http.post(f"{url}/v1/check", json={**CTX, "org_id": "globex"})
        assert r.status == 200 and (await r.json())["allowed"]
    warnings = [line for line in log.read_text().splitlines() if " WARNING " in line]
    assert any("insecure loopback" in line for line in warnings), log.read_text()
    assert not (home / "enforcer.token").exists()


async def test_a_unix_socket_sidecar_is_fenced_by_its_permissions(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    await _seed(kafka_bootstrap, topics)
    path = tmp_path / "run" / "enforcer.sock"
    config = EnforcerConfig(
        bootstrap=kafka_bootstrap,
        topic_prefix=topics.prefix,
        sidecar_unix=str(path),
        publish_refusals=False,
    )
    sidecar = Sidecar(config)
    await sidecar.start()
    try:
        assert stat.S_ISSOCK(path.lstat().st_mode)
        assert stat.S_IMODE(path.lstat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        await sidecar.enforcer.wait_ready(60)
        connector = aiohttp.UnixConnector(path=str(path))
        async with aiohttp.ClientSession(connector=connector) as http:
            r = await http.post("http://sidecar/v1/check", json={**CTX, "org_id": "globex"})
            answer = await r.json()
            assert r.status == 200 and answer["allowed"]
            r = await http.post(
                "http://sidecar/v1/settle", json={"hold_id": answer["hold_id"], "release": True}
            )
            assert (await r.json())["released"]
    finally:
        await sidecar.stop()
    assert not path.exists()
    # a file that is not a socket is never replaced
    path.write_text("not a socket")
    with pytest.raises(ConfigError, match="not a socket"):
        await Sidecar(config).start()
    assert path.read_text() == "not a socket"
