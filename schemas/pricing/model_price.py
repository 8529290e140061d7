"""A model's prices (``ModelPrice``, its ``LongContextTier``): validated, and turned once
into the integer rates every cost is computed from.

*Cost.* ``cost_nanos`` is the exact sum over

=========================  ============================================
input_tokens               x input_per_mtok
cache_read_tokens          x cache_read_per_mtok
cache_write_tokens - 1h    x cache_write_per_mtok   (5-minute writes)
cache_write_1h_tokens      x cache_write_1h_per_mtok
output_tokens              x output_per_mtok
=========================  ============================================

(prices / 10^6 tokens, x 10^9 nanos per USD), rounded once to the nearest
nano, ties to even.

*Billed units and service tiers.* When the event names a ``service_tier`` the entry
lists in ``service_tiers``, the token sum above is multiplied by that tier's factor
(``batch: "0.5"``: half of every token price; a tier not listed, or none, pays the
base prices). Then each ``units`` count the entry prices in ``unit_prices`` adds
count x USD per unit (``web_search: 3`` at ``"0.01"`` is $0.03); a unit the entry
does not price adds nothing (it stays visible in ``usage_events.units``). All of it
is exact and still rounded once.

*Long context.* When the whole prompt, input + cache reads + cache writes,
is **more than** ``above_input_tokens`` (exactly at it is still the base
tier), the whole request is billed at the tier: input at the tier's input
price, output at the tier's output price, and each cache price scaled by the
same ratio as input (tier input / base input; Anthropic's and Gemini's tiers
double input and all cache prices alike). That is how Anthropic (Sonnet 4.x
above 200k) and Gemini (2.5 Pro above 200k) bill. Tier cache prices cannot be
given separately: the ``PriceTable`` record has no field for them. A tier
needs a base input price > 0 (the ratio must exist).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, localcontext
from fractions import Fraction
from typing import Any, Final

from schemas.billed_units import valid_service_tier, valid_unit_name
from schemas.errors import ContractError
from schemas.money import NANOS_PER_USD, parse_usd
from schemas.pricing.exact_cost import NANOS_PER_TOKEN, Extras, Rates, rounded_cost

#: defaults of the cache prices, as multiples of the input price
DEFAULT_CACHE_READ_RATIO: Final = Decimal("0.1")
DEFAULT_CACHE_WRITE_RATIO: Final = Decimal("1.25")
DEFAULT_CACHE_WRITE_1H_RATIO: Final = Decimal("2")
#: the ``match`` of the fallback price, and the ``matched`` of what it priced
FALLBACK_MATCH: Final = "*"
#: sanity bounds of a price: $1 per token, and 20 decimal places
MAX_PRICE_PER_MTOK: Final = Decimal(1_000_000)
MAX_PRICE_PLACES: Final = 20
#: bounds of one unit's price (USD per unit) and of a tier's multiplier
MAX_UNIT_PRICE: Final = Decimal(1000)
MAX_TIER_MULTIPLIER: Final = Decimal(100)
#: longest provenance note of one entry
MAX_SOURCE_CHARS: Final = 500


def _decimal_places(value: Decimal) -> int:
    """Decimal places of ``value``, trailing zeros not counted (``3.00`` has 0)."""
    _, digits, exponent = value.as_tuple()
    if not isinstance(exponent, int) or exponent >= 0:
        return 0
    places = -exponent
    for digit in reversed(digits):
        if digit != 0 or places == 0:
            break
        places -= 1
    return places


def check_price(value: Decimal, what: str) -> Decimal:
    if not isinstance(value, Decimal):
        raise ContractError(f"{what}: must be a Decimal, got {type(value).__name__}")
    if not value.is_finite() or value < 0:
        raise ContractError(f"{what}: {value} must be a finite amount >= 0")
    if value > MAX_PRICE_PER_MTOK:
        raise ContractError(f"{what}: {value} USD per million tokens is above the sanity bound")
    if _decimal_places(value) > MAX_PRICE_PLACES:
        raise ContractError(f"{what}: {value} has more than {MAX_PRICE_PLACES} decimal places")
    return value


@dataclass(frozen=True, slots=True)
class LongContextTier:
    """Prices of a request whose prompt (input + cache reads + cache writes) exceeds a size."""

    above_input_tokens: int
    input_per_mtok: Decimal
    output_per_mtok: Decimal

    def __post_init__(self) -> None:
        if type(self.above_input_tokens) is not int or self.above_input_tokens < 0:
            raise ContractError(
                f"above_input_tokens: must be an integer >= 0, got {self.above_input_tokens!r}"
            )
        check_price(self.input_per_mtok, "long_context.input_per_mtok")
        check_price(self.output_per_mtok, "long_context.output_per_mtok")

    def to_record(self) -> dict[str, Any]:
        return {
            "above_input_tokens": self.above_input_tokens,
            "input_per_mtok": str(self.input_per_mtok),
            "output_per_mtok": str(self.output_per_mtok),
        }

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> LongContextTier:
        return cls(
            above_input_tokens=rec["above_input_tokens"],
            input_per_mtok=parse_usd(rec["input_per_mtok"], what="long_context.input_per_mtok"),
            output_per_mtok=parse_usd(rec["output_per_mtok"], what="long_context.output_per_mtok"),
        )


@dataclass(frozen=True, slots=True)
class ModelPrice:
    """The prices of every model id that ``match`` is the longest matching prefix of.

    Build it with :meth:`of` to get the default cache prices.
    """

    match: str
    input_per_mtok: Decimal
    output_per_mtok: Decimal
    cache_read_per_mtok: Decimal
    cache_write_per_mtok: Decimal
    cache_write_1h_per_mtok: Decimal
    long_context: LongContextTier | None = None
    #: (unit, USD per unit), sorted by unit: what billed units beyond tokens cost
    unit_prices: tuple[tuple[str, Decimal], ...] = ()
    #: (service tier, multiplier of every token price), sorted by tier
    service_tiers: tuple[tuple[str, Decimal], ...] = ()
    #: where the prices came from (``spendbus prices import`` writes it); the price file
    #: keeps it, the ``PriceTable`` record does not, and it plays no part in pricing
    #: (nor in equality: a table read back from the topic equals the file's)
    source: str | None = field(default=None, compare=False, hash=False)
    #: the prices as integer rates, and the unit and tier prices when any: what
    #: ``cost_nanos`` and the price book charge with, computed once here
    rates: Rates = field(init=False, repr=False, compare=False, hash=False)
    extras: Extras | None = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.match, str) or not self.match:
            raise ContractError("match: must be a non-empty model id prefix (or use a fallback)")
        if "*" in self.match and self.match != FALLBACK_MATCH:
            raise ContractError(
                f"match: {self.match!r} is a prefix, not a glob: drop the '*' "
                "(the longest matching prefix wins)"
            )
        if self.match != self.match.strip():
            raise ContractError(f"match: {self.match!r} has surrounding blanks")
        if self.source is not None and (
            not isinstance(self.source, str)
            or not self.source.strip()
            or len(self.source) > MAX_SOURCE_CHARS
        ):
            raise ContractError(
                f"source: a non-empty note of at most {MAX_SOURCE_CHARS} characters"
            )
        for name in (
            "input_per_mtok",
            "output_per_mtok",
            "cache_read_per_mtok",
            "cache_write_per_mtok",
            "cache_write_1h_per_mtok",
        ):
            check_price(getattr(self, name), name)
        if self.long_context is not None and self.input_per_mtok == 0:
            raise ContractError(
                "long_context: needs input_per_mtok > 0 (tier cache prices scale with "
                "tier input / base input)"
            )
        object.__setattr__(self, "unit_prices", _checked_pairs(self.unit_prices, "unit_prices"))
        object.__setattr__(
            self, "service_tiers", _checked_pairs(self.service_tiers, "service_tiers")
        )
        object.__setattr__(self, "rates", self._compute_rates())
        extras: Extras | None = None
        if self.unit_prices or self.service_tiers:
            extras = (
                {unit: Fraction(usd) * NANOS_PER_USD for unit, usd in self.unit_prices},
                {tier: Fraction(factor) for tier, factor in self.service_tiers},
            )
        object.__setattr__(self, "extras", extras)

    @classmethod
    def of(
        cls,
        match: str,
        input_per_mtok: str | int | Decimal,
        output_per_mtok: str | int | Decimal,
        *,
        cache_read_per_mtok: str | int | Decimal | None = None,
        cache_write_per_mtok: str | int | Decimal | None = None,
        cache_write_1h_per_mtok: str | int | Decimal | None = None,
        long_context: LongContextTier | None = None,
        unit_prices: Mapping[str, str | int | Decimal] | None = None,
        service_tiers: Mapping[str, str | int | Decimal] | None = None,
        source: str | None = None,
    ) -> ModelPrice:
        """A price with the default cache prices (0.1x, 1.25x, 2x input) where none is given."""
        base = parse_usd(input_per_mtok, what="input_per_mtok")

        def opt(value: str | int | Decimal | None, ratio: Decimal, what: str) -> Decimal:
            if value is not None:
                return parse_usd(value, what=what)
            with localcontext() as ctx:  # a product of two decimals is exact with enough digits
                ctx.prec = 100
                return base * ratio

        return cls(
            match=match,
            input_per_mtok=base,
            output_per_mtok=parse_usd(output_per_mtok, what="output_per_mtok"),
            cache_read_per_mtok=opt(
                cache_read_per_mtok, DEFAULT_CACHE_READ_RATIO, "cache_read_per_mtok"
            ),
            cache_write_per_mtok=opt(
                cache_write_per_mtok, DEFAULT_CACHE_WRITE_RATIO, "cache_write_per_mtok"
            ),
            cache_write_1h_per_mtok=opt(
                cache_write_1h_per_mtok, DEFAULT_CACHE_WRITE_1H_RATIO, "cache_write_1h_per_mtok"
            ),
            long_context=long_context,
            unit_prices=tuple(
                (unit, parse_usd(usd, what=f"unit_prices.{unit}"))
                for unit, usd in (unit_prices or {}).items()
            ),
            service_tiers=tuple(
                (tier, parse_usd(factor, what=f"service_tiers.{tier}"))
                for tier, factor in (service_tiers or {}).items()
            ),
            source=source,
        )

    # exact prices in USD per Mtok, as fractions, per token class
    def base_prices(self) -> tuple[Fraction, Fraction, Fraction, Fraction, Fraction]:
        """(input, cache read, 5-minute cache write, 1-hour cache write, output), exact."""
        return (
            Fraction(self.input_per_mtok),
            Fraction(self.cache_read_per_mtok),
            Fraction(self.cache_write_per_mtok),
            Fraction(self.cache_write_1h_per_mtok),
            Fraction(self.output_per_mtok),
        )

    def tier_prices(self) -> tuple[Fraction, Fraction, Fraction, Fraction, Fraction] | None:
        """The long-context prices (cache prices scaled like input), exact; None without a tier."""
        tier = self.long_context
        if tier is None:
            return None
        ratio = Fraction(tier.input_per_mtok) / Fraction(self.input_per_mtok)
        _, read, write, write_1h, _ = self.base_prices()
        return (
            Fraction(tier.input_per_mtok),
            read * ratio,
            write * ratio,
            write_1h * ratio,
            Fraction(tier.output_per_mtok),
        )

    def _compute_rates(self) -> Rates:
        base = [p * NANOS_PER_TOKEN for p in self.base_prices()]
        tier_prices = self.tier_prices()
        tier = base if tier_prices is None else [p * NANOS_PER_TOKEN for p in tier_prices]
        den = math.lcm(*(r.denominator for r in (*base, *tier)))
        b0, b1, b2, b3, b4 = (int(r * den) for r in base)
        t0, t1, t2, t3, t4 = (int(r * den) for r in tier)
        threshold = -1 if self.long_context is None else self.long_context.above_input_tokens
        return (threshold, (b0, b1, b2, b3, b4), (t0, t1, t2, t3, t4), den)

    def cost_nanos(
        self,
        *,
        input_tokens: int = 0,
        cache_read_tokens: int = 0,
        cache_write_tokens: int = 0,
        cache_write_1h_tokens: int = 0,
        output_tokens: int = 0,
    ) -> int:
        """The cost of one call at these prices, rounded once (nearest nano, ties to even)."""
        return rounded_cost(
            self.rates,
            input_tokens,
            cache_read_tokens,
            cache_write_tokens,
            cache_write_1h_tokens,
            output_tokens,
        )

    def to_record(self) -> dict[str, Any]:
        """The ModelPrice Avro record; every price written out (defaults resolved)."""
        return {
            "match": self.match,
            "input_per_mtok": str(self.input_per_mtok),
            "output_per_mtok": str(self.output_per_mtok),
            "cache_read_per_mtok": str(self.cache_read_per_mtok),
            "cache_write_per_mtok": str(self.cache_write_per_mtok),
            "cache_write_1h_per_mtok": str(self.cache_write_1h_per_mtok),
            "long_context": None if self.long_context is None else self.long_context.to_record(),
            "unit_prices": {unit: str(usd) for unit, usd in self.unit_prices},
            "service_tiers": {tier: str(factor) for tier, factor in self.service_tiers},
        }

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> ModelPrice:
        """Inverse of :meth:`to_record`; a null cache price takes its default."""
        tier = rec.get("long_context")
        return cls.of(
            rec["match"],
            rec["input_per_mtok"],
            rec["output_per_mtok"],
            cache_read_per_mtok=rec.get("cache_read_per_mtok"),
            cache_write_per_mtok=rec.get("cache_write_per_mtok"),
            cache_write_1h_per_mtok=rec.get("cache_write_1h_per_mtok"),
            long_context=None if tier is None else LongContextTier.from_record(tier),
            unit_prices=rec.get("unit_prices") or {},
            service_tiers=rec.get("service_tiers") or {},
        )


def _checked_pairs(pairs: Any, what: str) -> tuple[tuple[str, Decimal], ...]:
    """``unit_prices`` / ``service_tiers``: well-formed names, each once, sorted; prices
    within bounds (a multiplier > 0)."""
    items = list(pairs.items()) if isinstance(pairs, Mapping) else list(pairs)
    seen: set[str] = set()
    out: list[tuple[str, Decimal]] = []
    for name, value in items:
        valid = valid_unit_name if what == "unit_prices" else valid_service_tier
        if not valid(name):
            raise ContractError(f"{what}: {name!r} is not a lower-case name")
        if name in seen:
            raise ContractError(f"{what}: {name!r} is given twice")
        seen.add(name)
        if not isinstance(value, Decimal) or not value.is_finite() or value < 0:
            raise ContractError(f"{what}.{name}: {value} must be a finite decimal >= 0")
        bound = MAX_UNIT_PRICE if what == "unit_prices" else MAX_TIER_MULTIPLIER
        if value > bound or (what == "service_tiers" and value == 0):
            raise ContractError(f"{what}.{name}: {value} is outside (0, {bound}]")
        if _decimal_places(value) > MAX_PRICE_PLACES:
            raise ContractError(f"{what}.{name}: more than {MAX_PRICE_PLACES} decimal places")
        out.append((name, value))
    return tuple(sorted(out))
