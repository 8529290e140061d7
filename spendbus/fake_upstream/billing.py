"""The fake providers' own bill: every call they charged, and the admin reports built from it.

Each 2xx answer that billed usage is counted under its :class:`BilledCall` (UTC day,
provider, format, the credential's key id, model, batch tier, usage). The admin endpoints aggregate them the way
the providers document: daily UTC buckets, grouped by key and model, paginated with
``has_more`` / ``next_page``:

``GET /v1/organization/usage/completions``        OpenAI organization Usage API (completions)
``GET /v1/organization/costs``                    OpenAI Costs API (by project and line item)
``GET /v1/organizations/usage_report/messages``   Anthropic Admin API usage report
``GET /v1/organizations/cost_report``             Anthropic cost report (by workspace and
                                                  description: model, tier, token type)
``GET /fake/billing-export/gemini``               Gemini's calls as the rows of a Cloud
                                                  Billing export (``?format=jsonl`` or ``csv``)

Each kind of call is priced once, when a cost report first asks, by the provider's own list (:class:`ListPrices`: a price
file, the shipped one unless ``FakeUpstreamConfig.price_file`` names another; a model the
list lacks at :data:`FALLBACK_NANOS_PER_TOKEN`), in exact integer nanos per token class
(the classes sum to the call's price, rounded once). OpenAI reports a cost as dollars (a
JSON number), Anthropic as cents in a decimal string: both exact to the nano.

All want the admin key (``FakeUpstreamConfig.admin_key``; without one every request
is refused with 401): OpenAI's and the export's as ``Authorization: Bearer``, Anthropic's
as ``x-api-key``. A call's key id is :func:`api_key_id` of the credential it came with,
never the credential; a Gemini credential's is the Google Cloud project it bills to.

The Gemini export has one row per (UTC day, project, model, tier, token class), its SKU
described as the SKU table shipped with spendbus names it (``reconcile/data/gemini_skus.yaml``);
a model that table lacks gets a SKU description of its own wording, which the table does
not know (an unmapped SKU, as a new model's would be).
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
from decimal import Decimal
from pathlib import Path
from typing import Any

from aiohttp import web
from pydantic import SecretStr

from schemas.pricing import PriceBook, default_price_file, load_price_file
from schemas.usage import new_usage_event

from .usage import FakeUsage

OPENAI_USAGE_PATH = "/v1/organization/usage/completions"
OPENAI_COSTS_PATH = "/v1/organization/costs"
ANTHROPIC_USAGE_PATH = "/v1/organizations/usage_report/messages"
ANTHROPIC_COSTS_PATH = "/v1/organizations/cost_report"
#: what a model the provider's list lacks is billed, per token of each class (the provider
#: bills every model it serves; spendbus's table may still lack it)
FALLBACK_NANOS_PER_TOKEN = {
    "input": 1_000,
    "cache_read": 100,
    "cache_write_5m": 1_250,
    "cache_write_1h": 2_000,
    "output": 4_000,
}
#: each token class as the cost reports name it: OpenAI's line item, Anthropic's token_type
COST_CLASSES = {
    "input": ("input", "uncached_input_tokens"),
    "cache_read": ("cached input", "cache_read_input_tokens"),
    "cache_write_5m": ("cache write", "cache_creation.ephemeral_5m_input_tokens"),
    "cache_write_1h": ("cache write 1h", "cache_creation.ephemeral_1h_input_tokens"),
    "output": ("output", "output_tokens"),
}
#: the provider whose bill each request format lands on (Bedrock bills as CUR files)
BILLING_PROVIDER = {
    "openai-chat": "openai",
    "openai-responses": "openai",
    "anthropic-messages": "anthropic",
    "gemini": "gemini",
}
GEMINI_EXPORT_PATH = "/fake/billing-export/gemini"
#: the export's columns as CSV writes them (nested names dotted, credits as JSON)
GEMINI_CSV_COLUMNS = (
    "service.description",
    "sku.id",
    "sku.description",
    "usage_start_time",
    "usage_end_time",
    "project.id",
    "cost",
    "currency",
    "usage.amount",
    "usage.unit",
    "cost_type",
    "credits",
)
#: the project / workspace every fake key belongs to
OPENAI_PROJECT = "proj_fake"
ANTHROPIC_WORKSPACE = "wrkspc_fake"
#: the providers' page sizes for daily buckets (default, most)
PAGE_LIMITS = {"openai": (7, 31), "anthropic": (7, 31)}


def api_key_id(provider: str, credential: str) -> str:
    """The id the provider's reports name ``credential`` by (a digest: never the key)."""
    digest = hashlib.sha256(credential.encode()).hexdigest()[:16]
    if provider == "gemini":  # a Gemini key is known by its project in the bill
        return f"gemini-project-{digest}"
    return f"key_{digest}" if provider == "openai" else f"apikey_{digest}"


