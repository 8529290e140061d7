"""Writing a price file: the inverse of ``schemas.pricing.load_price_file``.

Every price is written out (cache prices resolved, as the ``PriceTable`` record does)
as a quoted decimal string in plain digits, ``effective_from`` as RFC 3339 UTC, and
each entry's ``source`` when it has one; so reading the file back gives the same
tables, price for price and note for note (tests/cli/test_prices_sync.py holds it
with a property test).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml

from schemas.pricing import LongContextTier, ModelPrice, PriceTable

from .exact import price_text

_PRICE_FIELDS = (
    "input_per_mtok",
    "output_per_mtok",
    "cache_read_per_mtok",
    "cache_write_per_mtok",
    "cache_write_1h_per_mtok",
)


def _tier(tier: LongContextTier) -> dict[str, Any]:
    return {
        "above_input_tokens": tier.above_input_tokens,
        "input_per_mtok": price_text(tier.input_per_mtok),
        "output_per_mtok": price_text(tier.output_per_mtok),
    }


def model_entry(price: ModelPrice, *, fallback: bool = False) -> dict[str, Any]:
    entry: dict[str, Any] = {} if fallback else {"match": price.match}
    for name in _PRICE_FIELDS:
        entry[name] = price_text(getattr(price, name))
    if price.long_context is not None:
        entry["long_context"] = _tier(price.long_context)
    if price.unit_prices:
        entry["unit_prices"] = {unit: price_text(usd) for unit, usd in price.unit_prices}
    if price.service_tiers:
        entry["service_tiers"] = {tier: price_text(f) for tier, f in price.service_tiers}
    if price.service_tier_rates:
        entry["service_tier_rates"] = {
            tier: {name: price_text(rate) for name, rate in rates}
            for tier, rates in price.service_tier_rates
        }
    if price.source is not None:
        entry["source"] = price.source
    return entry


def table_document(table: PriceTable) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "version": table.version,
        "effective_from": table.effective_from.strftime("%Y-%m-%dT%H:%M:%S.%fZ").replace(
            ".000000Z", "Z"
        ),
        "models": [model_entry(m) for m in table.models],
    }
    if table.fallback is not None:
        doc["fallback"] = model_entry(table.fallback, fallback=True)
    return doc


class _Quoted(str):
    """A value written double-quoted: a version ``2026-12-02`` or a price ``3.00`` stays a
    string when read back (keys stay plain)."""


class _Dumper(yaml.SafeDumper):
    pass


def _quoted(dumper: yaml.SafeDumper, value: _Quoted) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", str(value), style='"')


_Dumper.add_representer(_Quoted, _quoted)


def _quote_values(node: Any) -> Any:
    if isinstance(node, dict):
        return {key: _quote_values(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_quote_values(item) for item in node]
    return _Quoted(node) if isinstance(node, str) else node


def price_file_text(tables: Iterable[PriceTable], *, header: str = "") -> str:
    """A price file holding ``tables`` (``versions:``, oldest ``effective_from`` first)."""
    ordered = sorted(tables, key=lambda t: (t.effective_from, t.version))
    body = yaml.dump(
        _quote_values({"versions": [table_document(t) for t in ordered]}),
        Dumper=_Dumper,
        sort_keys=False,
        allow_unicode=True,
        width=100,
    )
    comment = "".join(f"# {line}\n".replace("# \n", "#\n") for line in header.splitlines())
    return comment + body
