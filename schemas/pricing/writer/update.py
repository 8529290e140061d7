"""A new dated price version from our newest one and a community source.

Each source price is matched to the entry of our table that prices its id: the
entry whose ``match`` equals the id, else the longest ``match`` of which the id as
written is a snapshot form (``gpt-5-2025-08-07`` of ``gpt-5``; never another version:
``gpt-5.4`` does not update ``gpt-5``; schemas/pricing/model_ids.py), with no other
normalisation: a Bedrock ``anthropic.claude-...`` id never updates the first-party
``claude-...`` entry, whose price differs. For each entry:

- no source price matched: kept as it is (prices and provenance);
- a source price whose id is the entry's ``match`` wins; else the matched ids must
  agree, or the entry is kept and the disagreement reported as a conflict;
- the chosen price replaces ours field by field. A cache price the source does not
  give is kept when ours was set apart from the input price, and follows the new
  input price by the usual ratio when ours was that ratio's default; a
  long-context tier the source does not give is kept (and said so).

Source ids matching no entry become new entries (``match`` = the id) with
``add_new``; they are reported otherwise. Updated and new entries carry the
source's provenance in ``source``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal, localcontext
from typing import Any

from schemas.errors import ConfigError, ContractError
from schemas.pricing import (
    DEFAULT_CACHE_READ_RATIO,
    DEFAULT_CACHE_WRITE_1H_RATIO,
    DEFAULT_CACHE_WRITE_RATIO,
    ModelPrice,
    PriceTable,
    is_snapshot_suffix,
)

from .exact import price_text
from .sources import SourceFile, SourcePrice


@dataclass
class ImportReport:
    """What an import did, entry by entry (``spendbus prices import`` prints it)."""

    updated: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    not_in_source: list[str] = field(default_factory=list)
    new_in_source: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, list[str]]:
        return {
            "updated": self.updated,
            "added": self.added,
            "unchanged": self.unchanged,
            "not_in_source": self.not_in_source,
            "new_in_source": self.new_in_source,
            "conflicts": self.conflicts,
            "notes": self.notes,
        }


def _owner(table: PriceTable, model: str) -> str | None:
    """The ``match`` of ``table`` that prices ``model`` as written: equal, else the
    longest of which ``model`` is a snapshot form."""
    best: str | None = None
    for entry in table.models:
        size = len(entry.match)
        if (
            model.startswith(entry.match)
            and is_snapshot_suffix(model[size:])
            and (best is None or size > len(best))
        ):
            best = entry.match
    return best


_OPTIONAL = (
    "cache_read_per_mtok",
    "cache_write_per_mtok",
    "cache_write_1h_per_mtok",
    "long_context",
    "unit_prices",
    "service_tiers",
    "service_tier_rates",
)


def _choose(match: str, group: list[SourcePrice]) -> tuple[SourcePrice | None, str | None]:
    """The source price an entry takes, or (None, why not).

    The ids equal to ``match`` if any, else all the ids it prices: every price they give
    must agree (a price one id gives and another omits is taken from the one that
    gives it); the provenance names them all."""
    exact = [p for p in group if p.model == match]
    pool = sorted(exact or group, key=lambda p: p.source)
    combined: dict[str, Any] = {}
    for name in ("input_per_mtok", "output_per_mtok", *_OPTIONAL):
        values = []
        for price in pool:
            value = getattr(price, name)
            if value is not None and value != () and value not in values:
                values.append(value)
        if len(values) > 1:
            said = "; ".join(f"{p.source} {_text(getattr(p, name))}" for p in pool)
            return None, f"{match}: the source's ids disagree on {name} ({said}): kept"
        combined[name] = values[0] if values else (() if name in _PAIRS else None)
    source = ", ".join(p.source for p in pool)
    return SourcePrice(model=pool[0].model, source=source, **combined), None


_PAIRS = ("unit_prices", "service_tiers", "service_tier_rates")


def _disagrees(price: SourcePrice, chosen: SourcePrice) -> bool:
    """``price`` gives a price the chosen one does not agree with."""
    for name in ("input_per_mtok", "output_per_mtok", *_OPTIONAL):
        value = getattr(price, name)
        if value is not None and value != () and value != getattr(chosen, name):
            return True
    return False


def _text(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, Decimal):
        return price_text(value)
    if isinstance(value, tuple):  # (name, price) pairs: unit prices, tiers
        return repr(value)
    return f"above {value.above_input_tokens}: {price_text(value.input_per_mtok)}/{price_text(value.output_per_mtok)}"


def _scaled(base: Decimal, ratio: Decimal) -> Decimal:
    with localcontext() as ctx:
        ctx.prec = 100
        return base * ratio


def _merged(ours: ModelPrice, theirs: SourcePrice, report: ImportReport, label: str) -> ModelPrice:
    def cache(given: Decimal | None, current: Decimal, ratio: Decimal) -> Decimal:
        if given is not None:
            return given
        if current == _scaled(ours.input_per_mtok, ratio):  # ours was the default ratio
            return _scaled(theirs.input_per_mtok, ratio)
        return current

    tier_side: SourcePrice | ModelPrice = (
        theirs if theirs.service_tiers or theirs.service_tier_rates else ours
    )
    tier = theirs.long_context
    if tier is None and ours.long_context is not None:
        tier = ours.long_context
        report.notes.append(f"{ours.match}: long_context kept (the source gives none)")
    return ModelPrice(
        match=ours.match,
        input_per_mtok=theirs.input_per_mtok,
        output_per_mtok=theirs.output_per_mtok,
        cache_read_per_mtok=cache(
            theirs.cache_read_per_mtok, ours.cache_read_per_mtok, DEFAULT_CACHE_READ_RATIO
        ),
        cache_write_per_mtok=cache(
            theirs.cache_write_per_mtok, ours.cache_write_per_mtok, DEFAULT_CACHE_WRITE_RATIO
        ),
        cache_write_1h_per_mtok=cache(
            theirs.cache_write_1h_per_mtok,
            ours.cache_write_1h_per_mtok,
            DEFAULT_CACHE_WRITE_1H_RATIO,
        ),
        long_context=tier,
        # unit by unit: the source's price where it gives one, ours for the units it does
        # not price (a source without audio rates must not unprice our audio); tiers (the
        # multipliers and class rates together): the source's when it gives some, else ours
        unit_prices=tuple(sorted({**dict(ours.unit_prices), **dict(theirs.unit_prices)}.items())),
        service_tiers=tier_side.service_tiers,
        service_tier_rates=tier_side.service_tier_rates,
        source=f"{theirs.source} ({label})",
    )


def _new_entry(theirs: SourcePrice, label: str) -> ModelPrice:
    return ModelPrice.of(
        theirs.model,
        theirs.input_per_mtok,
        theirs.output_per_mtok,
        cache_read_per_mtok=theirs.cache_read_per_mtok,
        cache_write_per_mtok=theirs.cache_write_per_mtok,
        cache_write_1h_per_mtok=theirs.cache_write_1h_per_mtok,
        long_context=theirs.long_context,
        unit_prices=dict(theirs.unit_prices),
        service_tiers=dict(theirs.service_tiers),
        service_tier_rates={tier: dict(rates) for tier, rates in theirs.service_tier_rates},
        source=f"{theirs.source} ({label})",
    )


def _same_prices(a: ModelPrice, b: ModelPrice) -> bool:
    return a == b  # ModelPrice equality is its prices (provenance is not compared)


def import_prices(
    base: PriceTable | None,
    source: SourceFile,
    *,
    version: str,
    effective_from: datetime,
    add_new: bool,
) -> tuple[PriceTable, ImportReport]:
    """The new version (``version``, in force from ``effective_from``) and what changed."""
    report = ImportReport()
    if base is not None and version == base.version:
        raise ConfigError(f"--version: {version!r} is the base version's: give a new one")
    models = list(base.models) if base is not None else []
    table = base if base is not None else PriceTable(version, effective_from, ())
    groups: dict[str, list[SourcePrice]] = defaultdict(list)
    unowned: dict[str, list[SourcePrice]] = defaultdict(list)
    for price in source.prices:
        owner = _owner(table, price.model) if base is not None else None
        (groups[owner] if owner is not None else unowned[price.model]).append(price)
    out: list[ModelPrice] = []
    for ours in models:
        group = groups.get(ours.match)
        if not group:
            report.not_in_source.append(ours.match)
            out.append(ours)
            continue
        chosen, conflict = _choose(ours.match, group)
        if chosen is None:
            assert conflict is not None
            report.conflicts.append(conflict)
            out.append(ours)
            for price in group:  # each may be priced on its own (--add-new)
                unowned[price.model].append(price)
            continue
        for price in group:
            if price.model != ours.match and _disagrees(price, chosen):
                # our entry prices this id, the source prices it differently: a more
                # specific entry is missing (gpt-4o-mini under gpt-4o)
                report.notes.append(
                    f"{price.model}: priced by our {ours.match!r} entry, but {price.source} "
                    "prices it differently"
                )
                unowned[price.model].append(price)
        try:
            merged = _merged(ours, chosen, report, source.label)
        except ContractError as exc:
            report.conflicts.append(f"{ours.match}: {chosen.source}: {exc.detail}: kept")
            out.append(ours)
            continue
        if _same_prices(merged, ours):
            report.unchanged.append(ours.match)
            out.append(ours)
        else:
            report.updated.append(ours.match)
            out.append(merged)
    for model in sorted(unowned):
        group = unowned[model]
        if not add_new:
            report.new_in_source.append(model)
            continue
        chosen, conflict = _choose(model, group)
        if chosen is None:
            assert conflict is not None
            report.conflicts.append(conflict)
            continue
        try:
            out.append(_new_entry(chosen, source.label))
        except ContractError as exc:
            report.conflicts.append(f"{model}: {chosen.source}: {exc.detail}: not added")
            continue
        report.added.append(model)
    new = PriceTable(
        version=version,
        effective_from=effective_from,
        models=tuple(out),
        fallback=None if base is None else base.fallback,
    )
    return new, report
