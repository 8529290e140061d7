"""The demo's traffic: its principals and models, the gateway configured in front of the
fake providers, the clients calling it with virtual keys, and the demo's own ledger of
what was sent (the independent side of every check)."""

from __future__ import annotations

import contextlib
import random
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from enforcer import Enforcer
from ingest.gateway import Gateway
from ingest.publisher import UsagePublisher
from schemas.pricing import PriceBook
from schemas.records import UsageEvent
from spendbus.fake_upstream import FakeUsage, build_request
from spendbus.fake_upstream.billing import BillingLedger

EXHAUSTED_SECRET = ("initech", "sk-initech-intern")
#: requests in flight at once through the gateway
CLIENTS = 8
#: (org, secret, users, weight)
PRINCIPALS = [
    ("acme", "sk-acme-prod", ["ana@acme.io", "raj@acme.io"], 5),
    ("acme", "sk-acme-batch", ["batch-runner"], 3),
    ("globex", "sk-globex-search", ["li@globex.com", "sam@globex.com"], 4),
    ("globex", "sk-globex-support", ["support-bot"], 2),
    ("initech", "sk-initech-prod", ["peter@initech.com"], 2),
    ("initech", "sk-initech-intern", ["intern@initech.com"], 2),
]
#: (api format, provider, model, weight)
MODELS = [
    ("anthropic-messages", "anthropic", "claude-sonnet-4-5-20250929", 5),
    ("anthropic-messages", "anthropic", "claude-haiku-4-5-20251001", 3),
    ("openai-chat", "openai", "gpt-4o-2024-11-20", 3),
    ("openai-chat", "openai", "gpt-4o-mini", 3),
    ("openai-responses", "openai", "gpt-5-2025-08-07", 2),
    ("openai-responses", "openai", "o4-mini", 1),
    ("gemini", "gemini", "gemini-2.5-flash", 3),
    ("gemini", "gemini", "gemini-2.5-pro", 1),
    ("bedrock-converse", "bedrock", "anthropic.claude-sonnet-4-5-20250929-v1:0", 2),
]


@dataclass
class Ledger:
    """What the demo itself sent: the independent side of every check."""

    sent_unique: int = 0
    duplicates: int = 0
    refused: int = 0
    estimated: int = 0
    expected_nanos: int = 0
    per_principal: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    refused_by: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    #: the exhausted secret's answer at the end: (status, body, headers)
    final_refusal: tuple[int, dict[str, Any] | None, dict[str, str]] = (0, None, {})
    #: per (org, secret): the secret-monthly spend the enforcer's verdicts show at the end
    verdict_nanos: dict[tuple[str, str], int] = field(default_factory=dict)
    #: the fake providers' own bill of the calls they served (reconciled at the end)
    billing: BillingLedger | None = None


def pick(rng: random.Random, items: list[tuple[Any, ...]]) -> tuple[Any, ...]:
    return rng.choices(items, weights=[i[-1] for i in items])[0]


def fake_usage(rng: random.Random, fmt: str) -> FakeUsage:
    input_tokens = int(rng.lognormvariate(7.5, 1.0))  # median ~1.8k, long tail
    output_tokens = max(1, int(rng.lognormvariate(5.5, 0.9)))  # median ~250
    cache_read = cache_write = cache_write_1h = reasoning = 0
    if fmt in ("anthropic-messages", "bedrock-converse") and rng.random() < 0.4:
        cache_read = int(rng.lognormvariate(8.5, 0.8))
        if rng.random() < 0.3:
            cache_write = int(rng.lognormvariate(7.0, 0.8))
            if fmt == "anthropic-messages" and rng.random() < 0.3:
                cache_write_1h = cache_write // 2
    elif fmt in ("openai-chat", "openai-responses", "gemini") and rng.random() < 0.3:
        cache_read = int(rng.lognormvariate(7.5, 0.8))
    if fmt in ("openai-responses", "gemini") and rng.random() < 0.5:
        reasoning = int(rng.lognormvariate(6.0, 0.8))
        output_tokens += reasoning
    return FakeUsage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cache_read_tokens=cache_read,
        cache_write_tokens=cache_write,
        cache_write_1h_tokens=cache_write_1h,
        reasoning_tokens=reasoning,
    )


class RecordingSink:
    """The gateway's usage sink in the demo: the real publisher, and the demo's own
    ledger of every event the gateway published (the independent side of the checks)."""

    def __init__(self, publisher: UsagePublisher, ledger: Ledger, prices: PriceBook) -> None:
        self.publisher = publisher
        self.ledger = ledger
        self.prices = prices
        self.last: UsageEvent | None = None

    async def publish(self, event: UsageEvent) -> None:
        await self.publisher.publish(event)
        self.last = event
        ledger = self.ledger
        cost = self.prices.price_event(event).cost_nanos
        ledger.sent_unique += 1
        ledger.expected_nanos += cost
        ledger.per_principal[(event["org_id"], event["secret_id"])] += cost
        if event["outcome"] == "refused":
            ledger.refused += 1
            ledger.refused_by[event["secret_id"]] += 1
        ledger.estimated += event["usage_source"] == "estimated"


