"""The providers' own usage reports, read into one shape: :class:`ProviderUsage` rows.

OpenAI's organization Usage API (``/v1/organization/usage/completions``: daily buckets of
``organization.usage.completions.result``, grouped by ``project_id``, ``api_key_id``,
``model``, ``batch``) and Anthropic's Admin API usage report
(``/v1/organizations/usage_report/messages``: daily buckets grouped by ``api_key_id``,
``workspace_id``, ``model``, ``service_tier``, ``context_window``), as pages of
``{"data": [...], "has_more": ..., "next_page": ...}``. A file holds one page or a list of
pages (what ``reconcile fetch`` saves); every page a report announced must be there.

Token classes are the ledger's (:data:`TOKEN_CLASSES`): OpenAI's ``input_tokens`` count the
cached ones, so uncached input is ``input_tokens - input_cached_tokens``.

The cost reports (:func:`read_cost_report`): OpenAI's Costs API (``/v1/organization/costs``,
grouped by ``project_id`` and ``line_item``: ``amount.value`` in dollars) and Anthropic's
cost report (``/v1/organizations/cost_report``, grouped by ``workspace_id`` and
``description``: ``amount`` in cents as a decimal string, with ``model``, ``service_tier``
and ``token_type``), read into :class:`ProviderCost` rows in nanos. Neither names an API
key: costs are matched by day, model and tier.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from schemas.errors import SpendbusError

#: the token classes a cell is matched in (the ledger's columns, cache writes by TTL)
TOKEN_CLASSES = ("input", "cache_read", "cache_write_5m", "cache_write_1h", "output")
#: the providers whose admin reports `reconcile fetch` reads (and `reconcile import` takes)
PROVIDERS = ("openai", "anthropic")
#: every provider a report can be imported for: Bedrock as Cost and Usage Report rows,
#: Gemini as Cloud Billing export rows (gemini_export.py)
IMPORT_PROVIDERS = (*PROVIDERS, "bedrock", "gemini")


class ReportError(SpendbusError):
    """A provider report that cannot be read whole: the message names what and where."""


@dataclass(frozen=True)
class ProviderUsage:
    """One (day, key, model, tier) result of a provider report."""

    provider: str
    day: date
    api_key_id: str
    model: str
    tier: str
    tokens: dict[str, int]
    #: requests the provider counted (OpenAI's num_model_requests); None: not reported
    requests: int | None = None
    #: the project (OpenAI) or workspace (Anthropic) the key belongs to
    project: str | None = None


@dataclass
class ProviderReport:
    """A report read whole: its rows, and the days it covers (a day with no usage counts)."""

    provider: str
    rows: list[ProviderUsage] = field(default_factory=list)
    days: set[date] = field(default_factory=set)


def _count(result: dict[str, Any], name: str, where: str, *, required: bool = True) -> int:
    value: Any = result
    for part in name.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None and not required:
        return 0
    if type(value) is not int or value < 0:
        raise ReportError(f"{where}: {name} must be a whole number >= 0, got {value!r}")
    return value


def _group(result: dict[str, Any], name: str, where: str) -> str:
    value = result.get(name)
    if not isinstance(value, str) or not value:
        raise ReportError(
            f"{where}: {name} is {value!r}: the report must be grouped by {name} "
            f"(group_by[]={name})"
        )
    return value


def _day_of(value: Any, where: str, *, unix: bool) -> date:
    try:
        if unix:
            if type(value) is not int:
                raise ValueError
            moment = datetime.fromtimestamp(value, UTC)
        else:
            if not isinstance(value, str):
                raise ValueError
            moment = datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(UTC)
    except (ValueError, OverflowError, OSError):
        raise ReportError(f"{where}: bucket start {value!r} is not a time") from None
    if moment.time() != datetime.min.time():
        raise ReportError(
            f"{where}: bucket starts at {value!r}, not a UTC day: use bucket_width=1d"
        )
    return moment.date()


def _openai_row(result: dict[str, Any], day: date, where: str) -> ProviderUsage:
    total_input = _count(result, "input_tokens", where)
    cached = _count(result, "input_cached_tokens", where, required=False)
    if cached > total_input:
        raise ReportError(
            f"{where}: input_cached_tokens {cached} exceed input_tokens {total_input}"
        )
    batch = result.get("batch")
    if not isinstance(batch, bool):
        raise ReportError(
            f"{where}: batch is {batch!r}: the report must be grouped by batch (group_by[]=batch)"
        )
    return ProviderUsage(
        provider="openai",
        day=day,
        api_key_id=_group(result, "api_key_id", where),
        model=_group(result, "model", where),
        tier="batch" if batch else "standard",
        tokens={
            "input": total_input - cached,
            "cache_read": cached,
            "cache_write_5m": 0,
            "cache_write_1h": 0,
            "output": _count(result, "output_tokens", where),
        },
        requests=_count(result, "num_model_requests", where),
        project=result.get("project_id") if isinstance(result.get("project_id"), str) else None,
    )


def _anthropic_row(result: dict[str, Any], day: date, where: str) -> ProviderUsage:
    tier = result.get("service_tier")
    if not isinstance(tier, str) or not tier:
        raise ReportError(
            f"{where}: service_tier is {tier!r}: the report must be grouped by service_tier"
        )
    workspace = result.get("workspace_id")
    return ProviderUsage(
        provider="anthropic",
        day=day,
        api_key_id=_group(result, "api_key_id", where),
        model=_group(result, "model", where),
        tier=tier,
        tokens={
            "input": _count(result, "uncached_input_tokens", where),
            "cache_read": _count(result, "cache_read_input_tokens", where, required=False),
            "cache_write_5m": _count(
                result, "cache_creation.ephemeral_5m_input_tokens", where, required=False
            ),
            "cache_write_1h": _count(
                result, "cache_creation.ephemeral_1h_input_tokens", where, required=False
            ),
            "output": _count(result, "output_tokens", where),
        },
        project=workspace if isinstance(workspace, str) else None,
    )


def _buckets(provider: str, pages: Any, source: str) -> Iterator[tuple[date, list[Any], str]]:
    """(day, results, where) of every daily bucket of a report's pages, checked whole: a
    malformed page, a day given twice or a page announced (``has_more``) and absent is a
    ReportError, so a partial report is never imported."""
    if provider not in PROVIDERS:
        raise ReportError(f"provider {provider!r}: expected one of {', '.join(PROVIDERS)}")
    page_list = pages if isinstance(pages, list) else [pages]
    if not page_list:
        raise ReportError(f"{source}: no page in the report")
    days: set[date] = set()
    for number, page in enumerate(page_list, 1):
        where = f"{source} page {number}"
        if not isinstance(page, dict) or not isinstance(page.get("data"), list):
            raise ReportError(f'{where}: expected a page {{"data": [...], "has_more": ...}}')
        has_more = page.get("has_more")
        if not isinstance(has_more, bool):
            raise ReportError(f"{where}: has_more must be true or false, got {has_more!r}")
        if has_more and number == len(page_list):
            raise ReportError(
                f"{where}: partial report: has_more is true and the next page "
                f"({page.get('next_page')!r}) is not in it"
            )
        if not has_more and number < len(page_list):
            raise ReportError(
                f"{where}: has_more is false but {len(page_list) - number} page(s) follow"
            )
        for index, bucket in enumerate(page["data"]):
            bucket_where = f"{where} bucket {index}"
            if not isinstance(bucket, dict) or not isinstance(bucket.get("results"), list):
                raise ReportError(f"{bucket_where}: expected a bucket with results")
            if provider == "openai":
                day = _day_of(bucket.get("start_time"), bucket_where, unix=True)
            else:
                day = _day_of(bucket.get("starting_at"), bucket_where, unix=False)
            if day in days:
                raise ReportError(f"{bucket_where}: day {day} is given twice")
            days.add(day)
            for n, result in enumerate(bucket["results"]):
                if not isinstance(result, dict):
                    raise ReportError(f"{bucket_where} result {n}: expected an object")
            yield day, bucket["results"], bucket_where


def read_report(provider: str, pages: Any, source: str) -> ProviderReport:
    """``pages`` (one page or a list of them, as parsed JSON) of ``provider``'s usage report.

    Raises ReportError naming the page, bucket and field for anything malformed (see
    ``_buckets``) or a result not grouped by key and model.
    """
    report = ProviderReport(provider)
    for day, results, bucket_where in _buckets(provider, pages, source):
        report.days.add(day)
        seen: set[tuple[str, str, str]] = set()
        for n, result in enumerate(results):
            result_where = f"{bucket_where} result {n}"
            row = (
                _openai_row(result, day, result_where)
                if provider == "openai"
                else _anthropic_row(result, day, result_where)
            )
            key = (row.api_key_id, row.model, row.tier)
            if key in seen:
                # grouped by more than key, model and tier (a project, a context
                # window): add the parts up, never count a row twice
                report.rows = [
                    _merged(r, row) if _key(r) == (day, *key) else r for r in report.rows
                ]
                continue
            seen.add(key)
            report.rows.append(row)
    return report


#: the cost reports' names of the token classes: OpenAI's line item after the model
#: ("gpt-4o, cached input"; "batch " before the class in the batch tier), Anthropic's
#: token_type; anything else a provider bills (web search, storage) is class "other"
OPENAI_COST_CLASSES = {
    "input": "input",
    "cached input": "cache_read",
    "cache write": "cache_write_5m",
    "cache write 1h": "cache_write_1h",
    "output": "output",
}
ANTHROPIC_COST_CLASSES = {
    "uncached_input_tokens": "input",
    "cache_read_input_tokens": "cache_read",
    "cache_creation.ephemeral_5m_input_tokens": "cache_write_5m",
    "cache_creation.ephemeral_1h_input_tokens": "cache_write_1h",
    "output_tokens": "output",
}
OTHER = "other"


@dataclass(frozen=True)
class ProviderCost:
    """One (day, model, tier, class) amount of a provider's cost report, in nanos."""

    provider: str
    day: date
    model: str
    tier: str
    token_class: str
    nanos: int
    project: str | None = None


