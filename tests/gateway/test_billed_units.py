"""Billed units end to end through the gateway: the fake Anthropic answers with server web
searches, the tap counts them, the published UsageEvent (v2) carries them, priced per
unit by the price table."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import pytest

from schemas.pricing import PriceBook, PriceTable
from schemas.topics import Topics
from spendbus.fake_upstream import FakeUpstreamConfig
from tests.gateway.kit import gateway_stack, request_for

pytestmark = pytest.mark.integration


async def test_server_web_searches_reach_the_ledger_and_are_priced_per_unit(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    async with gateway_stack(
        kafka_bootstrap, topics, tmp_path, upstream=FakeUpstreamConfig(port=0, seed=5)
    ) as stack:
        async with aiohttp.ClientSession() as session:
            for stream in (False, True):
                path, body, key = request_for("anthropic-messages", stream)
                body["tools"] = [{"type": "web_search_20250305", "name": "web_search"}]
                headers = {"x-api-key": key, "anthropic-version": "2023-06-01"}
                async with session.post(stack.url + path, json=body, headers=headers) as resp:
                    assert resp.status == 200, await resp.text()
                    await resp.read()
        events = await stack.events(2)
    assert [e["units"] for e in events] == [{"web_search": 1}, {"web_search": 1}]
    assert all(e["usage_source"] == "reported" for e in events)
    table = PriceTable.from_record(
        {
            "version": "t",
            "effective_from": datetime(2020, 1, 1, tzinfo=UTC),
            "models": [
                {
                    "match": "claude-sonnet-4-5",
                    "input_per_mtok": "3",
                    "output_per_mtok": "15",
                    "unit_prices": {"web_search": "0.01"},
                }
            ],
        }
    )
    book = PriceBook([table])
    for e in events:
        assert e["cache_read_tokens"] == e["cache_write_tokens"] == 0  # no cache_ratio
        tokens = e["input_tokens"] * 3_000 + e["output_tokens"] * 15_000
        assert book.price_event(e).cost_nanos == tokens + 10_000_000  # + $0.01 a search


async def test_the_worst_case_holds_a_server_tools_max_uses(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """Org "broke" has $5 and nothing spent: 600 web searches at most ($6 at the shipped
    $0.01) cannot fit whatever the tokens, so the request is refused before it is sent;
    5 searches at most fit."""
    from tests.gateway.kit import KEY_OF

    async with gateway_stack(
        kafka_bootstrap, topics, tmp_path, upstream=FakeUpstreamConfig(port=0, seed=5)
    ) as stack:
        async with aiohttp.ClientSession() as session:
            path, body, _ = request_for("anthropic-messages", False)
            headers = {"x-api-key": KEY_OF["sk-anthropic-broke"], "anthropic-version": "2023-06-01"}
            statuses = []
            for uses in (600, 5):
                body["tools"] = [
                    {"type": "web_search_20250305", "name": "web_search", "max_uses": uses}
                ]
                async with session.post(stack.url + path, json=body, headers=headers) as resp:
                    statuses.append((resp.status, await resp.json()))
        stats = await stack.upstream_stats()
    (refused, answer), (allowed, _) = statuses
    assert (refused, allowed) == (402, 200)
    assert answer["reason"] == "request_too_large"
    assert answer["request_nanos"] > 6_000_000_000
    assert stats["requests"] == 1  # the refused request never reached the provider


async def test_a_gemini_tier_named_in_the_response_header_reaches_the_ledger(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """The fake Gemini answers as Google does, naming the tier that served the call in
    x-gemini-service-tier (the one asked for, else standard): the gateway's tap reads the
    header and the published UsageEvent carries the tier, priced at it."""
    async with gateway_stack(
        kafka_bootstrap, topics, tmp_path, upstream=FakeUpstreamConfig(port=0, seed=5)
    ) as stack:
        async with aiohttp.ClientSession() as session:
            for stream, tier in ((False, "flex"), (True, "SERVICE_TIER_FLEX"), (False, None)):
                path, body, key = request_for("gemini", stream)
                if tier is not None:
                    body["service_tier"] = tier
                headers = {"x-goog-api-key": key}
                async with session.post(stack.url + path, json=body, headers=headers) as resp:
                    assert resp.status == 200, await resp.text()
                    assert resp.headers["x-gemini-service-tier"] == (
                        "standard" if tier is None else "flex"
                    )
                    await resp.read()
        events = await stack.events(3)
    assert sorted(str(e["service_tier"]) for e in events) == ["flex", "flex", "standard"]
    table = PriceTable.from_record(
        {
            "version": "t",
            "effective_from": datetime(2020, 1, 1, tzinfo=UTC),
            "models": [
                {
                    "match": "gemini-2.5-flash",
                    "input_per_mtok": "0.30",
                    "output_per_mtok": "2.50",
                    "service_tiers": {"flex": "0.5"},
                }
            ],
        }
    )
    book = PriceBook([table])
    for e in events:
        assert e["cache_read_tokens"] == 0  # no cache_ratio
        tokens = e["input_tokens"] * 300 + e["output_tokens"] * 2_500  # nanos, standard
        want = tokens // 2 if e["service_tier"] == "flex" else tokens  # both even: exact
        assert book.price_event(e).cost_nanos == want
