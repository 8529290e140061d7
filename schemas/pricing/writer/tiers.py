"""A service tier as a source gives it (a rate per token class) written as the price table
holds it: a multiplier of every token price and the rates of the classes it bills apart.

A source says what a tier costs per class (``{input, output, cache_read}`` in USD per
million tokens). When input and output are the same multiple of their base prices and
that multiple is a finite decimal, it is the tier's multiplier (every class the source
gives no tier rate for, cache writes included, scales with it, as before per-class
rates); a class the source prices otherwise (Gemini batch cache reads at the standard
rate, gpt-5.4's $0.13 batch cached input) gets its own rate. Otherwise (5/3 of every
price, or input and output scaled apart) every class the source gives is a rate, exact,
and the tier has no multiplier: the classes it does not give pay the base prices.

Above the long-context edge the table scales a tier's rate as the base price scales
(:mod:`schemas.pricing.model_price`); a rate the source gives there (``long_context_`` +
class) that this rule does not reach is written as the tier's rate above the edge
(``long_context_cache_read_per_mtok``: gpt-5.4 batch cached input, $0.25 not $0.26).
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from fractions import Fraction
from typing import Final

from schemas.pricing import (
    LONG_CONTEXT_RATE_PREFIX,
    MAX_PRICE_PLACES,
    MAX_TIER_MULTIPLIER,
    LongContextTier,
    exact_decimal,
)

#: a source's token class -> the price field the table names it by
CLASS_FIELDS: Final = {
    "input": "input_per_mtok",
    "output": "output_per_mtok",
    "cache_read": "cache_read_per_mtok",
    "cache_write": "cache_write_per_mtok",
    "cache_write_1h": "cache_write_1h_per_mtok",
}


def tier_terms(
    base: Mapping[str, Decimal],
    tier: Mapping[str, Decimal],
    long_context: LongContextTier | None = None,
) -> tuple[Decimal | None, dict[str, Decimal]] | None:
    """(multiplier or None, {price field: USD per Mtok}) of a tier a source prices by class
    (``tier``), against the prices the entry bills outside it (``base``, same class keys;
    a class ``base`` lacks is given a rate); None when the tier gives no input and output
    rate (it is then not imported). ``tier``'s ``long_context_<class>`` rates are its
    rates above the entry's ``long_context`` edge (ignored without one)."""
    tier_in, tier_out = tier.get("input"), tier.get("output")
    if tier_in is None or tier_out is None:
        return None
    factor = _common_multiplier(base, tier_in, tier_out)
    scale = Fraction(1) if factor is None else Fraction(factor)
    rates: dict[str, Decimal] = {}
    for name, rate in tier.items():
        if name.startswith(LONG_CONTEXT_RATE_PREFIX):
            continue
        plain = base.get(name)
        if plain is None or Fraction(rate) != Fraction(plain) * scale:
            rates[CLASS_FIELDS[name]] = rate
    if long_context is None:
        return factor, rates
    for name, rate in tier.items():
        if not name.startswith(LONG_CONTEXT_RATE_PREFIX):
            continue
        plain_name = name.removeprefix(LONG_CONTEXT_RATE_PREFIX)
        implied = _implied_above_edge(plain_name, base, rates, scale, long_context)
        if implied is None or Fraction(rate) != implied:
            rates[LONG_CONTEXT_RATE_PREFIX + CLASS_FIELDS[plain_name]] = rate
    return factor, rates


def _implied_above_edge(
    name: str,
    base: Mapping[str, Decimal],
    rates: Mapping[str, Decimal],
    scale: Fraction,
    long_context: LongContextTier,
) -> Fraction | None:
    """What the table charges class ``name`` above the edge in the tier without a rate
    of its own there (model_price's rule: the tier's rate scaled as the base price
    scales, else the base price above the edge x the multiplier); None when ``base``
    lacks what it needs."""
    ref = "output" if name == "output" else "input"
    plain, plain_ref = base.get(name), base.get(ref)
    if plain is None or not plain_ref:
        return None
    long_ref = Fraction(
        long_context.output_per_mtok if ref == "output" else long_context.input_per_mtok
    )
    ratio = long_ref / Fraction(plain_ref)
    own = rates.get(CLASS_FIELDS[name])
    if own is not None:
        return Fraction(own) * ratio
    return Fraction(plain) * ratio * scale


def _common_multiplier(
    base: Mapping[str, Decimal], tier_in: Decimal, tier_out: Decimal
) -> Decimal | None:
    """Tier input / base input when tier output / base output is the same and it is a
    finite decimal the table can hold as a multiplier; else None."""
    base_in, base_out = base.get("input"), base.get("output")
    if not base_in or not base_out:
        return None
    ratio = Fraction(tier_in) / Fraction(base_in)
    if ratio != Fraction(tier_out) / Fraction(base_out) or not 0 < ratio <= MAX_TIER_MULTIPLIER:
        return None
    factor = exact_decimal(ratio)
    places = "" if factor is None else format(factor.normalize(), "f").partition(".")[2]
    if factor is None or len(places) > MAX_PRICE_PLACES:
        return None
    return factor