def credential_of(request: web.Request) -> str:
    """The credential a call came with (Bearer, x-api-key or x-goog-api-key), '' if none."""
    bearer = request.headers.get("Authorization", "")
    if bearer.lower().startswith("bearer "):
        return bearer[7:].strip()
    return request.headers.get("x-api-key") or request.headers.get("x-goog-api-key") or ""


@dataclass(frozen=True)
class BilledCall:
    """A kind of call billed (the ledger counts how many of each)."""

    day: date
    provider: str
    fmt: str
    api_key_id: str
    model: str
    batch: bool
    usage: FakeUsage


def usage_classes(usage: FakeUsage) -> dict[str, int]:
    """``usage`` in the token classes the reports use (input excludes cache reads/writes)."""
    return {
        "input": usage.input_tokens,
        "cache_read": usage.cache_read_tokens,
        "cache_write_5m": usage.cache_write_tokens - usage.cache_write_1h_tokens,
        "cache_write_1h": usage.cache_write_1h_tokens,
        "output": usage.output_tokens,
    }


class ListPrices:
    """The provider's price list: what each call it bills costs, by token class (the file
    is read on the first cost asked, not when a fake provider starts)."""

    def __init__(self, price_file: Path | None = None) -> None:
        self.price_file = price_file
        self._book: PriceBook | None = None

    @property
    def book(self) -> PriceBook:
        if self._book is None:
            self._book = PriceBook(load_price_file(self.price_file or default_price_file()))
        return self._book

    def _price(
        self, fmt: str, provider: str, model: str, usage: FakeUsage, batch: bool
    ) -> int | None:
        event = new_usage_event(
            provider=provider,
            api=fmt,
            model=model,
            secret_id="fake-upstream",
            org_id="fake-upstream",
            gateway_id="fake-upstream",
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cache_read_tokens=usage.cache_read_tokens,
            cache_write_tokens=usage.cache_write_tokens,
            cache_write_1h_tokens=usage.cache_write_1h_tokens,
            reasoning_tokens=usage.reasoning_tokens,
            service_tier="batch" if batch else None,
        )
        price = self.book.price_event(event)
        return None if price.unpriced else price.cost_nanos

    def cost(
        self, fmt: str, provider: str, model: str, usage: FakeUsage, batch: bool
    ) -> dict[str, int]:
        """Nanos per token class; they sum to the call's price (output takes the remainder
        of the rounding, and of any rate that depends on the whole call)."""
        total = self._price(fmt, provider, model, usage, batch)
        classes = usage_classes(usage)
        if total is None:
            return {c: n * FALLBACK_NANOS_PER_TOKEN[c] for c, n in classes.items()}
        alone = {
            "input": FakeUsage(usage.input_tokens, 0),
            "cache_read": FakeUsage(0, 0, cache_read_tokens=usage.cache_read_tokens),
            "cache_write_5m": FakeUsage(0, 0, cache_write_tokens=classes["cache_write_5m"]),
            "cache_write_1h": FakeUsage(
                0,
                0,
                cache_write_tokens=usage.cache_write_1h_tokens,
                cache_write_1h_tokens=usage.cache_write_1h_tokens,
            ),
        }
        out = {
            c: (self._price(fmt, provider, model, u, batch) or 0) if classes[c] else 0
            for c, u in alone.items()
        }
        out["output"] = total - sum(out.values())
        return out