@dataclass
class CostReport:
    provider: str
    rows: list[ProviderCost] = field(default_factory=list)
    days: set[date] = field(default_factory=set)


def _nanos(amount: Decimal, scale: int, where: str) -> int:
    """``amount`` (units of ``scale`` nanos each: dollars, cents) in whole nanos, half to
    even (the fake provider's amounts are exact to the nano)."""
    if not amount.is_finite() or amount < 0:
        raise ReportError(f"{where}: amount {amount} is not a cost >= 0")
    return int((amount * scale).quantize(Decimal(1), rounding=ROUND_HALF_EVEN))


def _openai_cost(result: dict[str, Any], day: date, where: str) -> ProviderCost:
    amount = result.get("amount")
    value = amount.get("value") if isinstance(amount, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ReportError(f"{where}: amount.value must be a number of dollars, got {value!r}")
    if str(amount.get("currency", "usd")).lower() != "usd":  # type: ignore[union-attr]  # a dict here
        raise ReportError(f"{where}: only usd costs are read, got {amount.get('currency')!r}")  # type: ignore[union-attr]  # a dict here
    line = result.get("line_item")
    if not isinstance(line, str) or not line:
        raise ReportError(f"{where}: line_item is {line!r}: group_by[]=line_item")
    model, _, what = line.partition(", ")
    tier = "batch" if what.startswith("batch ") else "standard"
    token_class = OPENAI_COST_CLASSES.get(what.removeprefix("batch "), OTHER)
    project = result.get("project_id")
    return ProviderCost(
        provider="openai",
        day=day,
        model=model if token_class != OTHER or what else "",
        tier=tier,
        token_class=token_class,
        nanos=_nanos(Decimal(repr(value)), 10**9, where),
        project=project if isinstance(project, str) else None,
    )


def _anthropic_cost(result: dict[str, Any], day: date, where: str) -> ProviderCost:
    raw = result.get("amount")
    try:
        amount = Decimal(raw) if isinstance(raw, str) else None
    except ArithmeticError:
        amount = None
    if amount is None:
        raise ReportError(f"{where}: amount must be cents as a decimal string, got {raw!r}")
    if result.get("currency", "USD") != "USD":
        raise ReportError(f"{where}: only USD costs are read, got {result.get('currency')!r}")
    if "description" in result and result.get("description") is None:
        raise ReportError(f"{where}: description is null: group_by[]=description")
    token_type, model = result.get("token_type"), result.get("model")
    token_class = OTHER
    if result.get("cost_type") == "tokens" and isinstance(token_type, str):
        token_class = ANTHROPIC_COST_CLASSES.get(token_type, OTHER)
    if token_class != OTHER and not (isinstance(model, str) and model):
        raise ReportError(f"{where}: model is {model!r}: group_by[]=description")
    tier = result.get("service_tier")
    workspace = result.get("workspace_id")
    return ProviderCost(
        provider="anthropic",
        day=day,
        model=model if isinstance(model, str) else "",
        tier=tier if isinstance(tier, str) and tier else "standard",
        token_class=token_class,
        nanos=_nanos(amount, 10**7, where),  # cents
        project=workspace if isinstance(workspace, str) else None,
    )


def read_cost_report(provider: str, pages: Any, source: str) -> CostReport:
    """``pages`` of ``provider``'s cost report (OpenAI's Costs API grouped by project_id and
    line_item; Anthropic's cost report grouped by workspace_id and description), each
    amount exact in nanos; the same checks as :func:`read_report`."""
    report = CostReport(provider)
    for day, results, bucket_where in _buckets(provider, pages, source):
        report.days.add(day)
        for n, result in enumerate(results):
            result_where = f"{bucket_where} result {n}"
            report.rows.append(
                _openai_cost(result, day, result_where)
                if provider == "openai"
                else _anthropic_cost(result, day, result_where)
            )
    return report


def report_kind(pages: Any) -> str | None:
    """``usage`` or ``costs`` by the first result's fields; None when no result tells."""
    for page in pages if isinstance(pages, list) else [pages]:
        for bucket in page.get("data", []) if isinstance(page, dict) else []:
            for result in bucket.get("results", []) if isinstance(bucket, dict) else []:
                if isinstance(result, dict):
                    return "costs" if "amount" in result else "usage"
    return None


def _key(row: ProviderUsage) -> tuple[date, str, str, str]:
    return (row.day, row.api_key_id, row.model, row.tier)


def _merged(a: ProviderUsage, b: ProviderUsage) -> ProviderUsage:
    requests = None if a.requests is None or b.requests is None else a.requests + b.requests
    return ProviderUsage(
        provider=a.provider,
        day=a.day,
        api_key_id=a.api_key_id,
        model=a.model,
        tier=a.tier,
        tokens={k: a.tokens[k] + b.tokens[k] for k in TOKEN_CLASSES},
        requests=requests,
        project=a.project,
    )


# -- Bedrock: AWS Cost and Usage Report (CUR 2.0) rows -----------------------------------

#: the CUR 2.0 columns a Bedrock row is read from
CUR_COLUMNS = (
    "line_item_usage_start_date",
    "line_item_product_code",
    "line_item_line_item_type",
    "line_item_usage_account_id",
    "line_item_usage_type",
    "line_item_resource_id",
    "line_item_usage_amount",
    "line_item_unblended_cost",
)
#: a usage type's ending -> the token class it bills (AWS's Bedrock CUR guide); any other
#: Bedrock usage is money without tokens (class "other")
CUR_TOKEN_TYPES = (
    ("-cache-read-input-token-count", "cache_read"),
    ("-cache-write-input-token-count", "cache_write_5m"),
    ("-input-tokens", "input"),
    ("-output-tokens", "output"),
)


def _cur_class(usage_type: str) -> str:
    lowered = usage_type.lower()
    for ending, token_class in CUR_TOKEN_TYPES:
        if lowered.endswith(ending) or f"-mantle{ending}-" in lowered:
            return token_class
    return OTHER


def read_bedrock_cur(text: str, source: str) -> tuple[ProviderReport, CostReport]:
    """Bedrock's rows of a CUR 2.0 export (CSV with its header): tokens and nanos by day,
    account (the credential's key id), model (the ``line_item_resource_id`` ARN's model or
    inference profile) and class. Rows of other services, and credits, taxes and fees
    (not ``Usage``), are not Bedrock usage: skipped. A file covers the UTC days it has
    rows for: export whole days. ReportError names the row and column otherwise."""
    import csv
    import io

    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in CUR_COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise ReportError(f"{source}: not a CUR 2.0 export: no column {', '.join(missing)}")
    usage: dict[tuple[date, str, str, str], dict[str, int]] = {}
    report, costs = ProviderReport("bedrock"), CostReport("bedrock")
    cost_sums: dict[tuple[date, str, str, str], int] = {}
    for number, row in enumerate(reader, 2):  # line 1 is the header
        where = f"{source} line {number}"
        if row["line_item_product_code"] != "AmazonBedrock":
            continue
        if row["line_item_line_item_type"] != "Usage":
            continue
        try:
            moment = datetime.fromisoformat(
                row["line_item_usage_start_date"].replace("Z", "+00:00")
            )
        except (ValueError, AttributeError):
            raise ReportError(
                f"{where}: line_item_usage_start_date {row['line_item_usage_start_date']!r} is not a time"
            ) from None
        day = (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).astimezone(UTC).date()
        account = row["line_item_usage_account_id"] or ""
        if not account:
            raise ReportError(f"{where}: line_item_usage_account_id is empty")
        resource = row["line_item_resource_id"] or ""
        model = resource.rpartition("/")[2] if "/" in resource else ""
        usage_type = row["line_item_usage_type"] or ""
        token_class = _cur_class(usage_type)
        if token_class != OTHER and not model:
            raise ReportError(
                f"{where}: line_item_resource_id {resource!r} names no model (a foundation-model "
                "or inference-profile ARN)"
            )
        tier = "batch" if "batch" in usage_type.lower() else "standard"
        try:
            amount = Decimal(row["line_item_usage_amount"])
            cost = Decimal(row["line_item_unblended_cost"])
        except (ArithmeticError, TypeError):
            raise ReportError(
                f"{where}: line_item_usage_amount and _unblended_cost must be numbers"
            ) from None
        report.days.add(day)
        costs.days.add(day)
        if token_class != OTHER:
            if not amount.is_finite() or amount < 0 or amount != amount.to_integral_value():
                raise ReportError(f"{where}: line_item_usage_amount {amount} is no token count")
            tokens = usage.setdefault((day, account, model, tier), dict.fromkeys(TOKEN_CLASSES, 0))
            tokens[token_class] += int(amount)
        key = (day, model, tier, token_class)
        cost_sums[key] = cost_sums.get(key, 0) + _nanos(cost, 10**9, where)
    report.rows = [
        ProviderUsage("bedrock", day, account, model, tier, tokens)
        for (day, account, model, tier), tokens in sorted(usage.items())
    ]
    costs.rows = [
        ProviderCost("bedrock", day, model, tier, token_class, nanos)
        for (day, model, tier, token_class), nanos in sorted(cost_sums.items())
    ]
    return report, costs
