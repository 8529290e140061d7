"""A whole gateway on real components: the fake providers, a real broker, the real
enforcer following real topics, the real publisher, and the gateway on a real port.

The aggregator is another stage: tests that need a spent budget produce its
Verdict record directly (as the enforcer's own tests do), or spend the budget
through the gateway itself (reserve-and-settle holds refuse before any verdict).
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from aiokafka import AIOKafkaConsumer

from enforcer import Enforcer, EnforcerConfig
from ingest.gateway import Gateway, parse_config
from ingest.publisher import PublisherConfig, UsagePublisher
from schemas.budgets import Budget
from schemas.codec import BUDGET_POLICY, PRICE_TABLE, USAGE_EVENT, VERDICT
from schemas.ids import counter_key
from schemas.jobs import job_key_secret
from schemas.periods import parse_window, period_end, period_key
from schemas.pricing import default_price_file, load_price_file
from schemas.topics import Topics
from spendbus.fake_upstream import FakeUpstream, FakeUpstreamConfig
from spendbus.stack.compacted import publish

BEDROCK_MODEL = "anthropic.claude-sonnet-4-5-20250929-v1:0"
PROMPT = "Summarise the retention policy of usage.raw for the finance team. " * 20
#: the credentials the gateway holds (clients never see them)
CREDENTIALS = {
    "sk-openai": "real-openai-credential-1234",
    "sk-anthropic": "real-anthropic-credential-1234",
    "sk-gemini": "real-gemini-credential-1234",
    "sk-bedrock": "real-bedrock-credential-1234",
    "sk-openai-broke": "real-openai-credential-broke",
    "sk-anthropic-broke": "real-anthropic-credential-broke",
}
#: virtual key -> (name, org, secret)
KEYS = {
    "vk-acme-openai-0123456789": ("acme-openai", "acme", "sk-openai"),
    "vk-acme-anthropic-0123456789": ("acme-anthropic", "acme", "sk-anthropic"),
    "vk-acme-gemini-0123456789": ("acme-gemini", "acme", "sk-gemini"),
    "vk-acme-bedrock-0123456789": ("acme-bedrock", "acme", "sk-bedrock"),
    "vk-broke-openai-0123456789": ("broke-openai", "broke", "sk-openai-broke"),
    "vk-broke-anthropic-0123456789": ("broke-anthropic", "broke", "sk-anthropic-broke"),
}
KEY_OF = {secret: key for key, (_, _, secret) in KEYS.items()}
#: the server-side secret the stacks' key digests are keyed with (SPENDBUS_KEY_SECRET of
#: the CLI commands the tests run beside them)
KEY_SECRET = b"test-key-secret-0123456789abcdef"
UPSTREAM_OF_SECRET = {
    "sk-openai": "openai",
    "sk-anthropic": "anthropic",
    "sk-gemini": "gemini",
    "sk-bedrock": "bedrock",
    "sk-openai-broke": "openai",
    "sk-anthropic-broke": "anthropic",
}
#: the budget whose verdict the tests exhaust for org "broke"
BROKE = Budget(
    budget_id="broke-monthly",
    scope="org",
    window=parse_window("month"),
    match={"org_id": ("broke",)},
    limit_nanos=5_000_000_000,
)


def gateway_config(upstream_url: str, **overrides: Any) -> dict[str, Any]:
    """A gateway config document (what gateway.yaml parses to)."""
    data: dict[str, Any] = {
        "gateway_id": "test-gateway",
        # the fake providers' fault headers (x-fake-status, x-fake-cut-after, ...)
        "forward_request_headers": ["x-fake-"],
        "upstreams": {
            api: {"api": api, "base_url": upstream_url}
            for api in ("openai", "anthropic", "gemini", "bedrock")
        },
        "secrets": {
            secret: {"upstream": UPSTREAM_OF_SECRET[secret], "api_key": value}
            for secret, value in CREDENTIALS.items()
        },
        "keys": [
            {
                "name": name,
                "key": key,
                "principal": {
                    "org_id": org,
                    "secret_id": secret,
                    "project_id": "proj-1",
                    "user_id": f"{name}@example.com",
                    "groups": ["eng"],
                    "tags": {"team": "search"},
                },
            }
            for key, (name, org, secret) in KEYS.items()
        ],
    }
    data.update(overrides)
    return data


def exhausted_verdict(budget: Budget, scope_values: Sequence[str]) -> dict[str, Any]:
    """The Verdict the aggregator writes once ``budget`` is spent, for now's period."""
    now = datetime.now(UTC)
    return {
        "counter_key": counter_key(budget.budget_id, scope_values),
        "budget_id": budget.budget_id,
        "scope": budget.scope,
        "scope_values": list(scope_values),
        "period": period_key(budget.window, now),
        "state": "exceeded",
        "spent_nanos": budget.limit_nanos or 0,
        "spent_tokens": 0,
        "spent_requests": 0,
        "limit_nanos": budget.limit_nanos,
        "limit_tokens": budget.limit_tokens,
        "limit_requests": budget.limit_requests,
        "action": budget.action,
        "refusal": budget.refusal,
        "reset_at": period_end(budget.window, now),
        "as_of": now,
        "seq": 1,
        "emitted_at": now + timedelta(milliseconds=1),
    }


