"""The tables' columns, and their rows built from decoded records: ``usage_events`` from
PricedUsage, ``budget_state`` from Verdict.

Scope ids are stored canonical (``schemas.ids.canonical_id``), the form the budget counters
use; every other field is copied as it is, in column order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from functools import lru_cache
from operator import itemgetter
from typing import Any, Final

from aggregator.sink.errors import SinkRejected
from schemas.ids import canonical_id
from schemas.records import PricedUsage, Verdict
from schemas.usage import TOKEN_FIELDS

Row = tuple[Any, ...]

#: usage_events columns the sink writes, in order, with their ClickHouse types
#: (passed as column_type_names: no DESCRIBE per insert). inserted_at is the
#: table's DEFAULT. A test checks this against the DDL.
USAGE_COLUMNS: Final = (
    ("event_id", "String"),
    ("occurred_at", "DateTime64(6, 'UTC')"),
    ("provider", "LowCardinality(String)"),
    ("api", "LowCardinality(String)"),
    ("model", "LowCardinality(String)"),
    ("secret_id", "String"),
    ("org_id", "String"),
    ("project_id", "Nullable(String)"),
    ("grant_id", "Nullable(String)"),
    ("permission_id", "Nullable(String)"),
    ("user_id", "Nullable(String)"),
    ("groups", "Array(String)"),
    ("session_id", "Nullable(String)"),
    ("tags", "Map(String, String)"),
    *((name, "Int64") for name in TOKEN_FIELDS),
    ("usage_source", "LowCardinality(String)"),
    ("estimate_reason", "Nullable(String)"),
    ("outcome", "LowCardinality(String)"),
    ("decision", "LowCardinality(String)"),
    ("decision_budget_id", "Nullable(String)"),
    ("status_code", "UInt16"),
    ("stream", "Bool"),
    ("gateway_id", "LowCardinality(String)"),
    ("request_id", "Nullable(String)"),
    ("latency_ms", "Nullable(Int32)"),
    ("cost_nanos", "Int64"),
    ("price_version", "LowCardinality(Nullable(String))"),
    ("price_match", "LowCardinality(Nullable(String))"),
    ("unpriced", "Bool"),
    ("source_partition", "Int32"),
    ("source_offset", "Int64"),
    ("priced_at", "DateTime64(6, 'UTC')"),
    # the counters the event counts in (PricedUsage.counts, ddl/005_budget_history.sql)
    (
        "counts",
        "Array(Tuple(counter_key String, budget_id String, scope_values Array(String), "
        "window String, period String, bucket Int64, requests UInt8, "
        "limit_nanos Nullable(Int64), limit_tokens Nullable(Int64), "
        "limit_requests Nullable(Int64), alert_at Array(Float64)))",
    ),
    # UsageEvent v2: billed units beyond tokens and the serving tier (ddl/006_billed_units.sql)
    ("units", "Map(String, Int64)"),
    ("service_tier", "LowCardinality(Nullable(String))"),
    # UsageEvent v3: the call this event is a further charge of (ddl/008_charge_of.sql)
    ("charge_of", "Nullable(String)"),
)
#: the fields of one ``counts`` item, in the column's tuple order
COUNT_FIELDS: Final = (
    "counter_key",
    "budget_id",
    "scope_values",
    "window",
    "period",
    "bucket",
    "requests",
    "limit_nanos",
    "limit_tokens",
    "limit_requests",
    "alert_at",
)
USAGE_COLUMN_NAMES: Final = tuple(name for name, _ in USAGE_COLUMNS)
USAGE_COLUMN_TYPES: Final = tuple(kind for _, kind in USAGE_COLUMNS)

VERDICT_COLUMNS: Final = (
    ("counter_key", "String"),
    ("budget_id", "LowCardinality(String)"),
    ("scope", "LowCardinality(String)"),
    ("scope_values", "Array(String)"),
    ("period", "LowCardinality(String)"),
    ("state", "LowCardinality(String)"),
    ("spent_nanos", "Int64"),
    ("spent_tokens", "Int64"),
    ("spent_requests", "Int64"),
    ("limit_nanos", "Nullable(Int64)"),
    ("limit_tokens", "Nullable(Int64)"),
    ("limit_requests", "Nullable(Int64)"),
    ("action", "LowCardinality(String)"),
    ("refusal", "LowCardinality(String)"),
    ("reset_at", "Nullable(DateTime64(6, 'UTC'))"),
    ("as_of", "DateTime64(6, 'UTC')"),
    ("seq", "Int64"),
    ("emitted_at", "DateTime64(6, 'UTC')"),
    # Verdict v2: the forecast (ddl/010_budget_state_forecast.sql; null from v1 records)
    ("burn_nanos", "Nullable(Int64)"),
    ("burn_tokens", "Nullable(Int64)"),
    ("burn_requests", "Nullable(Int64)"),
    ("burn_span_us", "Nullable(Int64)"),
    ("exhausts_at", "Nullable(DateTime64(6, 'UTC'))"),
)
VERDICT_COLUMN_NAMES: Final = tuple(name for name, _ in VERDICT_COLUMNS)
VERDICT_COLUMN_TYPES: Final = tuple(kind for _, kind in VERDICT_COLUMNS)


def _canonicalizer(field: str, *, optional: bool) -> Callable[[str], str | None]:
    """canonical_id for ``field``, memoised (ids repeat a lot); for an optional id,
    empty once canonical means absent (as budgets read it)."""
    if optional:
        return lru_cache(maxsize=1 << 16)(lambda value: canonical_id(value, field) or None)
    return lru_cache(maxsize=1 << 16)(lambda value: canonical_id(value, field))


_SECRET: Final = _canonicalizer("secret_id", optional=False)
_ORG: Final = _canonicalizer("org_id", optional=False)
_PROJECT: Final = _canonicalizer("project_id", optional=True)
_GRANT: Final = _canonicalizer("grant_id", optional=True)
_PERMISSION: Final = _canonicalizer("permission_id", optional=True)
_USER: Final = _canonicalizer("user_id", optional=True)
_SESSION: Final = _canonicalizer("session_id", optional=True)
_GROUP: Final = lru_cache(maxsize=1 << 16)(canonical_id)
# the columns around the canonical ids, copied as they are (itemgetter builds the tuples in C)
_EVENT_HEAD: Final = itemgetter(*USAGE_COLUMN_NAMES[: USAGE_COLUMN_NAMES.index("secret_id")])
_EVENT_TAIL: Final = itemgetter(
    *USAGE_COLUMN_NAMES[USAGE_COLUMN_NAMES.index("tags") : USAGE_COLUMN_NAMES.index("cost_nanos")]
)
_PRICING: Final = itemgetter(
    *USAGE_COLUMN_NAMES[USAGE_COLUMN_NAMES.index("cost_nanos") : USAGE_COLUMN_NAMES.index("counts")]
)
_COUNT: Final = itemgetter(*COUNT_FIELDS)
_VERDICT_ROW: Final = itemgetter(*VERDICT_COLUMN_NAMES)


def rows_from_priced(records: Iterable[PricedUsage]) -> list[Row]:
    """usage_events rows (tuples in USAGE_COLUMNS order) from decoded PricedUsage records.

    Scope ids are stored canonical (schemas.ids.canonical_id), the form the
    budget counters use; an optional id that is empty once canonical is NULL.
    """
    rows = []
    for rec in records:
        ev = rec["event"]
        project, grant, permission = ev["project_id"], ev["grant_id"], ev["permission_id"]
        user, session = ev["user_id"], ev["session_id"]
        rows.append(
            (
                *_EVENT_HEAD(ev),
                _SECRET(ev["secret_id"]),
                _ORG(ev["org_id"]),
                None if project is None else _PROJECT(project),
                None if grant is None else _GRANT(grant),
                None if permission is None else _PERMISSION(permission),
                None if user is None else _USER(user),
                [_GROUP(group) for group in ev["groups"]],
                None if session is None else _SESSION(session),
                *_EVENT_TAIL(ev),
                *_PRICING(rec),
                [_COUNT(count) for count in rec.get("counts") or ()],
                dict(ev.get("units") or {}),
                ev.get("service_tier"),
                ev.get("charge_of"),
            )
        )
    return rows


def rows_from_verdicts(records: Iterable[Verdict]) -> list[Row]:
    """budget_state rows (tuples in VERDICT_COLUMNS order) from decoded Verdict records."""
    return [_VERDICT_ROW(rec) for rec in records]


def month_of(ts: datetime) -> int:
    """``YYYYMM`` of ``ts`` in UTC: ClickHouse's toYYYYMM(occurred_at), the table's partition."""
    if ts.tzinfo is not UTC:
        if ts.tzinfo is None:
            raise SinkRejected(f"occurred_at {ts.isoformat()} has no time zone")
        ts = ts.astimezone(UTC)
    return ts.year * 100 + ts.month
