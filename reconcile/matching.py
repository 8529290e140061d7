"""Both sides matched cell by cell, and each delta explained by its cause.

A cell is (provider, UTC day, credential, model, tier); in it each token class
(:data:`~reconcile.provider_reports.TOKEN_CLASSES`) has the provider's amount, the
ledger's and their delta (provider − spendbus). The spendbus side is read from the
ledger's ``usage_events`` (:func:`ledger_sql`: any SQL runner, the worker's ``/sql``
included). Only the days a provider report covers are matched.

Causes (:data:`CAUSES`), each named where it applies:

- ``unmapped_credential``: a provider key no gateway credential maps to, or a credential
  with no mapping: a gap, never matched against another key;
- ``estimate``: the ledger charged calls of the cell by estimate (usage unread: a client
  hang-up, a cut stream), so its tokens are a guess;
- ``bypass``: the provider served calls the ledger never saw (more requests, or none in
  the ledger at all): traffic that went around the gateway;
- ``batch_tier``: such traffic in the batch tier (the Batch APIs are not proxied);
- ``cache_ttl``: cache writes split differently between the 5-minute and 1-hour TTLs;
- ``unpriced``: the ledger charged the cell's calls $0 (no price for the model): its
  tokens may agree, its cost cannot;
- ``unmapped_sku``: money a billing export charged under a SKU the SKU table does not
  know (Gemini: ``data/gemini_skus.yaml``): a gap, named with the SKU, never guessed;
- ``long_context``: the tokens agree and the money differs by exactly the long-context
  step of the ledger's calls that crossed their model's edge (the prompt above
  ``above_input_tokens``) in a reference price table (the shipped one by default): the
  provider billed those calls at the long-context tier the ledger's table did not apply
  (:func:`long_context_sql`, checked in ``run.py``);
- ``price``: the tokens agree and the cost does not: spendbus's price table differs from
  the rate the provider billed (its effective rate per class is shown); money billed
  where no token was (a tool's fee, storage) is ``unexplained``, never a price.

A cell whose tokens differ and that no token cause explains is ``unexplained``: its delta
is the residual. Costs are matched by (provider, day, model, tier) (:class:`CostCell`: the
cost reports name no key); a cost cell takes the token causes of its token cells.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date, timedelta
from decimal import Decimal
from typing import Any

from .mapping import CredentialMapping
from .provider_reports import IMPORT_PROVIDERS, TOKEN_CLASSES, ProviderCost, ProviderUsage

CAUSES = (
    "unmapped_credential",
    "estimate",
    "bypass",
    "batch_tier",
    "cache_ttl",
    "unpriced",
    "unmapped_sku",
    "long_context",
    "price",
    "unexplained",
)
#: the causes that explain a token delta (the others explain a cost, never tokens)
TOKEN_CAUSES = frozenset(CAUSES) - {
    "unpriced",
    "unmapped_sku",
    "long_context",
    "price",
    "unexplained",
}
#: a model id the ledger's SQL may name in a literal (anything else is never queried)
SAFE_MODEL = re.compile(r"[A-Za-z0-9._:/@+-]{1,200}")
#: the model name an export's money of an unknown SKU is kept under (gemini_export.py)
UNMAPPED_SKU = "unmapped SKU"
#: the class of a billing export's credits (negative nanos): shown by day, never matched
CREDIT = "credit"


@dataclass
class LedgerCell:
    """The ledger's side of a cell."""

    requests: int = 0
    estimated_calls: int = 0
    unpriced_calls: int = 0
    cost_nanos: int = 0
    tokens: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TOKEN_CLASSES, 0))


@dataclass
class Cell:
    provider: str
    day: date
    credential: str  # the gateway's secret_id, or "" when no credential maps
    api_key_id: str  # the provider's key id, or "" when the credential has no mapping
    model: str
    tier: str
    provider_tokens: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TOKEN_CLASSES, 0))
    provider_requests: int | None = None
    billed: bool = False  # the provider reported the cell
    ledger: LedgerCell | None = None
    causes: list[str] = field(default_factory=list)

    @property
    def spendbus_tokens(self) -> dict[str, int]:
        return self.ledger.tokens if self.ledger else dict.fromkeys(TOKEN_CLASSES, 0)

    @property
    def deltas(self) -> dict[str, int]:
        return {c: self.provider_tokens[c] - self.spendbus_tokens[c] for c in TOKEN_CLASSES}

    @property
    def residual(self) -> dict[str, int]:
        """The deltas no cause explains (all zero once a token cause is named)."""
        if "unexplained" in self.causes:
            return self.deltas
        return dict.fromkeys(TOKEN_CLASSES, 0)

    def as_dict(self) -> dict[str, Any]:
        ledger = self.ledger or LedgerCell()
        return {
            "provider": self.provider,
            "day": self.day.isoformat(),
            "credential": self.credential or None,
            "api_key_id": self.api_key_id or None,
            "model": self.model,
            "tier": self.tier,
            "provider_tokens": dict(self.provider_tokens),
            "spendbus_tokens": dict(self.spendbus_tokens),
            "deltas": self.deltas,
            "residual": self.residual,
            "provider_requests": self.provider_requests,
            "spendbus_requests": ledger.requests,
            "estimated_calls": ledger.estimated_calls,
            "unpriced_calls": ledger.unpriced_calls,
            "spendbus_cost_nanos": ledger.cost_nanos,
            "causes": list(self.causes),
        }