def upstream_credential(secret: str) -> str:
    """The provider credential the gateway sends ``secret``'s calls with: one each, so the
    providers' reports tell the secrets apart."""
    return f"demo-upstream-{secret}"


def virtual_key(secret: str, user: str) -> str:
    return f"vk-demo-{secret}-{user.split('@')[0]}"


def gateway_config(upstream_url: str) -> dict[str, Any]:
    """The demo's gateway: every secret may call every API (all served by the fake
    providers), one virtual key per (secret, user); only agent jobs name a session."""
    apis = ("openai", "anthropic", "gemini", "bedrock")
    return {
        "gateway_id": "demo-gateway",
        # the answers' lengths and cuts the demo asks the fake providers for
        "forward_request_headers": ["x-fake-"],
        "upstreams": {api: {"api": api, "base_url": upstream_url} for api in apis},
        "secrets": {
            secret: {"upstream": list(apis), "api_key": upstream_credential(secret)}
            for _, secret, _, _ in PRINCIPALS
        },
        "keys": [
            {
                "name": f"{secret}.{user.split('@')[0]}",
                "key": virtual_key(secret, user),
                "principal": {
                    "org_id": org,
                    "secret_id": secret,
                    "user_id": user,
                    "tags": {"team": "search"} if secret == "sk-globex-search" else {},
                },
            }
            for org, secret, users, _ in PRINCIPALS
            for user in users
        ],
        "sessions": {"auto": False},
    }


def route_path(fmt: str, model: str, stream: bool) -> str:
    if fmt == "anthropic-messages":
        return "/v1/messages"
    if fmt == "openai-chat":
        return "/v1/chat/completions"
    if fmt == "openai-responses":
        return "/v1/responses"
    if fmt == "gemini":
        return f"/v1beta/models/{model}:" + (
            "streamGenerateContent?alt=sse" if stream else "generateContent"
        )
    return f"/model/{model}/converse" + ("-stream" if stream else "")


def auth_headers(fmt: str, key: str) -> dict[str, str]:
    """Where each provider's SDK puts its key."""
    if fmt == "anthropic-messages":
        return {"x-api-key": key, "anthropic-version": "2023-06-01"}
    if fmt == "gemini":
        return {"x-goog-api-key": key}
    return {"Authorization": f"Bearer {key}"}


@dataclass
class Proxy:
    """The demo's traffic: clients calling the reference gateway (in this process) with
    virtual keys, as provider SDKs would. The gateway checks each call with the enforcer,
    forwards it to the fake providers, reads the usage with the tap as it streams,
    publishes the UsageEvent (or the refusal) and settles the hold."""

    enforcer: Enforcer
    publisher: UsagePublisher
    prices: PriceBook
    rng: random.Random
    gateway: Gateway
    sink: RecordingSink
    http: aiohttp.ClientSession
    url: str

    @property
    def ledger(self) -> Ledger:
        return self.sink.ledger

    async def request(self, principal: tuple[Any, ...]) -> bool:
        """One call; True when the gateway let it through."""
        rng = self.rng
        _, secret, users, _ = principal
        fmt, _, model, _ = pick(rng, MODELS)
        user = rng.choice(users)
        stream = rng.random() < 0.7
        # now and then the provider drops a stream before its usage: charged an estimate
        cut = rng.randrange(3, 12) if stream and rng.random() < 0.02 else None
        usage = fake_usage(rng, fmt)
        body = build_request(fmt, model=model, usage=usage, stream=stream, rng=rng)
        headers = auth_headers(fmt, virtual_key(secret, user))
        headers["x-fake-output-tokens"] = str(usage.output_tokens)  # the answer's length
        if cut is not None:
            headers["x-fake-cut-after"] = str(cut)  # chunks before the connection drops
        if secret == "sk-acme-batch":  # agent jobs name their session
            headers["X-Spend-Session"] = f"job-{rng.randrange(40)}"
        async with self.http.post(
            self.url + route_path(fmt, model, stream), json=body, headers=headers
        ) as resp:
            allowed = resp.status == 200
            with contextlib.suppress(aiohttp.ClientPayloadError):  # the cut reaches the client
                await resp.read()
        await self.gateway.drain()  # this call's event is published and its hold settled
        if rng.random() < 0.01 and self.sink.last is not None:
            # a retrying proxy re-publishes the same event id: charged once downstream
            await self.publisher.publish(self.sink.last)
            self.ledger.duplicates += 1
        return allowed
