"""The deliberate differences of ``make prices`` (``schemas/data/price_decisions.yaml``):
the entries that differ from where both maps agree, each with its reason and provider
page (``decisions``), and the service tiers taken from one map where the other does not
model them (``one_map_tiers``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml

from schemas.errors import ConfigError
from schemas.pricing import PriceTable, price_table_from_yaml

from .oracles import MAPS, SERVICE_TIERS, TIER_NEEDS, TIER_RATE_CLASSES


@dataclass(frozen=True)
class OneMapTiers:
    """Service tiers one map prices and the other does not model for a provider (no such
    tier on any of its models): the map's rates are imported for the models whose id
    starts with ``models_starting`` (``price_decisions.yaml`` ``one_map_tiers``, each
    with its reason and the provider page that prices the tiers)."""

    map: str
    models_starting: str
    tiers: tuple[str, ...]
    reason: str
    page: str


def one_map_tiers(
    model: str, rates: Mapping[str, Mapping[str, Any]], rules: Iterable[OneMapTiers]
) -> dict[str, dict[str, Decimal]]:
    """The tiers of ``model`` a rule takes from one map: the map gives the tier (with
    input and output rates) and the other map gives no such tier for the model."""
    out: dict[str, dict[str, Decimal]] = {}
    for rule in rules:
        if not model.startswith(rule.models_starting):
            continue
        (other,) = (name for name in MAPS if name != rule.map)
        for tier in rule.tiers:
            given = rates.get(rule.map, {}).get("tiers", {}).get(tier)
            if given is None or not all(k in given for k in TIER_NEEDS):
                continue
            if tier in rates.get(other, {}).get("tiers", {}):
                continue  # both price it: agreement decides
            out[tier] = {k: Decimal(given[k]) for k in TIER_RATE_CLASSES if k in given}
    return out


def load_decisions(path: Path) -> list[dict[str, Any]]:
    """The deliberate differences: ``decisions: [{match, reason, page, ...}]``. With price
    fields, the entry as written; with ``cases`` (the calls that differ, as the oracle test
    names them), a difference the table cannot express, the entry left as made; with
    neither, the hand-written version's entry kept."""
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    items = doc.get("decisions") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise ConfigError(f"{path}: field 'decisions': a list")
    for item in items:
        if not isinstance(item, dict) or not all(
            isinstance(item.get(k), str) and item[k].strip() for k in ("match", "reason", "page")
        ):
            raise ConfigError(f"{path}: every decision names its match, reason and page: {item!r}")
        if not str(item["page"]).startswith("https://"):
            raise ConfigError(f"{path}: {item['match']}: page: the provider page (https://...)")
    return items


def load_one_map_tiers(path: Path) -> list[OneMapTiers]:
    """``one_map_tiers: [{map, models_starting, tiers, reason, page}]`` of the decisions
    file (none when absent)."""
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    items = doc.get("one_map_tiers", []) if isinstance(doc, dict) else []
    if not isinstance(items, list):
        raise ConfigError(f"{path}: field 'one_map_tiers': a list")
    rules = []
    for item in items:
        where = f"{path}: one_map_tiers: {item!r}"
        if not isinstance(item, dict) or set(item) != {
            "map",
            "models_starting",
            "tiers",
            "reason",
            "page",
        }:
            raise ConfigError(f"{where}: needs map, models_starting, tiers, reason and page")
        if item["map"] not in MAPS:
            raise ConfigError(f"{where}: field 'map': one of {', '.join(MAPS)}")
        tiers = item["tiers"]
        if not isinstance(tiers, list) or not tiers or not set(tiers) <= set(SERVICE_TIERS):
            raise ConfigError(f"{where}: field 'tiers': a list of {', '.join(SERVICE_TIERS)}")
        if not str(item["page"]).startswith("https://") or not str(item["reason"]).strip():
            raise ConfigError(f"{where}: the reason and the provider page (https://...)")
        rules.append(
            OneMapTiers(
                map=item["map"],
                models_starting=str(item["models_starting"]),
                tiers=tuple(tiers),
                reason=str(item["reason"]),
                page=str(item["page"]),
            )
        )
    return rules


def decided(
    base: PriceTable, table: PriceTable, decisions: Iterable[Mapping[str, Any]]
) -> PriceTable:
    """``table`` with each decision applied: its entry as written (a decision with prices),
    else the base version's entry kept."""
    models = {m.match: m for m in table.models}
    kept = {m.match: m for m in base.models}
    for decision in decisions:
        match = decision["match"]
        given = {k: v for k, v in decision.items() if k not in ("reason", "page", "cases")}
        if set(given) == {"match"} and "cases" in decision:
            continue  # a difference the price table cannot express: said, not changed
        if set(given) == {"match"}:
            if match in kept:
                models[match] = kept[match]
            else:
                models.pop(match, None)
            continue
        given.setdefault("source", f"decision: {decision['page']}")
        entry = price_table_from_yaml(
            {"version": "d", "effective_from": "2000-01-01", "models": [given]}, source="decision"
        )
        assert isinstance(entry, PriceTable)
        models[match] = entry.models[0]
    return replace(table, models=tuple(models.values()))
