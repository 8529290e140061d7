"""Price files (YAML), read strictly: a typo, a float or a key given twice is an error.

A file holds one table, or several versions under ``versions:``::

    version: "2026-11-01"                  # recorded on every priced event
    effective_from: "2026-11-01T00:00:00Z" # RFC 3339 with a zone; a bare date is 00:00 UTC
    models:
      - match: claude-sonnet-4             # a model id: it and its snapshots
        input_per_mtok: "3.00"             # decimal USD per million tokens
        output_per_mtok: "15.00"
        cache_read_per_mtok: "0.30"        # optional, default 0.1 x input
        cache_write_per_mtok: "3.75"       # optional, default 1.25 x input (5-minute writes)
        cache_write_1h_per_mtok: "6.00"    # optional, default 2 x input
        long_context: {above_input_tokens: 200000, input_per_mtok: "6.00", output_per_mtok: "22.50"}
        unit_prices: {web_search: "0.01"}  # optional: USD per billed unit (schemas/billed_units.py)
        service_tiers: {batch: "0.5", priority: "1.7"}  # optional: token-price multipliers
        service_tier_rates: {batch: {cache_read_per_mtok: "0.30"}}  # optional: a class a
                                           # tier bills apart from its multiplier (USD / M);
                                           # long_context_cache_read_per_mtok... above the edge
        source: "litellm:claude-sonnet-4-5 (...)"  # optional provenance, kept in the file only
    fallback:                              # optional: charged for models nothing matches
      input_per_mtok: "10"
      output_per_mtok: "50"
    # or: fallback: {model: claude-opus-4-1}  (what that model costs in this version)

    # or, several versions in one file:
    versions:
      - {version: "2026-01-01", effective_from: "2026-01-01T00:00:00Z", models: [...]}
      - {version: "2026-11-01", effective_from: "2026-11-01T00:00:00Z", models: [...]}
      # a version may be written as its changes to an earlier one of the same file:
      - version: "2026-12-01"
        effective_from: "2026-12-01T00:00:00Z"
        extends: "2026-11-01"              # its entries and fallback, then:
        models: [...]                      # entries added, or replacing the same match
        remove: [gpt-4-32k]                # entries dropped (each must be in the base)

A version that ``extends`` another is resolved when the file is read: it is a whole
table like any other (its record carries every entry), so an older version keeps
its prices and the new one differs exactly where it says.

Prices are strings or integers, never floats (YAML reads ``3.0`` as a binary
float, which is not exact); negative prices are refused; unknown keys are
refused (a typo must not silently fall back to a default); a key given twice
in one mapping is refused. Errors name the file, the version, the model entry
and the field.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import UTC, date, datetime, time
from decimal import Decimal
from pathlib import Path
from typing import Any, Final

import yaml

from schemas.errors import ConfigError, ContractError
from schemas.money import parse_usd
from schemas.pricing.model_price import (
    FALLBACK_MATCH,
    MAX_SOURCE_CHARS,
    LongContextTier,
    ModelPrice,
    check_price,
)
from schemas.pricing.table import PriceTable

_MODEL_KEYS: Final = (
    "match",
    "input_per_mtok",
    "output_per_mtok",
    "cache_read_per_mtok",
    "cache_write_per_mtok",
    "cache_write_1h_per_mtok",
    "long_context",
    "unit_prices",
    "service_tiers",
    "service_tier_rates",
    "source",
)
_TIER_KEYS: Final = ("above_input_tokens", "input_per_mtok", "output_per_mtok")
_TABLE_KEYS: Final = ("version", "effective_from", "models", "fallback")
_DELTA_KEYS: Final = (*_TABLE_KEYS, "extends", "remove")


# libyaml's parser when PyYAML has it: the shipped file's thousands of nodes parse several
# times faster than in pure Python, which `spendbus price` pays on every call
_SAFE_LOADER: Final[type[yaml.SafeLoader]] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _StrictLoader(_SAFE_LOADER):  # type: ignore[misc,valid-type]  # a class chosen at import
    """SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                "while reading a mapping",
                node.start_mark,
                f"found the key {key!r} twice",
                key_node.start_mark,
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _construct_mapping,
)


