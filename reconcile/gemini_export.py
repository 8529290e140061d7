"""Gemini's bill: the rows of a Cloud Billing export (the standard usage cost table that
Cloud Billing exports to BigQuery), read into the same rows as the admin reports.

A row is one SKU's usage of one project over an interval (an hour, usually):
``service.description``, ``sku.id``, ``sku.description``, ``usage_start_time``,
``usage_end_time``, ``project.id``, ``cost``, ``currency``, ``usage.amount`` and
``usage.unit`` are read; ``credits`` (a list of ``{name, amount}``, amounts negative) and
``cost_type`` (``regular``, ``tax``, ``adjustment``, ``rounding_error``) when present. The
file is newline-delimited JSON (what ``bq extract --destination_format
NEWLINE_DELIMITED_JSON`` writes: nested records as objects) or CSV with a header, nested
names dotted or underscored (``sku.description`` or ``sku_description``; ``credits`` as
a JSON array, ``TO_JSON_STRING(credits)``).

The export names a model in words (``Gemini 2.5 Pro Input Text Tokens``): each SKU is read
through the shipped, versioned table ``data/gemini_skus.yaml`` (:class:`SkuTable`) into
(model id, token class, tier), never by a guess. A row of a Gemini service whose SKU the
table lacks is a named gap (``unmapped SKU <id> <description>: N rows, $X``), kept as
money of its own (model ``unmapped SKU ...``, class ``other``) so the reconciliation names
it. ``project.id`` is the credential's key id (the mapping file's ``project_id``). Costs
are read in USD only: an export in another currency is refused (no rate is assumed).
Credits are summed apart (``GeminiExport.credits_nanos``; stored as class ``credit``,
which the reconciliation shows per day beside the cost), never netted into the cost.
A file covers the UTC days it has Gemini rows for (a repeated or overlapping import
replaces those days): export whole days.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal, InvalidOperation
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from schemas.errors import ConfigError
from schemas.money import format_usd

from .matching import CREDIT, UNMAPPED_SKU
from .provider_reports import (
    OTHER,
    TOKEN_CLASSES,
    CostReport,
    ProviderCost,
    ProviderReport,
    ProviderUsage,
    ReportError,
    _nanos,
)

PROVIDER = "gemini"
#: the columns every row must have (nested names dotted)
EXPORT_COLUMNS = (
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
)
TIERS = ("standard", "batch")


@dataclass(frozen=True)
class SkuEntry:
    description: str
    model: str
    token_class: str
    tier: str
    context: str = "standard"


@dataclass(frozen=True)
class SkuTable:
    """The Gemini SKUs spendbus knows, by their export description."""

    version: str
    services: frozenset[str]
    token_units: frozenset[str]
    entries: dict[str, SkuEntry]

    def description_of(self, model: str, token_class: str, tier: str) -> str | None:
        """The standard-context SKU billing ``model``'s ``token_class`` in ``tier``."""
        for entry in self.entries.values():
            if (entry.model, entry.token_class, entry.tier, entry.context) == (
                model,
                token_class,
                tier,
                "standard",
            ):
                return entry.description
        return None


def sku_table_from_data(data: Any, source: str) -> SkuTable:
    """The table of a parsed file; ConfigError naming the entry for anything else."""
    if not isinstance(data, dict) or set(data) != {"version", "services", "token_units", "skus"}:
        raise ConfigError(f"{source}: expected exactly version, services, token_units and skus")
    version, skus = data["version"], data["skus"]
    if not isinstance(version, str) or not version:
        raise ConfigError(f"{source}: version must be a non-empty string")
    for name in ("services", "token_units"):
        if not isinstance(data[name], list) or not all(isinstance(s, str) for s in data[name]):
            raise ConfigError(f"{source}: {name} must be a list of strings")
    if not isinstance(skus, list):
        raise ConfigError(f"{source}: skus must be a list")
    entries: dict[str, SkuEntry] = {}
    for n, raw in enumerate(skus):
        where = f"{source}: skus[{n}]"
        if not isinstance(raw, dict) or not {"description", "model", "class", "tier"} <= set(raw):
            raise ConfigError(f"{where}: expected {{description, model, class, tier}}")
        extra = set(raw) - {"description", "model", "class", "tier", "context"}
        if extra:
            raise ConfigError(f"{where}: unknown field(s) {sorted(extra)}")
        entry = SkuEntry(
            str(raw["description"]),
            str(raw["model"]),
            str(raw["class"]),
            str(raw["tier"]),
            str(raw.get("context", "standard")),
        )
        if entry.token_class not in TOKEN_CLASSES:
            raise ConfigError(f"{where}: class must be one of {', '.join(TOKEN_CLASSES)}")
        if entry.tier not in TIERS:
            raise ConfigError(f"{where}: tier must be one of {', '.join(TIERS)}")
        if entry.context not in ("standard", "long"):
            raise ConfigError(f"{where}: context must be standard or long")
        if entry.description in entries:
            raise ConfigError(f"{where}: {entry.description!r} is listed twice")
        entries[entry.description] = entry
    return SkuTable(version, frozenset(data["services"]), frozenset(data["token_units"]), entries)


