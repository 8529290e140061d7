"""Every price that differs between two price versions (``spendbus prices diff``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from schemas.pricing import FALLBACK_MATCH, ModelPrice, PriceTable

from .exact import price_text

Change = Literal["added", "removed", "changed"]

_FIELDS = (
    "input_per_mtok",
    "output_per_mtok",
    "cache_read_per_mtok",
    "cache_write_per_mtok",
    "cache_write_1h_per_mtok",
)


@dataclass(frozen=True, slots=True)
class PriceChange:
    """One price of one entry: ``old`` None when added, ``new`` None when removed."""

    match: str
    field: str
    change: Change
    old: str | None
    new: str | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "match": self.match,
            "field": self.field,
            "change": self.change,
            "old": self.old,
            "new": self.new,
        }

    def line(self) -> str:
        mark = {"added": "+", "removed": "-", "changed": "~"}[self.change]
        if self.change == "changed":
            return f"{mark} {self.match}  {self.field}  {self.old} -> {self.new}"
        return f"{mark} {self.match}  {self.field}  {self.new if self.old is None else self.old}"


def _prices(price: ModelPrice) -> dict[str, str]:
    """Each price of an entry, exact text keyed by field (tier fields as ``long_context.*``)."""
    out = {name: price_text(getattr(price, name)) for name in _FIELDS}
    tier = price.long_context
    if tier is not None:
        out["long_context.above_input_tokens"] = str(tier.above_input_tokens)
        out["long_context.input_per_mtok"] = price_text(tier.input_per_mtok)
        out["long_context.output_per_mtok"] = price_text(tier.output_per_mtok)
    for unit, usd in price.unit_prices:
        out[f"unit_prices.{unit}"] = price_text(usd)
    for name, factor in price.service_tiers:
        out[f"service_tiers.{name}"] = price_text(factor)
    for name, rates in price.service_tier_rates:
        for field, rate in rates:
            out[f"service_tier_rates.{name}.{field}"] = price_text(rate)
    return out


def _equal(field: str, a: str, b: str) -> bool:
    from decimal import Decimal

    return Decimal(a) == Decimal(b)  # 3.00 and 3 are the same price


def diff_tables(old: PriceTable, new: PriceTable) -> list[PriceChange]:
    """Every added, removed or changed price, by entry (``*`` is the fallback), in order."""
    before = {m.match: m for m in old.models}
    after = {m.match: m for m in new.models}
    if old.fallback is not None:
        before[FALLBACK_MATCH] = old.fallback
    if new.fallback is not None:
        after[FALLBACK_MATCH] = new.fallback
    changes: list[PriceChange] = []
    for match in sorted(before.keys() | after.keys()):
        a = _prices(before[match]) if match in before else {}
        b = _prices(after[match]) if match in after else {}
        for field in sorted(a.keys() | b.keys(), key=_field_order):
            if field not in a:
                changes.append(PriceChange(match, field, "added", None, b[field]))
            elif field not in b:
                changes.append(PriceChange(match, field, "removed", a[field], None))
            elif not _equal(field, a[field], b[field]):
                changes.append(PriceChange(match, field, "changed", a[field], b[field]))
    return changes


def _field_order(field: str) -> tuple[int, str]:
    order = [*_FIELDS, "long_context.above_input_tokens", "long_context.input_per_mtok"]
    return (order.index(field) if field in order else len(order), field)
