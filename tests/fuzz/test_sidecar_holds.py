"""The fuzz suite, the sidecar's hold ids (issue 32): ``spendbus enforcer serve`` with two
callers' tokens gets ``SPENDBUS_FUZZ_EXAMPLES`` settles and releases with hostile hold ids
(guesses, numbers, the other caller's real ids, huge and odd strings, no token, a wrong
one). No answer is >= 500, no caller's hold is touched by anyone else, and each caller
still settles its own afterwards."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from hypothesis import given
from hypothesis import strategies as st

from schemas.budgets import Budget
from schemas.codec import BUDGET_POLICY, PRICE_TABLE
from schemas.periods import parse_window
from schemas.pricing import ModelPrice, PriceTable
from schemas.topics import Topics
from spendbus.stack.broker_probe import free_port
from tests.fuzz.kit import EXAMPLES, FUZZ, GUARD_S, command, get

pytestmark = [pytest.mark.integration, pytest.mark.fuzz, pytest.mark.timeout(GUARD_S)]

ANN = "fuzz-ann-0123456789abcdef0123456789"
BOB = "fuzz-bob-0123456789abcdef0123456789"
CTX = {"org_id": "acme", "secret_id": "sk-1", "model": "claude-sonnet-4-5", "input_tokens": 10}


def post(url: str, body: Any, token: str | None) -> tuple[int, Any]:
    data = json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


async def seed(bootstrap: str, topics: Topics) -> None:
    """A budget every check of acme holds against, and the prices to hold by."""
    org = Budget(budget_id="org", scope="org", window=parse_window("month"), limit_nanos=10**12)
    prices = PriceTable(
        version="2026-01-01",
        effective_from=datetime(2026, 1, 1, tzinfo=UTC),
        models=(ModelPrice.of("claude-sonnet-4-5", "3", "15"),),
    )
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        now = datetime.now(UTC)
        await producer.send_and_wait(
            topics.budget_policies, BUDGET_POLICY.encode(org.to_record(now)), key=b"org"
        )
        await producer.send_and_wait(
            topics.pricing, PRICE_TABLE.encode(prices.to_record()), key=prices.version.encode()
        )
    finally:
        await producer.stop()


def test_hold_ids_cannot_be_guessed_or_borrowed(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    asyncio.run(seed(kafka_bootstrap, topics))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    token_file = tmp_path / "sidecar.tokens"
    token_file.write_text(f"{ANN}\n# bob's proxy\n{BOB}\n")
    token_file.chmod(0o600)
    env = {
        "KAFKA_BOOTSTRAP": kafka_bootstrap,
        "SPENDBUS_TOPIC_PREFIX": topics.prefix,
        "SPENDBUS_HOME": str(tmp_path / "home"),
    }
    args = ["enforcer", "serve", "--port", str(port), "--token-file", str(token_file)]
    with command(args, env, f"{url}/readyz", tmp_path / "sidecar.log"):
        held: dict[str, list[str]] = {ANN: [], BOB: []}
        for token in (ANN, BOB):
            for _ in range(5):
                status, answer = post(f"{url}/v1/check", CTX, token)
                assert status == 200 and answer["allowed"], answer
                assert isinstance(answer["hold_id"], str), answer
                held[token].append(answer["hold_id"])
        real = held[ANN] + held[BOB]
        statuses: list[int] = []

        @FUZZ
        @given(
            hold=st.sampled_from(real).map(lambda h: ("other", h))
            | st.text(max_size=40).map(lambda h: ("guess", h))
            | st.integers(0, 20).map(lambda h: ("guess", str(h)))
            | st.integers().map(lambda h: ("number", h))
            | st.sampled_from([None, [], {}, 1.5, True, "x" * 100_000]).map(lambda h: ("odd", h)),
            as_=st.sampled_from([ANN, BOB, None, "wrong"]),
            release=st.booleans(),
        )
        def one(hold: tuple[str, Any], as_: str | None, release: bool) -> None:
            kind, hold_id = hold
            if kind == "other":  # a real id, sent by whoever does not own it
                owner = ANN if hold_id in held[ANN] else BOB
                if as_ == owner:
                    as_ = BOB if owner == ANN else ANN
            body: dict[str, Any] = {"hold_id": hold_id}
            if release:
                body["release"] = True
            else:
                body["usage"] = {"model": "claude-sonnet-4-5", "input_tokens": 1}
            status, answer = post(f"{url}/v1/settle", body, as_)
            statuses.append(status)
            assert status < 500, (body, answer)
            assert status in (400, 401, 404), (kind, as_, status, answer)

        one()
        assert len(statuses) >= EXAMPLES
        assert get(f"{url}/healthz") == 200
        # nobody's hold was settled or released by another: each owner releases all of its
        for token, ids in held.items():
            for hold_id in ids:
                status, answer = post(
                    f"{url}/v1/settle", {"hold_id": hold_id, "release": True}, token
                )
                assert (status, answer) == (200, {"settled": False, "released": True})
