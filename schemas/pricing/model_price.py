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
prices, each token class is billed at that tier's rate: the rate
``service_tier_rates`` gives the class in the tier (PriceTable v3: ``batch:
{cache_read_per_mtok: "0.13"}``), else the base price times the tier's multiplier in
``service_tiers`` (``batch: "0.5"``: half of every token price), else (a tier with
rates but no multiplier) the base price. A tier the entry does not price, or none,
pays the base prices. Above the long-context edge a class's tier rate scales as its
base price does (input and cache prices by tier input / base input, output by tier
output / base output): Gemini's batch cache reads stay at the standard cached rate on
either side of the edge. Where the provider prices a class above the edge otherwise,
the tier names that rate (``long_context_`` + the class's field: OpenAI bills gpt-5.4's
batch cached input above 272k at $0.25, not twice its $0.13). Then each ``units`` count the entry prices in ``unit_prices``
adds count x USD per unit (``web_search: 3`` at ``"0.01"`` is $0.03); a unit the entry
does not price adds nothing (it stays visible in ``usage_events.units``). All of it
is exact and still rounded once: each tier's rates are integer numerators like the
base ones (``exact_cost``), so a rate that is no multiple of the base price (1/3 of
it) is carried exactly.

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
#: the token classes a price applies to, as its fields name them, in the order of the
#: integer rates (``exact_cost.Rates``); ``service_tier_rates`` names its classes so
TOKEN_PRICE_FIELDS: Final = (
    "input_per_mtok",
    "cache_read_per_mtok",
    "cache_write_per_mtok",
    "cache_write_1h_per_mtok",
    "output_per_mtok",
)

#: a tier's rate of a class above the long-context edge is named by this prefix and the
#: class's field (``long_context_cache_read_per_mtok``)
LONG_CONTEXT_RATE_PREFIX: Final = "long_context_"
#: the names a tier's class rates may have: the token prices, below and above the edge
TIER_RATE_FIELDS: Final = TOKEN_PRICE_FIELDS + tuple(
    LONG_CONTEXT_RATE_PREFIX + name for name in TOKEN_PRICE_FIELDS
)

#: one tier's rates of the classes it bills apart: ((price field, USD per Mtok), ...)
TierRates = tuple[tuple[str, Decimal], ...]
#: exact prices of the five token classes, in ``TOKEN_PRICE_FIELDS`` order
Prices = tuple[Fraction, Fraction, Fraction, Fraction, Fraction]


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


def exact_decimal(value: Fraction) -> Decimal | None:
    """``value`` as a decimal when it is a finite one (``13/25`` is ``0.52``), else None
    (``5/3``): only a denominator of 2s and 5s has a finite expansion."""
    den = value.denominator
    twos = fives = 0
    while den % 2 == 0:
        den //= 2
        twos += 1
    while den % 5 == 0:
        den //= 5
        fives += 1
    if den != 1:
        return None
    places = max(twos, fives)
    digits = value.numerator * 10**places // value.denominator  # exact: 10**places divides
    return Decimal(digits).scaleb(-places)


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
    #: (service tier, the rates of the classes it bills apart from its multiplier), sorted
    #: by tier and class (PriceTable v3)
    service_tier_rates: tuple[tuple[str, TierRates], ...] = ()
    #: where the prices came from (``spendbus prices import`` writes it); the price file
    #: keeps it, the ``PriceTable`` record does not, and it plays no part in pricing
    #: (nor in equality: a table read back from the topic equals the file's)
    source: str | None = field(default=None, compare=False, hash=False)
    #: the prices as integer rates, and the unit prices and each tier's integer rates
    #: when any: what ``cost_nanos`` and the price book charge with, computed once here
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
        object.__setattr__(self, "service_tier_rates", _checked_tier_rates(self.service_tier_rates))
        for tier, rates in self.service_tier_rates:
            for name, _ in rates:
                if name.startswith(LONG_CONTEXT_RATE_PREFIX) and self.long_context is None:
                    raise ContractError(
                        f"service_tier_rates.{tier}.{name}: a rate above the long-context "
                        "edge needs the entry's long_context tier"
                    )
        if self.long_context is not None and self.output_per_mtok == 0:
            for tier, rates in self.service_tier_rates:
                if "output_per_mtok" in dict(rates):
                    raise ContractError(
                        f"service_tier_rates.{tier}.output_per_mtok: with a long_context "
                        "tier needs output_per_mtok > 0 (above the edge a tier rate scales "
                        "as its base price does)"
                    )
        object.__setattr__(self, "rates", _integer_rates(*self.prices_in_tier(None), self))
        extras: Extras | None = None
        tiers = self.tiers()
        if self.unit_prices or tiers:
            extras = (
                {unit: Fraction(usd) * NANOS_PER_USD for unit, usd in self.unit_prices},
                {tier: _integer_rates(*self.prices_in_tier(tier), self) for tier in tiers},
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
        service_tier_rates: Mapping[str, Mapping[str, str | int | Decimal]] | None = None,
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
            service_tier_rates=_parsed_tier_rates(service_tier_rates),
            source=source,
        )

    # exact prices in USD per Mtok, as fractions, per token class
    def base_prices(self) -> Prices:
        """(input, cache read, 5-minute cache write, 1-hour cache write, output), exact."""
        return (
            Fraction(self.input_per_mtok),
            Fraction(self.cache_read_per_mtok),
            Fraction(self.cache_write_per_mtok),
            Fraction(self.cache_write_1h_per_mtok),
            Fraction(self.output_per_mtok),
        )

    def tier_prices(self) -> Prices | None:
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

    def tiers(self) -> tuple[str, ...]:
        """The service tiers this entry prices (a multiplier, class rates or both), sorted."""
        return tuple(
            sorted({t for t, _ in self.service_tiers} | {t for t, _ in self.service_tier_rates})
        )

    def prices_in_tier(self, service_tier: str | None) -> tuple[Prices, Prices | None]:
        """(base prices, long-context prices or None) of a call served by ``service_tier``,
        exact: a class's rate in the tier, else its price x the tier's multiplier (1 when
        the tier has none); above the edge a class's tier rate scales as its price does,
        unless the tier names its rate there (``long_context_<field>``). A tier the entry
        does not price, or None, is the base prices."""
        base = self.base_prices()
        long = self.tier_prices()
        if service_tier is None or service_tier not in self.tiers():
            return base, long
        factor = Fraction(dict(self.service_tiers).get(service_tier, Decimal(1)))
        given = dict(dict(self.service_tier_rates).get(service_tier, ()))

        def in_tier(prices: Prices, long_context: bool) -> Prices:
            out = [price * factor for price in prices]
            for index, name in enumerate(TOKEN_PRICE_FIELDS):
                rate = given.get(name)
                if rate is not None:
                    out[index] = Fraction(rate)
                    if long_context:  # output scales as output does, the rest as input
                        scale = 4 if name == "output_per_mtok" else 0
                        out[index] *= prices[scale] / base[scale]
                if long_context:
                    above = given.get(LONG_CONTEXT_RATE_PREFIX + name)
                    if above is not None:
                        out[index] = Fraction(above)
            return (out[0], out[1], out[2], out[3], out[4])

        return in_tier(base, False), None if long is None else in_tier(long, True)

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
            "service_tier_rates": {
                tier: {name: str(rate) for name, rate in rates}
                for tier, rates in self.service_tier_rates
            },
        }

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> ModelPrice:
        """Inverse of :meth:`to_record`; a null cache price takes its default, a record
        written before v3 has no class rates."""
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
            service_tier_rates=rec.get("service_tier_rates") or {},
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