class BillingLedger:
    """Every call billed, counted by kind (memory grows with distinct usages, not calls),
    priced by ``prices`` when a cost report asks (each kind once: pricing stays off the
    serving path)."""

    def __init__(self, prices: ListPrices | None = None) -> None:
        self.tally: dict[BilledCall, int] = defaultdict(int)
        self.prices = prices or ListPrices()
        self._costs: dict[BilledCall, dict[str, int]] = {}

    def cost_of(self, call: BilledCall) -> dict[str, int]:
        """What one such call costs, nanos by token class."""
        cost = self._costs.get(call)
        if cost is None:
            cost = self.prices.cost(call.fmt, call.provider, call.model, call.usage, call.batch)
            self._costs[call] = cost
        return cost

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
        call = BilledCall(
            day=when.astimezone(UTC).date(),
            provider=provider,
            fmt=fmt,
            api_key_id=api_key_id(provider, credential_of(request)),
            model=model,
            batch=request.headers.get("x-fake-batch", "").lower() == "true",
            usage=usage,
        )
        self.tally[call] += 1

    def grouped(
        self, provider: str, start: date, end: date
    ) -> dict[date, dict[tuple[str, str, bool], tuple[FakeUsage, int]]]:
        """Per UTC day in [start, end): (key id, model, batch) -> (summed usage, requests)."""
        out: dict[date, dict[tuple[str, str, bool], tuple[FakeUsage, int]]] = defaultdict(dict)
        for call, count in self.tally.items():
            if call.provider != provider or not start <= call.day < end:
                continue
            key = (call.api_key_id, call.model, call.batch)
            usage, requests = out[call.day].get(key, (FakeUsage(0, 0), 0))
            out[call.day][key] = (_add(usage, call.usage, count), requests + count)
        return out

    def costs(
        self, provider: str, start: date, end: date
    ) -> dict[date, dict[tuple[str, bool, str], int]]:
        """Per UTC day in [start, end): (model, batch, token class) -> nanos billed."""
        out: dict[date, dict[tuple[str, bool, str], int]] = defaultdict(dict)
        for call, count in self.tally.items():
            if call.provider != provider or not start <= call.day < end:
                continue
            for token_class, nanos in self.cost_of(call).items():
                if nanos:
                    key = (call.model, call.batch, token_class)
                    out[call.day][key] = out[call.day].get(key, 0) + nanos * count
        return out


def _add(a: FakeUsage, b: FakeUsage, times: int = 1) -> FakeUsage:
    return FakeUsage(**{k: v + times * b.as_dict()[k] for k, v in a.as_dict().items()})


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


def _openai_cost_results(costs: dict[tuple[str, bool, str], int]) -> list[dict[str, Any]]:
    return [
        {
            "object": "organization.costs.result",
            # dollars as a JSON number: exact to the nano below a million dollars
            "amount": {"value": float(Decimal(nanos) / 10**9), "currency": "usd"},
            "line_item": f"{model}, {'batch ' if batch else ''}{COST_CLASSES[cls][0]}",
            "project_id": OPENAI_PROJECT,
        }
        for (model, batch, cls), nanos in sorted(costs.items())
    ]


def _anthropic_cost_results(costs: dict[tuple[str, bool, str], int]) -> list[dict[str, Any]]:
    return [
        {
            "currency": "USD",
            # cents, as a decimal string: "123.45" is $1.2345
            "amount": str(Decimal(nanos) / 10**7),
            "workspace_id": ANTHROPIC_WORKSPACE,
            "description": f"{model} Usage - {COST_CLASSES[cls][1]}",
            "cost_type": "tokens",
            "context_window": "0-200k",
            "model": model,
            "service_tier": "batch" if batch else "standard",
            "token_type": COST_CLASSES[cls][1],
        }
        for (model, batch, cls), nanos in sorted(costs.items())
    ]


def _range_and_page(request: web.Request, provider: str) -> tuple[list[date], int, int]:
    """The days a report request asks for, its page size and its first day's index."""
    if request.query.get("bucket_width", "1d") != "1d":
        raise ValueError("this report serves bucket_width=1d only")
    unix = provider == "openai"
    start_name, end_name = ("start_time", "end_time") if unix else ("starting_at", "ending_at")
    start = _parse_time(request.query.get(start_name), start_name, unix=unix)
    if start is None:
        raise ValueError(f"{start_name} is required")
    end = _parse_time(request.query.get(end_name), end_name, unix=unix)
    first, stop = _window(start, end)
    return _days(first, stop), _limit(request, provider), _page_index(request.query.get("page"))


def _bucket(provider: str, day: date, results: list[dict[str, Any]]) -> dict[str, Any]:
    if provider == "openai":
        start = int(datetime.combine(day, datetime.min.time(), UTC).timestamp())
        return {
            "object": "bucket",
            "start_time": start,
            "end_time": start + 86_400,
            "results": results,
        }
    return {
        "starting_at": f"{day.isoformat()}T00:00:00Z",
        "ending_at": f"{(day + timedelta(days=1)).isoformat()}T00:00:00Z",
        "results": results,
    }