def _yaml_price(value: Any, where: str, name: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, str | int | Decimal):
        if isinstance(value, float):
            raise ConfigError(
                f'{where}: field {name!r}: give prices as strings ("3.00") or integers, '
                f"not floats ({value!r} is not exact)"
            )
        raise ConfigError(f"{where}: field {name!r}: expected a decimal string, got {value!r}")
    try:
        price = parse_usd(value, what="price")
        if price == 0:
            price = abs(price)  # "-0" is 0
        return check_price(price, "price")
    except ContractError as exc:
        raise ConfigError(
            f"{where}: field {name!r}: {exc.detail.removeprefix('price: ')}"
        ) from None


def _unknown_keys(item: Mapping[str, Any], allowed: Iterable[str], where: str, hint: str) -> None:
    for key in item:
        if key not in allowed:
            raise ConfigError(
                f"{where}: field {key!r}: unknown field (expected one of "
                f"{', '.join(allowed)}){hint}"
            )


def _model_from_yaml(item: Any, where: str, *, fallback: bool = False) -> ModelPrice:
    if not isinstance(item, dict):
        raise ConfigError(f"{where}: must be a mapping with match, input_per_mtok, ...")
    allowed = _MODEL_KEYS[1:] if fallback else _MODEL_KEYS
    hint = " (the fallback applies to every model nothing matches: no 'match')" if fallback else ""
    _unknown_keys(item, allowed, where, hint)
    match = FALLBACK_MATCH
    if not fallback:
        given = item.get("match")
        if not isinstance(given, str) or not given.strip():
            raise ConfigError(f"{where}: field 'match': required, a model id prefix")
        match = given.strip()
        if "*" in match:
            raise ConfigError(
                f"{where}: field 'match': {match!r} is a prefix, not a glob: drop the '*'"
            )
    source = item.get("source")
    if source is not None and not isinstance(source, str):
        raise ConfigError(f"{where}: field 'source': a string (where the prices came from)")
    prices: dict[str, Decimal | None] = {}
    for name in _MODEL_KEYS[1:6]:
        value = item.get(name)
        if value is None:
            if name in ("input_per_mtok", "output_per_mtok"):
                raise ConfigError(f"{where}: field {name!r}: required")
            prices[name] = None
        else:
            prices[name] = _yaml_price(value, where, name)
    per_unit = _named_prices(item, "unit_prices", where)
    tiers = _named_prices(item, "service_tiers", where)
    tier_rates = _tier_rates(item, where)
    tier = item.get("long_context")
    long_context = None
    if tier is not None:
        tier_where = f"{where}: long_context"
        if not isinstance(tier, dict):
            raise ConfigError(f"{tier_where}: must be a mapping")
        _unknown_keys(
            tier,
            _TIER_KEYS,
            tier_where,
            " (cache prices in the tier scale with the tier's input price)",
        )
        above = tier.get("above_input_tokens")
        if type(above) is not int or above < 0:
            raise ConfigError(
                f"{tier_where}: field 'above_input_tokens': required, an integer >= 0, got {above!r}"
            )
        for name in ("input_per_mtok", "output_per_mtok"):
            if tier.get(name) is None:
                raise ConfigError(f"{tier_where}: field {name!r}: required")
        long_context = LongContextTier(
            above_input_tokens=above,
            input_per_mtok=_yaml_price(tier["input_per_mtok"], tier_where, "input_per_mtok"),
            output_per_mtok=_yaml_price(tier["output_per_mtok"], tier_where, "output_per_mtok"),
        )
    try:
        return ModelPrice.of(
            match,
            prices["input_per_mtok"],  # type: ignore[arg-type]  # required: checked not None above
            prices["output_per_mtok"],  # type: ignore[arg-type]  # required: checked not None above
            cache_read_per_mtok=prices["cache_read_per_mtok"],
            cache_write_per_mtok=prices["cache_write_per_mtok"],
            cache_write_1h_per_mtok=prices["cache_write_1h_per_mtok"],
            long_context=long_context,
            unit_prices=per_unit,
            service_tiers=tiers,
            service_tier_rates=tier_rates,
            source=source,
        )
    except ContractError as exc:
        raise ConfigError(f"{where}: {exc.detail}") from None