@dataclass
class GatewayStack:
    url: str
    upstream: FakeUpstream
    enforcer: Enforcer
    publisher: UsagePublisher
    gateway: Gateway
    bootstrap: str
    topics: Topics

    async def upstream_stats(self) -> dict[str, Any]:
        return self.upstream.stats.as_dict()

    async def events(self, count: int, timeout: float = 30.0) -> list[dict[str, Any]]:
        """The first ``count`` usage events in usage.raw (waits for them)."""
        await self.publisher.flush(timeout)
        consumer = AIOKafkaConsumer(
            self.topics.usage_raw,
            bootstrap_servers=self.bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            group_id=None,
        )
        await consumer.start()
        out: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        try:
            while len(out) < count and time.monotonic() < deadline:
                batches = await consumer.getmany(timeout_ms=500)
                for messages in batches.values():
                    out.extend(USAGE_EVENT.decode(m.value) for m in messages)
        finally:
            await consumer.stop()
        out.sort(key=lambda e: e["occurred_at"])
        return out


@asynccontextmanager
async def gateway_stack(
    bootstrap: str,
    topics: Topics,
    home: Path,
    *,
    budgets: Sequence[Budget] = (BROKE,),
    verdicts: Sequence[dict[str, Any]] = (),
    upstream: FakeUpstreamConfig | None = None,
    enforcer: dict[str, Any] | None = None,
    gateway: dict[str, Any] | None = None,
    clock: Callable[[], float] = time.time,
) -> AsyncIterator[GatewayStack]:
    """``clock``: the enforcer's (seconds since the epoch), for tests that move its time."""
    now = datetime.now(UTC)
    tables = load_price_file(default_price_file())
    await publish(
        bootstrap,
        topics.pricing,
        [(t.version.encode(), PRICE_TABLE.encode(t.to_record())) for t in tables],
    )
    await publish(
        bootstrap,
        topics.budget_policies,
        [(b.budget_id.encode(), BUDGET_POLICY.encode(b.to_record(now))) for b in budgets],
    )
    if verdicts:
        await publish(
            bootstrap,
            topics.budget_verdicts,
            [(v["counter_key"].encode(), VERDICT.encode(v)) for v in verdicts],
        )
    fake = FakeUpstream(upstream or FakeUpstreamConfig(port=0, seed=7))
    await fake.start()
    config = parse_config(gateway_config(fake.url, **(gateway or {})), "test")
    enforcer_config = EnforcerConfig(
        bootstrap=bootstrap,
        topic_prefix=topics.prefix,
        gateway_id="test-gateway",
        **(enforcer or {}),
    )
    publisher = UsagePublisher(
        PublisherConfig(bootstrap=bootstrap, topic_prefix=topics.prefix, spool_dir=home / "spool")
    )
    runner: web.AppRunner | None = None
    async with Enforcer(
        enforcer_config, clock=clock, job_key_secret=job_key_secret(KEY_SECRET)
    ) as gate:
        await gate.wait_ready(60)
        await publisher.start()
        try:
            gw = Gateway(
                config, gate, publisher, credentials=config.credentials({}), key_secret=KEY_SECRET
            )
            runner = web.AppRunner(
                gw.app(), access_log=None, handle_signals=False, **gw.server_options()
            )
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = next(a[1] for a in runner.addresses if isinstance(a, tuple))
            yield GatewayStack(
                f"http://127.0.0.1:{port}", fake, gate, publisher, gw, bootstrap, topics
            )
        finally:
            if runner is not None:
                await runner.cleanup()
            await publisher.stop()
            await fake.stop()