def report_handlers(
    ledger: BillingLedger, admin_key: SecretStr | None
) -> Iterable[tuple[str, Any]]:
    """(path, GET handler) of each admin report."""

    def handler(provider: str, kind: str) -> Any:
        async def serve(request: web.Request) -> web.Response:
            if not _authorized(request, admin_key, provider):
                refusal = "Invalid admin API key." if provider == "openai" else "invalid x-api-key"
                return _error(401, refusal)
            try:
                days, limit, index = _range_and_page(request, provider)
            except ValueError as exc:
                return _error(400, str(exc))
            data = []
            if days:
                first, stop = days[0], days[-1] + timedelta(days=1)
                if kind == "usage":
                    grouped = ledger.grouped(provider, first, stop)
                    results = {
                        day: [
                            _openai_result(key, usage, requests)
                            if provider == "openai"
                            else _anthropic_result(key, usage)
                            for key, (usage, requests) in sorted(grouped.get(day, {}).items())
                        ]
                        for day in days
                    }
                else:
                    costs = ledger.costs(provider, first, stop)
                    shape = (
                        _openai_cost_results if provider == "openai" else _anthropic_cost_results
                    )
                    results = {day: shape(costs.get(day, {})) for day in days}
                data = [_bucket(provider, day, results[day]) for day in days[index : index + limit]]
            more = index + limit < len(days)
            page: dict[str, Any] = {"object": "page"} if provider == "openai" else {}
            page |= {
                "data": data,
                "has_more": more,
                "next_page": _page_token(index + limit) if more else None,
            }
            return web.json_response(page)

        return serve

    async def gemini_export(request: web.Request) -> web.Response:
        if not _authorized(request, admin_key, "openai"):  # a Bearer token
            return _error(401, "Invalid admin key.")
        shape = request.query.get("format", "jsonl")
        if shape not in ("jsonl", "csv"):
            return _error(400, f"format must be jsonl or csv, got {shape!r}")
        rows = gemini_export_rows(ledger)
        text = "".join(json.dumps(row) + "\n" for row in rows) if shape == "jsonl" else _csv(rows)
        return web.Response(text=text, content_type="text/plain")

    return (
        (GEMINI_EXPORT_PATH, gemini_export),
        (OPENAI_USAGE_PATH, handler("openai", "usage")),
        (OPENAI_COSTS_PATH, handler("openai", "costs")),
        (ANTHROPIC_USAGE_PATH, handler("anthropic", "usage")),
        (ANTHROPIC_COSTS_PATH, handler("anthropic", "costs")),
    )


def _sku_id(description: str) -> str:
    """A SKU id of Google's shape (``XXXX-XXXX-XXXX``), stable per description."""
    digest = hashlib.sha256(description.encode()).hexdigest()[:12].upper()
    return f"{digest[:4]}-{digest[4:8]}-{digest[8:]}"


def gemini_export_rows(ledger: BillingLedger) -> list[dict[str, Any]]:
    """Every Gemini call billed, as Cloud Billing export rows (one per UTC day, project,
    model, tier and token class; cost exact to the nano, in USD)."""
    from reconcile import load_sku_table

    table = load_sku_table()
    sums: dict[tuple[date, str, str, bool, str], list[int]] = defaultdict(lambda: [0, 0])
    for call, count in ledger.tally.items():
        if call.provider != "gemini":
            continue
        cost = ledger.cost_of(call)
        for token_class, tokens in usage_classes(call.usage).items():
            if tokens or cost[token_class]:
                cell = sums[(call.day, call.api_key_id, call.model, call.batch, token_class)]
                cell[0] += tokens * count
                cell[1] += cost[token_class] * count
    rows = []
    for (day, project, model, batch, token_class), (tokens, nanos) in sorted(sums.items()):
        tier = "batch" if batch else "standard"
        description = table.description_of(model, token_class, tier) or (
            f"{model} {tier} {token_class} tokens"
        )
        start = datetime.combine(day, datetime.min.time(), UTC)
        rows.append(
            {
                "billing_account_id": "012345-6789AB-CDEF01",
                "service": {"id": "AEFD-7695-64FA", "description": "Gemini API"},
                "sku": {"id": _sku_id(description), "description": description},
                "usage_start_time": start.isoformat(),
                "usage_end_time": (start + timedelta(days=1)).isoformat(),
                "project": {"id": project, "name": project},
                "labels": [],
                "cost": float(Decimal(nanos) / 10**9),
                "currency": "USD",
                "currency_conversion_rate": 1.0,
                "usage": {
                    "amount": tokens,
                    "unit": "count",
                    "amount_in_pricing_units": tokens / 10**6,
                    "pricing_unit": "count",
                },
                "credits": [],
                "cost_type": "regular",
            }
        )
    return rows


def _csv(rows: list[dict[str, Any]]) -> str:
    import csv
    import io

    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(GEMINI_CSV_COLUMNS)
    for row in rows:
        flat = []
        for column in GEMINI_CSV_COLUMNS:
            value: Any = row
            for part in column.split("."):
                value = value[part]
            flat.append(json.dumps(value) if column == "credits" else value)
        writer.writerow(flat)
    return out.getvalue()
