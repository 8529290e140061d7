"""The fake providers' own bill: every call they charged, and the admin reports built from it.

Each 2xx answer that billed usage is one :class:`BilledCall` (UTC day, provider, the
credential's key id, model, batch tier, usage). The admin endpoints aggregate them the way
the providers document: daily UTC buckets, grouped by key and model, paginated with
``has_more`` / ``next_page``:

``GET /v1/organization/usage/completions``        OpenAI organization Usage API (completions)
``GET /v1/organizations/usage_report/messages``   Anthropic Admin API usage report

Both want the admin key (``FakeUpstreamConfig.admin_key``; without one every request
is refused with 401): OpenAI's as ``Authorization: Bearer``, Anthropic's as ``x-api-key``.
A call's key id is :func:`api_key_id` of the credential it came with, never the credential.
A request carrying ``x-fake-batch: true`` is billed in the batch tier, as if it had come
through the provider's Batch API (which no gateway proxies).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from aiohttp import web
from pydantic import SecretStr

from .usage import FakeUsage

OPENAI_USAGE_PATH = "/v1/organization/usage/completions"
ANTHROPIC_USAGE_PATH = "/v1/organizations/usage_report/messages"
#: the provider whose bill each request format lands on (Gemini and Bedrock bill as files)
BILLING_PROVIDER = {
    "openai-chat": "openai",
    "openai-responses": "openai",
    "anthropic-messages": "anthropic",
}
#: the project / workspace every fake key belongs to
OPENAI_PROJECT = "proj_fake"
ANTHROPIC_WORKSPACE = "wrkspc_fake"
#: the providers' page sizes for daily buckets (default, most)
PAGE_LIMITS = {"openai": (7, 31), "anthropic": (7, 31)}


def api_key_id(provider: str, credential: str) -> str:
    """The id the provider's reports name ``credential`` by (a digest: never the key)."""
    digest = hashlib.sha256(credential.encode()).hexdigest()[:16]
    return f"key_{digest}" if provider == "openai" else f"apikey_{digest}"


def credential_of(request: web.Request) -> str:
    """The credential a call came with (Bearer, x-api-key or x-goog-api-key), '' if none."""
    bearer = request.headers.get("Authorization", "")
    if bearer.lower().startswith("bearer "):
        return bearer[7:].strip()
    return request.headers.get("x-api-key") or request.headers.get("x-goog-api-key") or ""


@dataclass(frozen=True)
class BilledCall:
    day: date
    provider: str
    api_key_id: str
    model: str
    batch: bool
    usage: FakeUsage


class BillingLedger:
    """Every call billed, in arrival order."""

    def __init__(self) -> None:
        self.calls: list[BilledCall] = []

    def record(
        self,
        fmt: str,
        request: web.Request,
        model: str,
        usage: FakeUsage,
        *,
        at: datetime | None = None,
    ) -> None:
        provider = BILLING_PROVIDER.get(fmt)
        if provider is None:
            return
        when = at or datetime.now(UTC)
        self.calls.append(
            BilledCall(
                day=when.astimezone(UTC).date(),
                provider=provider,
                api_key_id=api_key_id(provider, credential_of(request)),
                model=model,
                batch=request.headers.get("x-fake-batch", "").lower() == "true",
                usage=usage,
            )
        )

    def grouped(
        self, provider: str, start: date, end: date
    ) -> dict[date, dict[tuple[str, str, bool], tuple[FakeUsage, int]]]:
        """Per UTC day in [start, end): (key id, model, batch) -> (summed usage, requests)."""
        out: dict[date, dict[tuple[str, str, bool], tuple[FakeUsage, int]]] = defaultdict(dict)
        for call in self.calls:
            if call.provider != provider or not start <= call.day < end:
                continue
            key = (call.api_key_id, call.model, call.batch)
            usage, requests = out[call.day].get(key, (FakeUsage(0, 0), 0))
            out[call.day][key] = (_add(usage, call.usage), requests + 1)
        return out


def _add(a: FakeUsage, b: FakeUsage) -> FakeUsage:
    return FakeUsage(**{k: v + b.as_dict()[k] for k, v in a.as_dict().items()})


def _error(status: int, message: str) -> web.Response:
    return web.json_response(
        {"error": {"type": "invalid_request_error", "message": message}}, status=status
    )


def _authorized(request: web.Request, admin_key: SecretStr | None, provider: str) -> bool:
    if admin_key is None:
        return False
    given = credential_of(request) if provider == "openai" else request.headers.get("x-api-key", "")
    return hmac.compare_digest(given.encode(), admin_key.get_secret_value().encode())


def _page_token(index: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"day": index}).encode()).decode()


def _page_index(token: str | None) -> int:
    if not token:
        return 0
    try:
        index = json.loads(base64.urlsafe_b64decode(token.encode()))["day"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"page {token!r} is not a page this report gave") from exc
    if not isinstance(index, int) or index < 0:
        raise ValueError(f"page {token!r} is not a page this report gave")
    return index


def _limit(request: web.Request, provider: str) -> int:
    default, most = PAGE_LIMITS[provider]
    raw = request.query.get("limit")
    if raw is None:
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= most:
        raise ValueError(f"limit must be an integer from 1 to {most}, got {raw!r}")
    return int(raw)


def _days(start: date, end: date) -> list[date]:
    return [start + timedelta(days=n) for n in range((end - start).days)]


