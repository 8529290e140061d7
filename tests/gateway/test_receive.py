"""What the gateway refuses to receive: slow heads and bodies, bodies over the limit; and
the upstream pool it keeps bounded. Nothing refused reaches the provider or is charged."""

from __future__ import annotations

from pathlib import Path

import pytest

from ingest.gateway import parse_config
from schemas.topics import Topics
from tests.gateway.kit import gateway_stack, request_for
from tests.slow_sender import head, send_then_stall

pytestmark = pytest.mark.integration


async def test_a_slow_sender_is_cut_off_and_costs_nothing(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    async with gateway_stack(
        kafka_bootstrap,
        topics,
        tmp_path,
        gateway={"header_timeout_s": 0.2, "body_timeout_s": 0.2, "max_body_bytes": 64 * 1024},
    ) as stack:
        path, _, key = request_for("openai-chat", False)
        auth = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        # a head that never ends: the connection is closed, nothing answered
        assert await send_then_stall(stack.url, f"POST {path} HTTP/1.1\r\n".encode()) == b""
        # a body that never ends: 408 in the provider's error shape, the connection closed
        answer = await send_then_stall(
            stack.url, head("POST", path, {**auth, "Content-Length": "900"}) + b'{"model": "g'
        )
        assert answer.startswith(b"HTTP/1.1 408"), answer[:300]
        assert b"invalid_request_error" in answer and b"not received within 0.2 s" in answer
        # a body declared over the limit: 413 at once, without reading it
        answer = await send_then_stall(
            stack.url, head("POST", path, {**auth, "Content-Length": str(10**9)})
        )
        assert answer.startswith(b"HTTP/1.1 413"), answer[:300]
        assert b"1000000000 bytes is over the 65536-byte limit" in answer
        assert not stack.upstream.stats.routes  # the provider saw none of it
        assert len(stack.enforcer.holds) == 0
        counted = stack.gateway.metrics.requests
        assert counted.labels("openai", "body_408")._value.get() == 1
        assert counted.labels("openai", "body_413")._value.get() == 1


async def test_the_upstream_pool_is_bounded(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    async with gateway_stack(
        kafka_bootstrap, topics, tmp_path, gateway={"max_upstream_connections": 3}
    ) as stack:
        connector = stack.gateway.client.connector
        assert connector is not None and connector.limit == 3
    default = parse_config({"upstreams": {}, "secrets": {}})
    assert 0 < default.max_upstream_connections < 100_000  # never unbounded (aiohttp's 0)