def _integer_rates(base: Prices, long: Prices | None, price: ModelPrice) -> Rates:
    """``base`` and ``long`` as nanos per token over one common denominator (``Rates``)."""
    scaled = [p * NANOS_PER_TOKEN for p in base]
    tier = scaled if long is None else [p * NANOS_PER_TOKEN for p in long]
    den = math.lcm(*(r.denominator for r in (*scaled, *tier)))
    b0, b1, b2, b3, b4 = (int(r * den) for r in scaled)
    t0, t1, t2, t3, t4 = (int(r * den) for r in tier)
    threshold = -1 if price.long_context is None else price.long_context.above_input_tokens
    return (threshold, (b0, b1, b2, b3, b4), (t0, t1, t2, t3, t4), den)


def _parsed_tier_rates(
    given: Mapping[str, Mapping[str, str | int | Decimal]] | None,
) -> tuple[tuple[str, TierRates], ...]:
    out = []
    for tier, rates in (given or {}).items():
        if not isinstance(rates, Mapping):
            raise ContractError(
                f"service_tier_rates.{tier}: a mapping of token price (input_per_mtok...) "
                "to USD per million tokens"
            )
        out.append(
            (
                tier,
                tuple(
                    (name, parse_usd(rate, what=f"service_tier_rates.{tier}.{name}"))
                    for name, rate in rates.items()
                ),
            )
        )
    return tuple(out)


def _checked_tier_rates(given: Any) -> tuple[tuple[str, TierRates], ...]:
    """``service_tier_rates``: tier names each once, each with the token prices it bills
    apart (``TIER_RATE_FIELDS``, each once, within a price's bounds); sorted."""
    items = list(given.items()) if isinstance(given, Mapping) else list(given)
    out: dict[str, TierRates] = {}
    for tier, rates in items:
        if not valid_service_tier(tier):
            raise ContractError(f"service_tier_rates: {tier!r} is not a lower-case name")
        if tier in out:
            raise ContractError(f"service_tier_rates: {tier!r} is given twice")
        pairs = list(rates.items()) if isinstance(rates, Mapping) else list(rates)
        if not pairs:
            raise ContractError(f"service_tier_rates.{tier}: give at least one token price")
        named: dict[str, Decimal] = {}
        for name, rate in pairs:
            if name not in TIER_RATE_FIELDS:
                raise ContractError(
                    f"service_tier_rates.{tier}: {name!r} is not a token price (one of "
                    f"{', '.join(TOKEN_PRICE_FIELDS)}, or one of them prefixed "
                    f"{LONG_CONTEXT_RATE_PREFIX!r} for its rate above the long-context edge)"
                )
            if name in named:
                raise ContractError(f"service_tier_rates.{tier}.{name}: given twice")
            named[name] = check_price(rate, f"service_tier_rates.{tier}.{name}")
        out[tier] = tuple(sorted(named.items()))
    return tuple(sorted(out.items()))