async def eventually(predicate: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


def request_for(fmt: str, stream: bool) -> tuple[str, dict[str, Any], str]:
    """(path, body, virtual key) of a realistic request of ``fmt``."""
    if fmt == "anthropic-messages":
        body: dict[str, Any] = {
            "model": "claude-sonnet-4-5",
            "max_tokens": 1024,
            "messages": [{"role": "user", "content": PROMPT}],
        }
        if stream:
            body["stream"] = True
        return "/v1/messages", body, KEY_OF["sk-anthropic"]
    if fmt == "openai-chat":
        body = {"model": "gpt-4o", "messages": [{"role": "user", "content": PROMPT}]}
        if stream:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        return "/v1/chat/completions", body, KEY_OF["sk-openai"]
    if fmt == "openai-responses":
        body = {"model": "gpt-5", "input": PROMPT, "max_output_tokens": 2048}
        if stream:
            body["stream"] = True
        return "/v1/responses", body, KEY_OF["sk-openai"]
    if fmt == "gemini":
        body = {"contents": [{"role": "user", "parts": [{"text": PROMPT}]}]}
        action = "streamGenerateContent?alt=sse" if stream else "generateContent"
        return f"/v1beta/models/gemini-2.5-flash:{action}", body, KEY_OF["sk-gemini"]
    if fmt == "bedrock-invoke":  # Claude's Messages body on Bedrock
        body = {
            "anthropic_version": "bedrock-2023-05-31",
            "max_tokens": 1024,
            "messages": [{"role": "user", "content": PROMPT}],
        }
        action = "invoke-with-response-stream" if stream else "invoke"
        return f"/model/{BEDROCK_MODEL}/{action}", body, KEY_OF["sk-bedrock"]
    body = {
        "messages": [{"role": "user", "content": [{"text": PROMPT}]}],
        "inferenceConfig": {"maxTokens": 1024},
    }
    path = f"/model/{BEDROCK_MODEL}/converse{'-stream' if stream else ''}"
    return path, body, KEY_OF["sk-bedrock"]


@asynccontextmanager
async def gateway_process(
    config: Path, *args: str, cwd: Path, env: dict[str, str]
) -> AsyncIterator[str]:
    """`spendbus gateway run --config CONFIG ARGS` as its own process: yields its URL once
    it says it listens; then SIGTERM, and it must exit 0 (killed if the block failed)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "spendbus",
        "gateway",
        "run",
        "--config",
        str(config),
        *args,
        cwd=cwd,
        env=env,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stderr is not None
        url = None
        seen: list[bytes] = []
        while url is None:
            line = await asyncio.wait_for(proc.stderr.readline(), 90)
            assert line, b"the gateway exited before listening:\n" + b"".join(seen[-20:])
            seen.append(line)
            if line.startswith(b"{"):
                url = json.loads(line)["listening"]
        yield url
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


#: the Realtime model the sessions of the tests ask for
REALTIME_MODEL = "gpt-4o-realtime-preview-2025-06-03"


async def until(ws: aiohttp.ClientWebSocketResponse, *kinds: str) -> dict[str, Any]:
    """The next server event of one of ``kinds`` (others are skipped; at most 30 s)."""
    async with asyncio.timeout(30):
        async for msg in ws:
            assert msg.type == aiohttp.WSMsgType.TEXT, msg
            event: dict[str, Any] = json.loads(msg.data)
            if event["type"] in kinds:
                return event
    raise AssertionError(f"the session closed before {kinds}")


def ask(text: str) -> list[dict[str, Any]]:
    """A Realtime user message and the request for a response to it."""
    return [
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": text}],
            },
        },
        {"type": "response.create", "event_id": "evt_client_1"},
    ]