def _window(start: datetime, end: datetime | None) -> tuple[date, date]:
    first = start.astimezone(UTC).date()
    last = (end or datetime.now(UTC)).astimezone(UTC)  # no end: up to now, today included
    # a bucket is a whole UTC day: an end inside a day includes that day
    stop = last.date() + timedelta(days=1 if last.time() != datetime.min.time() else 0)
    if stop <= first:
        raise ValueError("the end of the range is not after its start")
    return first, stop


def _openai_result(key: tuple[str, str, bool], usage: FakeUsage, requests: int) -> dict[str, Any]:
    key_id, model, batch = key
    return {
        "object": "organization.usage.completions.result",
        # OpenAI counts cached (and cache-written) tokens inside input_tokens
        "input_tokens": usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens,
        "output_tokens": usage.output_tokens,
        "input_cached_tokens": usage.cache_read_tokens,
        "input_audio_tokens": 0,
        "output_audio_tokens": 0,
        "num_model_requests": requests,
        "project_id": OPENAI_PROJECT,
        "user_id": None,
        "api_key_id": key_id,
        "model": model,
        "batch": batch,
    }


def _anthropic_result(key: tuple[str, str, bool], usage: FakeUsage) -> dict[str, Any]:
    key_id, model, batch = key
    return {
        "uncached_input_tokens": usage.input_tokens,
        "cache_creation": {
            "ephemeral_5m_input_tokens": usage.cache_write_tokens - usage.cache_write_1h_tokens,
            "ephemeral_1h_input_tokens": usage.cache_write_1h_tokens,
        },
        "cache_read_input_tokens": usage.cache_read_tokens,
        "output_tokens": usage.output_tokens,
        "server_tool_use": {"web_search_requests": 0},
        "api_key_id": key_id,
        "workspace_id": ANTHROPIC_WORKSPACE,
        "model": model,
        "service_tier": "batch" if batch else "standard",
        "context_window": "0-200k",
    }


def _parse_time(raw: str | None, name: str, *, unix: bool) -> datetime | None:
    if raw is None:
        return None
    try:
        if unix:
            return datetime.fromtimestamp(int(raw), UTC)
        parsed = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except (ValueError, OverflowError, OSError) as exc:
        raise ValueError(f"{name} {raw!r} is not a valid time") from exc
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def report_handlers(
    ledger: BillingLedger, admin_key: SecretStr | None
) -> Iterable[tuple[str, Any]]:
    """(path, GET handler) of each admin report."""

    async def openai(request: web.Request) -> web.Response:
        if not _authorized(request, admin_key, "openai"):
            return _error(401, "Invalid admin API key.")
        try:
            if request.query.get("bucket_width", "1d") != "1d":
                raise ValueError("this report serves bucket_width=1d only")
            start = _parse_time(request.query.get("start_time"), "start_time", unix=True)
            if start is None:
                raise ValueError("start_time is required")
            end = _parse_time(request.query.get("end_time"), "end_time", unix=True)
            first, stop = _window(start, end)
            limit, index = _limit(request, "openai"), _page_index(request.query.get("page"))
        except ValueError as exc:
            return _error(400, str(exc))
        days = _days(first, stop)
        grouped = ledger.grouped("openai", first, stop)
        page = days[index : index + limit]
        data = [
            {
                "object": "bucket",
                "start_time": int(datetime.combine(day, datetime.min.time(), UTC).timestamp()),
                "end_time": int(
                    datetime.combine(day + timedelta(days=1), datetime.min.time(), UTC).timestamp()
                ),
                "results": [
                    _openai_result(key, usage, requests)
                    for key, (usage, requests) in sorted(grouped.get(day, {}).items())
                ],
            }
            for day in page
        ]
        more = index + limit < len(days)
        return web.json_response(
            {
                "object": "page",
                "data": data,
                "has_more": more,
                "next_page": _page_token(index + limit) if more else None,
            }
        )

    async def anthropic(request: web.Request) -> web.Response:
        if not _authorized(request, admin_key, "anthropic"):
            return _error(401, "invalid x-api-key")
        try:
            if request.query.get("bucket_width", "1d") != "1d":
                raise ValueError("this report serves bucket_width=1d only")
            start = _parse_time(request.query.get("starting_at"), "starting_at", unix=False)
            if start is None:
                raise ValueError("starting_at is required")
            end = _parse_time(request.query.get("ending_at"), "ending_at", unix=False)
            first, stop = _window(start, end)
            limit, index = _limit(request, "anthropic"), _page_index(request.query.get("page"))
        except ValueError as exc:
            return _error(400, str(exc))
        days = _days(first, stop)
        grouped = ledger.grouped("anthropic", first, stop)
        data = [
            {
                "starting_at": f"{day.isoformat()}T00:00:00Z",
                "ending_at": f"{(day + timedelta(days=1)).isoformat()}T00:00:00Z",
                "results": [
                    _anthropic_result(key, usage)
                    for key, (usage, _) in sorted(grouped.get(day, {}).items())
                ],
            }
            for day in days[index : index + limit]
        ]
        more = index + limit < len(days)
        return web.json_response(
            {
                "data": data,
                "has_more": more,
                "next_page": _page_token(index + limit) if more else None,
            }
        )

    return ((OPENAI_USAGE_PATH, openai), (ANTHROPIC_USAGE_PATH, anthropic))