def load_sku_table(path: Path | None = None) -> SkuTable:
    """``path``'s table, or the one shipped with spendbus."""
    try:
        if path is None:
            text = resources.files("reconcile").joinpath("data/gemini_skus.yaml").read_text()
            source = "reconcile/data/gemini_skus.yaml"
        else:
            text, source = path.read_text(), str(path)
        data = yaml.safe_load(text)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the SKU table ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not YAML ({exc})") from None
    return sku_table_from_data(data, source)


@dataclass
class GeminiExport:
    """An export read whole: usage and costs as the admin reports', and what is not usage."""

    usage: ProviderReport
    costs: CostReport
    #: each named gap: unmapped SKUs, rows that are not usage (tax, adjustments)
    gaps: list[str] = field(default_factory=list)
    #: the credits of the usage rows, by name, in nanos (negative): shown, never netted
    credits_nanos: dict[str, int] = field(default_factory=dict)


def _field(row: dict[str, Any], name: str) -> Any:
    """``name`` (dotted) of a row: nested (JSON) or flat with either spelling (CSV)."""
    for key in (name, name.replace(".", "_")):
        if key in row:
            return row[key]
    value: Any = row
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(name)
        value = value[part]
    return value


def _time(value: Any, name: str, where: str) -> datetime:
    try:
        if not isinstance(value, str):
            raise ValueError
        text = value.strip().replace(" UTC", "+00:00").replace("Z", "+00:00")
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ReportError(f"{where}: {name} {value!r} is not a time") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).astimezone(UTC)


def _decimal(value: Any, name: str, where: str) -> Decimal:
    try:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise InvalidOperation
        amount = Decimal(repr(value) if isinstance(value, float) else str(value).strip())
    except InvalidOperation:
        raise ReportError(f"{where}: {name} {value!r} is not a number") from None
    if not amount.is_finite():
        raise ReportError(f"{where}: {name} {value!r} is not a number")
    return amount


def _credits(value: Any, where: str) -> list[tuple[str, Decimal]]:
    if value in (None, "", []):
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise ReportError(f"{where}: credits {value!r} is not a JSON array") from None
    if not isinstance(value, list):
        raise ReportError(f"{where}: credits must be a list of {{name, amount}}")
    out = []
    for credit in value:
        if not isinstance(credit, dict) or "amount" not in credit:
            raise ReportError(f"{where}: a credit without an amount: {credit!r}")
        out.append(
            (str(credit.get("name") or "credit"), _decimal(credit["amount"], "credit", where))
        )
    return out


def _rows(text: str, source: str) -> list[tuple[str, dict[str, Any]]]:
    """(where, row) of every line: JSON lines, or CSV with a header."""
    stripped = text.lstrip()
    if not stripped:
        raise ReportError(f"{source}: the export is empty")
    if stripped.startswith("{"):
        rows = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise ReportError(f"{source} line {number}: not a JSON object ({exc})") from None
            if not isinstance(row, dict):
                raise ReportError(f"{source} line {number}: not a JSON object")
            rows.append((f"{source} line {number}", row))
        return rows
    reader = csv.DictReader(io.StringIO(text))
    header = set(reader.fieldnames or [])
    missing = [c for c in EXPORT_COLUMNS if c not in header and c.replace(".", "_") not in header]
    if missing:
        raise ReportError(f"{source}: not a Cloud Billing export: no column {', '.join(missing)}")
    out = []
    for number, row in enumerate(reader, 2):  # line 1 is the header
        if None in row or any(v is None for v in row.values()):
            raise ReportError(f"{source} line {number}: the row has not the header's columns")
        out.append((f"{source} line {number}", dict(row)))
    return out