def _named_prices(item: Mapping[str, Any], key: str, where: str) -> dict[str, Decimal]:
    """``unit_prices`` (USD per unit) or ``service_tiers`` (multipliers): name -> decimal."""
    given = item.get(key)
    if given is None:
        return {}
    if not isinstance(given, dict):
        raise ConfigError(f"{where}: field {key!r}: a mapping of name to decimal string")
    return {str(name): _yaml_price(value, where, f"{key}.{name}") for name, value in given.items()}


def _tier_rates(item: Mapping[str, Any], where: str) -> dict[str, dict[str, Decimal]]:
    """``service_tier_rates``: tier -> {token price field -> decimal USD per million}."""
    given = item.get("service_tier_rates")
    if given is None:
        return {}
    if not isinstance(given, dict):
        raise ConfigError(
            f"{where}: field 'service_tier_rates': a mapping of tier to its token prices"
        )
    out: dict[str, dict[str, Decimal]] = {}
    for tier, rates in given.items():
        field_name = f"service_tier_rates.{tier}"
        if not isinstance(rates, dict):
            raise ConfigError(
                f"{where}: field {field_name!r}: a mapping of token price "
                "(input_per_mtok, cache_read_per_mtok...) to a decimal string"
            )
        out[str(tier)] = {
            str(name): _yaml_price(rate, where, f"{field_name}.{name}")
            for name, rate in rates.items()
        }
    return out


def _effective_from(value: Any, where: str) -> datetime:
    if isinstance(value, datetime):
        parsed = value
    elif isinstance(value, date):
        return datetime.combine(value, time(0), tzinfo=UTC)
    elif isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise ConfigError(
                f"{where}: field 'effective_from': not an RFC 3339 time: {value!r}"
            ) from None
        if len(value.strip()) == 10:  # a bare date
            return parsed.replace(tzinfo=UTC)
    else:
        raise ConfigError(f"{where}: field 'effective_from': required, an RFC 3339 time")
    if parsed.tzinfo is None:
        raise ConfigError(
            f"{where}: field 'effective_from': {value!s} needs a time zone (use Z for UTC)"
        )
    return parsed.astimezone(UTC)


def _table_from_yaml(
    doc: Any,
    source: str,
    index: int | None = None,
    earlier: Mapping[str, PriceTable] | None = None,
) -> PriceTable:
    label = f"version #{index + 1}" if index is not None else "table"
    if not isinstance(doc, dict):
        raise ConfigError(
            f"{source}: {label}: must be a mapping with version, effective_from, models"
        )
    version = doc.get("version")
    if isinstance(version, date):  # an unquoted 2026-11-01
        version = version.isoformat()
    elif type(version) is int:
        version = str(version)
    if not isinstance(version, str) or not version.strip():
        raise ConfigError(f"{source}: {label}: field 'version': required, a string")
    version = version.strip()
    where = f"{source}: version {version!r}"
    _unknown_keys(doc, _TABLE_KEYS if earlier is None else _DELTA_KEYS, where, "")
    effective_from = _effective_from(doc.get("effective_from"), where)
    base = _extended(doc, earlier or {}, where)
    models = doc.get("models")
    if not isinstance(models, list):
        raise ConfigError(f"{where}: field 'models': required, a list of model prices")
    prices: list[ModelPrice] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(models):
        match = item.get("match") if isinstance(item, dict) else None
        name = f"model {match!r}" if isinstance(match, str) else f"model #{i + 1}"
        price = _model_from_yaml(item, f"{where}: {name}")
        if price.match in seen:
            raise ConfigError(
                f"{where}: {name}: field 'match': also given by model #{seen[price.match] + 1}"
            )
        seen[price.match] = i
        prices.append(price)
    if base is not None:
        prices = _changed(base, prices, doc.get("remove"), where)
    fallback_doc = doc.get("fallback")
    fallback: ModelPrice | None
    if isinstance(fallback_doc, dict) and set(fallback_doc) == {"model"}:
        fallback = _named_fallback(fallback_doc["model"], prices, f"{where}: fallback")
    elif fallback_doc is None:
        fallback = None if base is None else base.fallback
    else:
        fallback = _model_from_yaml(fallback_doc, f"{where}: fallback", fallback=True)
    return PriceTable(
        version=version, effective_from=effective_from, models=tuple(prices), fallback=fallback
    )


