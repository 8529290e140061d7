"""The admin API on a real broker: its app on a loopback port, tokens of every role, and
a client that answers (status, JSON body)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from admin import SERVER_OPTIONS, AdminConfig, AdminStore, TokenBook, build_app
from schemas.codec import DEAD_LETTER, USAGE_EVENT
from schemas.topics import Topics
from schemas.usage import new_usage_event
from tests.gateway.kit import KEY_SECRET

ADMIN_SECRET = b"test-admin-secret-0123456789abcdef0123456789abcdef"


@dataclass
class AdminServer:
    url: str
    tokens: TokenBook
    store: AdminStore
    session: aiohttp.ClientSession

    def token(self, role: str, org_id: str | None = None) -> str:
        return self.tokens.mint(role, org_id)[0]

    async def call(
        self,
        method: str,
        path: str,
        token: str | None,
        body: Any = None,
        *,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        sent = dict(headers or {})
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        data = raw if raw is not None else None if body is None else json.dumps(body).encode()
        if data is not None:
            sent.setdefault("Content-Type", "application/json")
        async with self.session.request(
            method, self.url + path, data=data, headers=sent
        ) as response:
            text = await response.text()
            return response.status, json.loads(text) if text else None


@asynccontextmanager
async def admin_server(
    bootstrap: str,
    topics: Topics,
    home: Path,
    **options: Any,
) -> AsyncIterator[AdminServer]:
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    tokens = TokenBook(home / "admin.tokens", ADMIN_SECRET)
    store = AdminStore(AdminConfig(bootstrap=bootstrap, topics=topics, key_secret=KEY_SECRET))
    runner = web.AppRunner(build_app(store, tokens, **options), access_log=None, **SERVER_OPTIONS)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = next(a[1] for a in runner.addresses if isinstance(a, tuple))
        async with aiohttp.ClientSession() as session:
            yield AdminServer(f"http://127.0.0.1:{port}", tokens, store, session)
    finally:
        await runner.cleanup()


def budget(budget_id: str, org: str | None = None, **fields: Any) -> dict[str, Any]:
    """A budget's JSON (its YAML form): an org budget of $50 a month."""
    body: dict[str, Any] = {"id": budget_id, "scope": "org", "window": "month", "limit_usd": "50"}
    if org is not None:
        body["match"] = {"org_id": org}
    return {**body, **fields}


def dead_letter(topics: Topics, org: str | None, reason: str, detail: str = "") -> bytes:
    """A DeadLetter record as the aggregator writes it: of ``org``'s usage event (its
    value still decodes), or for ``org`` None of bytes that do not read."""
    value = b"not avro"
    if org is not None:
        event = new_usage_event(
            provider="openai",
            api="openai-chat",
            model="gpt-4o-mini",
            secret_id="sk-openai",
            org_id=org,
            gateway_id="admin-test",
            input_tokens=10,
            output_tokens=5,
        )
        value = USAGE_EVENT.encode(event)
    return DEAD_LETTER.encode(
        {
            "reason": reason,
            "detail": detail or f"{reason} (a test letter)",
            "stage": "aggregator",
            "source_topic": topics.usage_raw,
            "source_partition": 0,
            "source_offset": 0,
            "key": None if org is None else org.encode(),
            "value": value,
            "failed_at": datetime.now(UTC),
        }
    )