def read_gemini_export(text: str, source: str, table: SkuTable) -> GeminiExport:
    """The Gemini rows of a Cloud Billing export, read whole: tokens by (day, project,
    model, tier), nanos by (day, model, tier, class), unmapped SKUs and rows that are not
    usage as named gaps, credits apart. Rows of other services are not read. A malformed
    row, a missing column, a non-USD cost or a mapped SKU not billed in tokens is a
    ReportError naming the line; nothing is half read."""
    usage: dict[tuple[date, str, str, str], dict[str, int]] = {}
    costs: dict[tuple[date, str, str, str], int] = {}
    unmapped: dict[tuple[str, str], list[int]] = {}  # (sku id, description) -> [rows, nanos]
    not_usage: dict[str, list[int]] = {}
    credits: dict[str, int] = {}
    days: set[date] = set()
    for where, row in _rows(text, source):
        try:
            values = {name: _field(row, name) for name in EXPORT_COLUMNS}
        except KeyError as exc:
            raise ReportError(f"{where}: no {exc.args[0]} (a Cloud Billing export row)") from None
        if values["service.description"] not in table.services:
            continue
        start = _time(values["usage_start_time"], "usage_start_time", where)
        end = _time(values["usage_end_time"], "usage_end_time", where)
        day = start.date()
        if not start <= end <= datetime.combine(day + timedelta(days=1), datetime.min.time(), UTC):
            raise ReportError(
                f"{where}: usage {start.isoformat()}..{end.isoformat()} is not within one UTC day"
            )
        currency = values["currency"]
        if currency != "USD":
            raise ReportError(
                f"{where}: cost in {currency!r}: spendbus reads USD exports only (it applies "
                "no exchange rate, the export's currency_conversion_rate included)"
            )
        cost = _decimal(values["cost"], "cost", where)
        project = values["project.id"]
        if not isinstance(project, str) or not project:
            raise ReportError(f"{where}: project.id is empty")
        sku_id, description = str(values["sku.id"]), str(values["sku.description"])
        days.add(day)
        cost_type = row.get("cost_type") or "regular"
        if cost_type != "regular":
            tally = not_usage.setdefault(str(cost_type), [0, 0])
            tally[0] += 1
            tally[1] += _signed_nanos(cost, where)
            continue
        nanos = _nanos(cost, 10**9, where)
        for name, amount in _credits(row.get("credits"), where):
            credits[name] = credits.get(name, 0) + _signed_nanos(amount, where)
            key = (day, f"credit {name}", "standard", CREDIT)
            costs[key] = costs.get(key, 0) + _signed_nanos(amount, where)
        entry = table.entries.get(description)
        if entry is None:
            gap = unmapped.setdefault((sku_id, description), [0, 0])
            gap[0] += 1
            gap[1] += nanos
            key = (day, f"{UNMAPPED_SKU} {sku_id} {description}", "standard", OTHER)
            costs[key] = costs.get(key, 0) + nanos
            continue
        unit = values["usage.unit"]
        if unit not in table.token_units:
            raise ReportError(
                f"{where}: SKU {sku_id} {description!r} is billed in {unit!r}, not in tokens "
                f"({', '.join(sorted(table.token_units))})"
            )
        amount = _decimal(values["usage.amount"], "usage.amount", where)
        if amount < 0 or amount != amount.to_integral_value():
            raise ReportError(f"{where}: usage.amount {amount} is no token count")
        tokens = usage.setdefault(
            (day, project, entry.model, entry.tier), dict.fromkeys(TOKEN_CLASSES, 0)
        )
        tokens[entry.token_class] += int(amount)
        key = (day, entry.model, entry.tier, entry.token_class)
        costs[key] = costs.get(key, 0) + nanos
    report = ProviderReport(PROVIDER, days=set(days))
    report.rows = [
        ProviderUsage(PROVIDER, day, project, model, tier, tokens, project=project)
        for (day, project, model, tier), tokens in sorted(usage.items())
    ]
    cost_report = CostReport(PROVIDER, days=set(days))
    cost_report.rows = [
        ProviderCost(PROVIDER, day, model, tier, token_class, nanos)
        for (day, model, tier, token_class), nanos in sorted(costs.items())
    ]
    gaps = [
        f"{UNMAPPED_SKU} {sku_id} {description}: {rows} row(s), {format_usd(nanos, 9)}"
        for (sku_id, description), (rows, nanos) in sorted(unmapped.items())
    ] + [
        f"not usage: {rows} row(s) of cost_type {kind}, {_usd(nanos)}"
        for kind, (rows, nanos) in sorted(not_usage.items())
    ]
    return GeminiExport(report, cost_report, gaps, credits)


def _signed_nanos(amount: Decimal, where: str) -> int:
    return _nanos(amount, 10**9, where) if amount >= 0 else -_nanos(-amount, 10**9, where)


def _usd(nanos: int) -> str:
    return ("-" if nanos < 0 else "") + format_usd(abs(nanos), 9)