def ledger_sql(provider: str, first: date, last: date) -> str:
    """The ledger's cells of ``provider`` for the UTC days [first, last], as plain SQL (the
    worker's read-only ``/sql`` takes no parameters: every value here is checked)."""
    if (
        provider not in IMPORT_PROVIDERS
        or not isinstance(first, date)
        or not isinstance(last, date)
    ):
        raise ValueError(f"no ledger query for {provider!r} {first!r}..{last!r}")
    tier = _tier_sql(provider)
    end = last + timedelta(days=1)
    return f"""
        SELECT toString(toDate(occurred_at, 'UTC')) AS day, secret_id, model, {tier} AS tier,
               countIf(charge_of IS NULL AND status_code BETWEEN 200 AND 299) AS requests,
               countIf(usage_source = 'estimated') AS estimated_calls,
               countIf(unpriced) AS unpriced_calls,
               sum(cost_nanos) AS cost_nanos,
               sum(input_tokens) AS input,
               sum(cache_read_tokens) AS cache_read,
               sum(cache_write_tokens - cache_write_1h_tokens) AS cache_write_5m,
               sum(cache_write_1h_tokens) AS cache_write_1h,
               sum(output_tokens) AS output
        FROM usage_events
        WHERE provider = '{provider}'
          AND occurred_at >= toDateTime64('{first.isoformat()} 00:00:00', 6, 'UTC')
          AND occurred_at < toDateTime64('{end.isoformat()} 00:00:00', 6, 'UTC')
        GROUP BY day, secret_id, model, tier
        ORDER BY day, secret_id, model, tier
    """


def _tier_sql(provider: str) -> str:
    """The tier of a ledger row, as ``provider``'s reports split tiers."""
    if provider in ("openai", "bedrock"):  # their reports split the batch tier only
        return "if(service_tier = 'batch', 'batch', 'standard')"
    return "multiIf(service_tier IN ('batch', 'priority'), assumeNotNull(service_tier), 'standard')"


def long_context_sql(provider: str, day: date, model: str, tier: str, edge: int) -> str | None:
    """The ledger's calls of a cost cell whose prompt (input + cache reads + cache writes)
    is above ``edge``, one row each: occurred_at (µs), the five token counts as the price
    book reads them, cost_nanos, service_tier. None when the model id is no plain id
    (a report's text never goes into SQL unchecked)."""
    if (
        provider not in IMPORT_PROVIDERS
        or not isinstance(day, date)
        or not SAFE_MODEL.fullmatch(model)
        or tier not in ("standard", "batch", "priority")
        or type(edge) is not int
        or edge < 0
    ):
        return None
    end = day + timedelta(days=1)
    return f"""
        SELECT toUnixTimestamp64Micro(occurred_at) AS at_us, input_tokens, cache_read_tokens,
               cache_write_tokens, cache_write_1h_tokens, output_tokens, cost_nanos, service_tier
        FROM usage_events
        WHERE provider = '{provider}' AND model = '{model}'
          AND occurred_at >= toDateTime64('{day.isoformat()} 00:00:00', 6, 'UTC')
          AND occurred_at < toDateTime64('{end.isoformat()} 00:00:00', 6, 'UTC')
          AND {_tier_sql(provider)} = '{tier}'
          AND input_tokens + cache_read_tokens + cache_write_tokens > {edge}
        ORDER BY at_us
    """


def read_ledger(
    run_query: Callable[[str], Sequence[Sequence[Any]]], provider: str, first: date, last: date
) -> dict[tuple[date, str, str, str], LedgerCell]:
    """The ledger's cells, by (day, secret_id, model, tier)."""
    cells: dict[tuple[date, str, str, str], LedgerCell] = {}
    for row in run_query(ledger_sql(provider, first, last)):
        day, secret_id, model, tier, requests, estimated, unpriced, cost, *tokens = row
        cells[(date.fromisoformat(str(day)), str(secret_id), str(model), str(tier))] = LedgerCell(
            requests=int(requests),
            estimated_calls=int(estimated),
            unpriced_calls=int(unpriced),
            cost_nanos=int(cost),
            tokens={c: int(v) for c, v in zip(TOKEN_CLASSES, tokens, strict=True)},
        )
    return cells