def _extended(
    doc: Mapping[str, Any], earlier: Mapping[str, PriceTable], where: str
) -> PriceTable | None:
    """The version ``doc`` extends (one given before it in the file), or None."""
    name = doc.get("extends")
    if name is None:
        if "remove" in doc:
            raise ConfigError(f"{where}: field 'remove': only a version that 'extends' another")
        return None
    if isinstance(name, date):
        name = name.isoformat()
    if not isinstance(name, str) or name.strip() not in earlier:
        raise ConfigError(
            f"{where}: field 'extends': {name!r} is no version given before it in this file"
        )
    return earlier[name.strip()]


def _changed(
    base: PriceTable, given: list[ModelPrice], remove: Any, where: str
) -> list[ModelPrice]:
    """``base``'s entries with ``given`` replacing (same match) or added, ``remove`` dropped."""
    if remove is None:
        remove = []
    if not isinstance(remove, list) or not all(isinstance(m, str) for m in remove):
        raise ConfigError(f"{where}: field 'remove': a list of matches of the base version")
    by_match = {price.match: price for price in given}
    known = {price.match for price in base.models}
    for match in remove:
        if match not in known:
            raise ConfigError(f"{where}: field 'remove': {match!r} is no entry of {base.version!r}")
        if match in by_match:
            raise ConfigError(f"{where}: field 'remove': {match!r} is also given in 'models'")
    dropped = set(remove)
    out = [by_match.pop(p.match, p) for p in base.models if p.match not in dropped]
    return out + [price for price in given if price.match in by_match]


def _named_fallback(model: Any, prices: list[ModelPrice], where: str) -> ModelPrice:
    """``fallback: {model: NAME}``: unmatched models are charged what NAME is in this
    version (its entry copied as the fallback: the record carries the prices themselves)."""
    if not isinstance(model, str) or not model.strip():
        raise ConfigError(f"{where}: field 'model': a model id this version prices")
    entry = PriceTable(
        version="-", effective_from=datetime(2000, 1, 1, tzinfo=UTC), models=tuple(prices)
    ).lookup(model.strip())
    if entry is None:
        raise ConfigError(f"{where}: field 'model': {model!r} has no price in this version")
    note = f"fallback: the prices of {model.strip()!r} (entry {entry.match!r})"
    return replace(entry, match=FALLBACK_MATCH, source=note[:MAX_SOURCE_CHARS])


def price_table_from_yaml(doc: Any, *, source: str) -> PriceTable | list[PriceTable]:
    """One table (a mapping with ``version``) or several (a mapping with ``versions: [...]``)."""
    if isinstance(doc, dict) and "versions" in doc:
        extra = set(doc) - {"versions"}
        if extra:
            raise ConfigError(
                f"{source}: field {sorted(extra)[0]!r}: a file with 'versions' holds nothing else"
            )
        items = doc["versions"]
        if not isinstance(items, list) or not items:
            raise ConfigError(f"{source}: field 'versions': a non-empty list of price tables")
        tables: dict[str, PriceTable] = {}
        for i, item in enumerate(items):
            table = _table_from_yaml(item, source, i, tables)
            if table.version in tables:
                raise ConfigError(
                    f"{source}: version {table.version!r}: field 'version': given twice"
                )
            tables[table.version] = table
        return list(tables.values())
    if not isinstance(doc, dict) or "version" not in doc:
        raise ConfigError(
            f"{source}: expected a price table (version, effective_from, models) "
            "or 'versions: [...]'"
        )
    return _table_from_yaml(doc, source)


def load_price_file(path: str | Path) -> list[PriceTable]:
    """Every version in a YAML price file; ConfigError names the file, model and field."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        doc = yaml.load(text, Loader=_StrictLoader)  # a safe loader's subclass
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    tables = price_table_from_yaml(doc, source=str(path))
    return tables if isinstance(tables, list) else [tables]


def default_price_file() -> Path:
    """The price file shipped with spendbus (list prices; see its header for the as-of date)."""
    return Path(__file__).resolve().parent.parent / "data" / "prices.yaml"