def match(
    provider: str,
    days: Iterable[date],
    provider_rows: Iterable[ProviderUsage],
    ledger: dict[tuple[date, str, str, str], LedgerCell],
    mapping: CredentialMapping,
) -> list[Cell]:
    """Every cell of the covered ``days``, matched and explained."""
    covered = set(days)
    cells: dict[tuple[date, str, str, str, str], Cell] = {}
    for row in provider_rows:
        if row.day not in covered:
            continue
        secret = mapping.secret_of(provider, row.api_key_id) or ""
        key = (row.day, secret, row.api_key_id, row.model, row.tier)
        cell = cells.get(key) or Cell(
            provider, row.day, secret, row.api_key_id, row.model, row.tier
        )
        cells[key] = cell
        cell.billed = True
        for c in TOKEN_CLASSES:
            cell.provider_tokens[c] += row.tokens.get(c, 0)
        if row.requests is not None:
            cell.provider_requests = (cell.provider_requests or 0) + row.requests
    for (day, secret, model, tier), side in ledger.items():
        if day not in covered:
            continue
        key_id = mapping.key_of(secret, provider) or ""
        key = (day, secret, key_id, model, tier)
        cell = cells.get(key) or Cell(provider, day, secret, key_id, model, tier)
        cells[key] = cell
        cell.ledger = side
    for cell in cells.values():
        cell.causes = causes_of(cell)
    return sorted(
        cells.values(), key=lambda c: (c.day, c.credential, c.api_key_id, c.model, c.tier)
    )


def causes_of(cell: Cell) -> list[str]:
    """The causes that apply to ``cell`` (see the module doc), in :data:`CAUSES` order."""
    found: set[str] = set()
    deltas = cell.deltas
    differs = any(deltas.values())
    if not cell.credential or not cell.api_key_id:
        found.add("unmapped_credential")
    ledger = cell.ledger
    if ledger is not None:
        if ledger.estimated_calls and differs:
            found.add("estimate")
        if ledger.unpriced_calls:
            found.add("unpriced")
    # an unmapped key is a gap of its own: it cannot be told apart from traffic around
    unseen = (
        "unmapped_credential" not in found
        and cell.billed
        and (
            ledger is None
            or (cell.provider_requests is not None and cell.provider_requests > ledger.requests)
        )
    )
    if unseen:
        found.add("batch_tier" if cell.tier == "batch" else "bypass")
    writes = ("cache_write_5m", "cache_write_1h")
    if deltas["cache_write_5m"] and deltas["cache_write_5m"] + deltas["cache_write_1h"] == 0:
        found.add("cache_ttl")
        # a TTL split explains the write classes only: anything else still needs a cause
        if any(deltas[c] for c in TOKEN_CLASSES if c not in writes) and not found & {
            "estimate",
            "bypass",
            "batch_tier",
            "unmapped_credential",
        }:
            found.add("unexplained")
    if differs and not found & TOKEN_CAUSES:
        found.add("unexplained")
    return [c for c in CAUSES if c in found]


@dataclass
class CostCell:
    """Both sides' cost of a (provider, day, model, tier), in nanos."""

    provider: str
    day: date
    model: str
    tier: str
    provider_nanos: int = 0
    spendbus_nanos: int = 0
    #: the provider's nanos per token class (``other``: what it bills beyond tokens)
    provider_classes: dict[str, int] = field(default_factory=dict)
    #: the tokens of each class the provider's usage report counts for the cell
    provider_tokens: dict[str, int] = field(default_factory=dict)
    causes: list[str] = field(default_factory=list)
    #: cause ``long_context``: the ledger's calls above the edge, and the edge (prompt tokens)
    long_context_calls: int = 0
    long_context_edge: int | None = None

    @property
    def delta(self) -> int:
        return self.provider_nanos - self.spendbus_nanos

    @property
    def residual(self) -> int:
        return self.delta if "unexplained" in self.causes else 0

    def effective_rates(self) -> dict[str, str]:
        """What the provider billed per million tokens of each class (USD, exact)."""
        return {
            # nanos per token / 1000 = USD per million tokens
            c: str(Decimal(nanos) / Decimal(self.provider_tokens[c]) / 1000)
            for c, nanos in sorted(self.provider_classes.items())
            if self.provider_tokens.get(c)
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "day": self.day.isoformat(),
            "model": self.model,
            "tier": self.tier,
            "provider_nanos": self.provider_nanos,
            "spendbus_nanos": self.spendbus_nanos,
            "delta_nanos": self.delta,
            "residual_nanos": self.residual,
            "effective_usd_per_mtok": self.effective_rates(),
            "long_context_calls": self.long_context_calls,
            "long_context_edge": self.long_context_edge,
            "causes": list(self.causes),
        }


def match_costs(
    provider: str, days: Iterable[date], rows: Iterable[ProviderCost], token_cells: Iterable[Cell]
) -> list[CostCell]:
    """Every (day, model, tier) cost of the covered ``days``, matched and explained by the
    causes of its token cells (see the module doc)."""
    covered = set(days)
    cells: dict[tuple[date, str, str], CostCell] = {}
    inherited: dict[tuple[date, str, str], set[str]] = {}
    for row in rows:
        if row.day not in covered:
            continue
        key = (row.day, row.model, row.tier)
        cell = cells.setdefault(key, CostCell(provider, *key))
        cell.provider_nanos += row.nanos
        cell.provider_classes[row.token_class] = (
            cell.provider_classes.get(row.token_class, 0) + row.nanos
        )
    for token_cell in token_cells:
        if token_cell.day not in covered:
            continue
        key = (token_cell.day, token_cell.model, token_cell.tier)
        cell = cells.setdefault(key, CostCell(provider, *key))
        if token_cell.ledger is not None:
            cell.spendbus_nanos += token_cell.ledger.cost_nanos
        for c in TOKEN_CLASSES:
            cell.provider_tokens[c] = cell.provider_tokens.get(c, 0) + token_cell.provider_tokens[c]
        inherited.setdefault(key, set()).update(token_cell.causes)
    for key, cell in cells.items():
        causes = inherited.get(key, set())
        found = causes & (TOKEN_CAUSES | {"unpriced"})
        if cell.model.startswith(f"{UNMAPPED_SKU} "):
            found = {"unmapped_sku"}
        if cell.delta and not found:
            # a price explains money only where tokens were billed and agree
            priced = any(cell.provider_tokens.values()) and "unexplained" not in causes
            found.add("price" if priced else "unexplained")
        cell.causes = [c for c in CAUSES if c in found] if cell.delta else []
    return [cells[k] for k in sorted(cells)]


@dataclass
class DaySummary:
    provider: str
    day: date
    provider_tokens: int
    spendbus_tokens: int
    explained: dict[str, int]  # token cause -> |delta| tokens of the cells it is named in
    residual: int  # |delta| tokens of the unexplained cells
    unpriced_calls: int = 0  # calls the ledger charged $0 (no price for the model)
    provider_nanos: int | None = None  # None: no cost report covers the day
    spendbus_nanos: int = 0
    cost_explained: dict[str, int] = field(default_factory=dict)  # cause -> |delta| nanos
    cost_residual: int = 0
    credit_nanos: int = 0  # credits the provider applied (<= 0), beside the cost, not in it

    def as_dict(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "day": self.day.isoformat(),
            "provider_tokens": self.provider_tokens,
            "spendbus_tokens": self.spendbus_tokens,
            "explained": dict(self.explained),
            "residual": self.residual,
            "unpriced_calls": self.unpriced_calls,
            "provider_nanos": self.provider_nanos,
            "spendbus_nanos": self.spendbus_nanos,
            "cost_explained": dict(self.cost_explained),
            "cost_residual_nanos": self.cost_residual,
            "credit_nanos": self.credit_nanos,
        }


def summarize(cells: Iterable[Cell], costs: Iterable[CostCell] = ()) -> list[DaySummary]:
    """Per (provider, day): both totals, the delta each cause explains, the residual; in
    tokens, and in nanos where a cost report covers the day."""
    days: dict[tuple[str, date], DaySummary] = {}
    for cost in costs:
        summary = days.get((cost.provider, cost.day)) or DaySummary(
            cost.provider, cost.day, 0, 0, {}, 0
        )
        days[(cost.provider, cost.day)] = summary
        summary.provider_nanos = (summary.provider_nanos or 0) + cost.provider_nanos
        summary.spendbus_nanos += cost.spendbus_nanos
        summary.cost_residual += abs(cost.residual)
        for cause in cost.causes:
            if cause != "unexplained":
                summary.cost_explained[cause] = summary.cost_explained.get(cause, 0) + abs(
                    cost.delta
                )
    for cell in cells:
        summary = days.get((cell.provider, cell.day)) or DaySummary(
            cell.provider, cell.day, 0, 0, {}, 0
        )
        days[(cell.provider, cell.day)] = summary
        summary.provider_tokens += sum(cell.provider_tokens.values())
        summary.spendbus_tokens += sum(cell.spendbus_tokens.values())
        off = sum(abs(d) for d in cell.deltas.values())
        summary.residual += sum(abs(d) for d in cell.residual.values())
        for cause in cell.causes:
            if cause in TOKEN_CAUSES and off:
                summary.explained[cause] = summary.explained.get(cause, 0) + off
        if cell.ledger is not None:
            summary.unpriced_calls += cell.ledger.unpriced_calls
    return [days[k] for k in sorted(days)]
