"""Versioned prices: what an event costs, computed identically by every stage.

The aggregator charges events with :meth:`PriceBook.price_event`; the enforcer
estimates a request before forwarding it with :meth:`PriceBook.worst_case_nanos`.
Both read the same ``pricing`` topic (compacted, key = version, value = the
``PriceTable`` Avro record), so both charge the same amount for the same usage.

Price files (YAML)
==================

A file holds one table, or several versions under ``versions:``::

    version: "2026-11-01"                  # recorded on every priced event
    effective_from: "2026-11-01T00:00:00Z" # RFC 3339 with a zone; a bare date is 00:00 UTC
    models:
      - match: claude-sonnet-4             # a prefix of the model id
        input_per_mtok: "3.00"             # decimal USD per million tokens
        output_per_mtok: "15.00"
        cache_read_per_mtok: "0.30"        # optional, default 0.1 x input
        cache_write_per_mtok: "3.75"       # optional, default 1.25 x input (5-minute writes)
        cache_write_1h_per_mtok: "6.00"    # optional, default 2 x input
        long_context: {above_input_tokens: 200000, input_per_mtok: "6.00", output_per_mtok: "22.50"}
        unit_prices: {web_search: "0.01"}  # optional: USD per billed unit (schemas/billed_units.py)
        service_tiers: {batch: "0.5", priority: "1.7"}  # optional: token-price multipliers
        source: "litellm:claude-sonnet-4-5 (...)"  # optional provenance, kept in the file only
    fallback:                              # optional: charged for models nothing matches
      input_per_mtok: "10"
      output_per_mtok: "50"
    # or: fallback: {model: claude-opus-4-1}  (what that model costs in this version)

    # or, several versions in one file:
    versions:
      - {version: "2026-01-01", effective_from: "2026-01-01T00:00:00Z", models: [...]}
      - {version: "2026-11-01", effective_from: "2026-11-01T00:00:00Z", models: [...]}

Prices are strings or integers, never floats (YAML reads ``3.0`` as a binary
float, which is not exact); negative prices are refused; unknown keys are
refused (a typo must not silently fall back to a default); a key given twice
in one mapping is refused. Errors name the file, the version, the model entry
and the field.

Semantics
=========

*Which version.* An event is priced by the version in force at its
``occurred_at``: the one with the latest ``effective_from`` <= occurred_at
(two versions with the same ``effective_from``: the greater version string
wins, so the choice never depends on the order they were applied in). An event
older than every version is **unpriced, with price_version null** (it is not
priced by the earliest version: that would charge history with prices that
were not yet in force).

*Which model entry.* The longest ``match`` that is a prefix of the model id
wins. Model ids are first matched exactly as the event carries them, so a
price file can price a decorated id on its own (e.g. Bedrock regional
endpoints, dearer than global ones). If nothing matches, the id is matched
again after each of these steps, in order, stopping at the first form that
matches (see :func:`model_id_candidates`):

1. lower-cased, everything up to the last ``/`` removed (Gemini ``models/``,
   Vertex ``publishers/google/models/``, Bedrock ARNs ``...:foundation-model/``
   or ``...:inference-profile/``, router prefixes such as ``openai/``), and
   Vertex's ``@`` version separator read as ``-`` (``claude-sonnet-4@20250514``);
2. a Bedrock geography label removed (``us.``, ``eu.``, ``apac.``, ``global.`` ...);
3. a Bedrock vendor label removed (``anthropic.``, ``amazon.``, ``meta.`` ...).

So ``us.anthropic.claude-sonnet-4-5-20250929-v1:0`` is priced by an entry
``us.anthropic.claude-sonnet-4-5`` if there is one, else
``anthropic.claude-sonnet-4-5``, else ``claude-sonnet-4-5``. Write ``match``
values in lower case. A ``match`` is a prefix, not a glob: ``*`` is refused,
and so is an empty match (use ``fallback``). OpenAI fine-tuned ids
(``ft:gpt-4o-mini:...``) are not stripped: fine-tuned models cost more, so they
must be listed (``match: "ft:gpt-4o-mini"``).

*No match.* With a ``fallback``, the fallback prices are charged and the
priced event records ``matched = "*"``. Without one the event costs 0 and is
flagged ``unpriced`` (matched null, price_version = the version in force),
for the aggregator to count, alert on and list.

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

*Worst case.* :meth:`PriceBook.worst_case_nanos` prices ``input_tokens`` as
plain input (tier-aware), ``max_output_tokens`` as output and the ``units`` the request
can cost at most (a server tool's ``max_uses``...) at their unit prices. It does not add
the cache-write premium (1.25x, 2x for 1-hour writes): an enforcer that knows
a request writes to the cache should pass those tokens to :meth:`PriceBook.price`.

The record and the cache
========================

:meth:`PriceTable.to_record` writes every price out, defaults resolved, as
exact decimal strings: what a reader charges does not depend on the defaults
of the code that reads it. :meth:`PriceTable.from_record` still gives a null
cache price its default. :class:`PriceBook` resolves each (version, model)
once and caches the result (the rates, or the constant unpriced Price), so
:meth:`PriceBook.price_event` is a comparison (events of the newest version
skip the bisect), a dict lookup and integer arithmetic.

Exact arithmetic
================

Every price is a finite decimal, or (a tier's cache prices) a decimal times a
quotient of decimals: a rational number. Each :class:`ModelPrice` turns its
prices into nanos per token (price x 1000) and writes them over one common
denominator ``D`` (the lcm of their denominators), so each rate is an integer
numerator. An event's exact cost is then ``N / D`` with ``N`` the integer sum
of tokens x numerators; one integer ``divmod`` gives the quotient and the
remainder, and ties (2 x remainder = D) go to the even quotient. No float
and no Decimal context precision is involved, so nothing is rounded before that
last step, whatever the number of digits of the prices; it equals
``money.round_nanos(sum of money.line_cost(...))`` whenever the latter is
exact (tests check both against a brute-force ``Fraction`` computation).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, time
from decimal import Decimal, localcontext
from fractions import Fraction
from pathlib import Path
from typing import Any, Final

import yaml

from schemas.billed_units import valid_service_tier, valid_unit_name
from schemas.errors import ConfigError, ContractError, InvalidRecord
from schemas.money import NANOS_PER_USD, TOKENS_PER_PRICE_UNIT, parse_usd
from schemas.periods import from_micros

#: defaults of the cache prices, as multiples of the input price
DEFAULT_CACHE_READ_RATIO: Final = Decimal("0.1")
DEFAULT_CACHE_WRITE_RATIO: Final = Decimal("1.25")
DEFAULT_CACHE_WRITE_1H_RATIO: Final = Decimal("2")
#: the ``match`` of the fallback price, and the ``matched`` of what it priced
FALLBACK_MATCH: Final = "*"
#: sanity bounds of a price: $1 per token, and 20 decimal places
MAX_PRICE_PER_MTOK: Final = Decimal(1_000_000)
MAX_PRICE_PLACES: Final = 20
#: Bedrock cross-region inference profile prefixes (``us.anthropic.claude-...``)
BEDROCK_GEOGRAPHIES: Final = frozenset(
    {"us", "eu", "apac", "global", "us-gov", "jp", "au", "ca", "uk", "in", "sa"}
)
#: Bedrock model provider prefixes (``anthropic.claude-...``, ``amazon.nova-...``)
BEDROCK_VENDORS: Final = frozenset(
    {
        "anthropic",
        "amazon",
        "meta",
        "mistral",
        "cohere",
        "ai21",
        "deepseek",
        "openai",
        "qwen",
        "writer",
        "google",
        "moonshot",
        "minimax",
        "nvidia",
        "twelvelabs",
        "stability",
        "luma",
    }
)
#: resolved (version, model) entries kept per version before the cache is cleared
MAX_CACHED_MODELS: Final = 10_000
#: nanos per token for a price of 1 USD per million tokens
_NANOS_PER_TOKEN: Final = Fraction(NANOS_PER_USD, TOKENS_PER_PRICE_UNIT)

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
    "source",
)
#: bounds of one unit's price (USD per unit) and of a tier's multiplier
MAX_UNIT_PRICE: Final = Decimal(1000)
MAX_TIER_MULTIPLIER: Final = Decimal(100)
#: longest provenance note of one entry
MAX_SOURCE_CHARS: Final = 500
_TIER_KEYS: Final = ("above_input_tokens", "input_per_mtok", "output_per_mtok")
_TABLE_KEYS: Final = ("version", "effective_from", "models", "fallback")


def model_id_candidates(model: str) -> list[str]:
    """The forms of ``model`` tried in turn against the prefixes (see the module docstring)."""
    out = [model]
    form = model.strip().lower()
    form = form.rsplit("/", 1)[-1].replace("@", "-")
    if form not in out:
        out.append(form)
    for labels in (BEDROCK_GEOGRAPHIES, BEDROCK_VENDORS):
        head, dot, rest = form.partition(".")
        if dot and rest and head in labels:
            form = rest
            out.append(form)
    return out


# --- prices --------------------------------------------------------------------------


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


def _check_price(value: Decimal, what: str) -> Decimal:
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
        _check_price(self.input_per_mtok, "long_context.input_per_mtok")
        _check_price(self.output_per_mtok, "long_context.output_per_mtok")

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


#: (threshold or -1, base numerators, tier numerators, denominator); numerators are
#: per token class (input, cache read, 5-minute cache write, 1-hour cache write, output)
_Rates = tuple[int, tuple[int, int, int, int, int], tuple[int, int, int, int, int], int]


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
    _rates: _Rates = field(init=False, repr=False, compare=False, hash=False)
    _extras: _Extras | None = field(init=False, repr=False, compare=False, hash=False)

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
            _check_price(getattr(self, name), name)
        if self.long_context is not None and self.input_per_mtok == 0:
            raise ContractError(
                "long_context: needs input_per_mtok > 0 (tier cache prices scale with "
                "tier input / base input)"
            )
        object.__setattr__(self, "unit_prices", _checked_pairs(self.unit_prices, "unit_prices"))
        object.__setattr__(
            self, "service_tiers", _checked_pairs(self.service_tiers, "service_tiers")
        )
        object.__setattr__(self, "_rates", self._compute_rates())
        extras: _Extras | None = None
        if self.unit_prices or self.service_tiers:
            extras = (
                {unit: Fraction(usd) * NANOS_PER_USD for unit, usd in self.unit_prices},
                {tier: Fraction(factor) for tier, factor in self.service_tiers},
            )
        object.__setattr__(self, "_extras", extras)

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

    def _compute_rates(self) -> _Rates:
        base = [p * _NANOS_PER_TOKEN for p in self.base_prices()]
        tier_prices = self.tier_prices()
        tier = base if tier_prices is None else [p * _NANOS_PER_TOKEN for p in tier_prices]
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
        return _cost(
            self._rates,
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


#: (unit -> nanos per unit, tier -> token-cost multiplier), exact
_Extras = tuple[dict[str, Fraction], dict[str, Fraction]]


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


def _with_extras(token_total: int, den: int, extras: _Extras, units: Any, service_tier: Any) -> int:
    """The exact cost of tokens (``token_total / den`` nanos) x the tier's multiplier, plus
    each priced unit, rounded once (nearest nano, ties to even)."""
    unit_nanos, tiers = extras
    exact = Fraction(token_total, den)
    if service_tier is not None:
        factor = tiers.get(service_tier)
        if factor is not None:
            exact *= factor
    if units:
        for unit, count in units.items():
            nanos = unit_nanos.get(unit)
            if nanos is not None:
                exact += nanos * count
    quotient, remainder = divmod(exact.numerator, exact.denominator)
    twice = remainder * 2
    if twice > exact.denominator or (twice == exact.denominator and quotient & 1):
        quotient += 1
    return quotient


def _token_total(rates: _Rates, inp: int, read: int, write: int, write_1h: int, out: int) -> int:
    """The unrounded token cost's numerator over ``rates``' denominator."""
    threshold, base, tier, _ = rates
    a, b, c, d, e = tier if 0 <= threshold < inp + read + write else base
    return inp * a + read * b + (write - write_1h) * c + write_1h * d + out * e


def _cost(rates: _Rates, inp: int, read: int, write: int, write_1h: int, out: int) -> int:
    if write_1h > write:
        raise ContractError(
            f"cache_write_1h_tokens ({write_1h}) is a part of cache_write_tokens ({write})"
        )
    threshold, base, tier, den = rates
    a, b, c, d, e = tier if 0 <= threshold < inp + read + write else base
    total = inp * a + read * b + (write - write_1h) * c + write_1h * d + out * e
    if den == 1:
        return total
    quotient, remainder = divmod(total, den)
    twice = remainder * 2
    if twice > den or (twice == den and quotient & 1):
        quotient += 1
    return quotient


# --- tables ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PriceTable:
    """One price version: in force from ``effective_from`` until the next version's."""

    version: str
    effective_from: datetime
    models: tuple[ModelPrice, ...]
    fallback: ModelPrice | None = None
    _by_prefix: dict[str, ModelPrice] = field(init=False, repr=False, compare=False, hash=False)
    _lengths: tuple[int, ...] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.version, str) or not self.version.strip():
            raise ContractError("version: must be a non-empty string")
        if not isinstance(self.effective_from, datetime) or self.effective_from.tzinfo is None:
            raise ContractError("effective_from: must be a datetime with a time zone")
        object.__setattr__(self, "effective_from", self.effective_from.astimezone(UTC))
        object.__setattr__(self, "models", tuple(self.models))
        by_prefix: dict[str, ModelPrice] = {}
        for price in self.models:
            if price.match == FALLBACK_MATCH:
                raise ContractError("match: '*' is the fallback's; give it as 'fallback'")
            if price.match in by_prefix:
                raise ContractError(f"match: {price.match!r} is listed twice")
            by_prefix[price.match] = price
        if self.fallback is not None and self.fallback.match != FALLBACK_MATCH:
            raise ContractError(f"fallback: its match must be {FALLBACK_MATCH!r}")
        object.__setattr__(self, "_by_prefix", by_prefix)
        lengths = sorted({len(m) for m in by_prefix}, reverse=True)
        object.__setattr__(self, "_lengths", tuple(lengths))

    def lookup(self, model: str) -> ModelPrice | None:
        """The entry with the longest prefix of ``model`` (tried as carried, then normalised).

        The fallback is not returned here; see :meth:`resolve`.
        """
        by_prefix = self._by_prefix
        for form in model_id_candidates(model):
            size = len(form)
            for length in self._lengths:
                if length <= size:
                    price = by_prefix.get(form[:length])
                    if price is not None:
                        return price
        return None

    def resolve(self, model: str) -> ModelPrice | None:
        """What ``model`` is charged by: its entry, else the fallback, else None (unpriced)."""
        price = self.lookup(model)
        return self.fallback if price is None else price

    def to_record(self) -> dict[str, Any]:
        """The PriceTable Avro record (schemas/avro/PriceTable.avsc); decimals as exact strings."""
        return {
            "version": self.version,
            "effective_from": self.effective_from,
            "models": [m.to_record() for m in self.models],
            "fallback": None if self.fallback is None else self.fallback.to_record(),
        }

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> PriceTable:
        effective_from = rec["effective_from"]
        if type(effective_from) is int:  # microseconds, as on the wire
            effective_from = from_micros(effective_from)
        fallback = rec.get("fallback")
        return cls(
            version=rec["version"],
            effective_from=effective_from,
            models=tuple(ModelPrice.from_record(m) for m in rec["models"]),
            fallback=None if fallback is None else ModelPrice.from_record(fallback),
        )


# --- YAML -----------------------------------------------------------------------------


class _StrictLoader(yaml.SafeLoader):
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
        return _check_price(price, "price")
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
            prices["input_per_mtok"],  # type: ignore[arg-type]
            prices["output_per_mtok"],  # type: ignore[arg-type]
            cache_read_per_mtok=prices["cache_read_per_mtok"],
            cache_write_per_mtok=prices["cache_write_per_mtok"],
            cache_write_1h_per_mtok=prices["cache_write_1h_per_mtok"],
            long_context=long_context,
            unit_prices=per_unit,
            service_tiers=tiers,
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


def _table_from_yaml(doc: Any, source: str, index: int | None = None) -> PriceTable:
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
    _unknown_keys(doc, _TABLE_KEYS, where, "")
    effective_from = _effective_from(doc.get("effective_from"), where)
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
    fallback_doc = doc.get("fallback")
    if isinstance(fallback_doc, dict) and set(fallback_doc) == {"model"}:
        fallback = _named_fallback(fallback_doc["model"], prices, f"{where}: fallback")
    elif fallback_doc is None:
        fallback = None
    else:
        fallback = _model_from_yaml(fallback_doc, f"{where}: fallback", fallback=True)
    return PriceTable(
        version=version, effective_from=effective_from, models=tuple(prices), fallback=fallback
    )


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
        tables = [_table_from_yaml(item, source, i) for i, item in enumerate(items)]
        seen: set[str] = set()
        for table in tables:
            if table.version in seen:
                raise ConfigError(
                    f"{source}: version {table.version!r}: field 'version': given twice"
                )
            seen.add(table.version)
        return tables
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
        doc = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    tables = price_table_from_yaml(doc, source=str(path))
    return tables if isinstance(tables, list) else [tables]


def default_price_file() -> Path:
    """The price file shipped with spendbus (list prices; see its header for the as-of date)."""
    return Path(__file__).resolve().parent / "data" / "prices.yaml"


# --- pricing events -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Price:
    """What one call costs and by which prices (the priced event's pricing fields)."""

    cost_nanos: int
    #: the version in force at the event's time; None when no version was in force
    price_version: str | None
    #: the matching prefix, ``"*"`` for the fallback, None when unpriced
    matched: str | None
    unpriced: bool


#: the price of an event older than every version
NO_VERSION: Final = Price(cost_nanos=0, price_version=None, matched=None, unpriced=True)

# A frozen dataclass's __init__ goes through object.__setattr__ per field; on the
# hot path, filling the slots through their descriptors builds the same object
# in about half the time.
_new_price = Price.__new__
_set_cost = vars(Price)["cost_nanos"].__set__
_set_version = vars(Price)["price_version"].__set__
_set_matched = vars(Price)["matched"].__set__
_set_unpriced = vars(Price)["unpriced"].__set__


def _charged(cost: int, version: str, matched: str | None) -> Price:
    price = _new_price(Price)
    _set_cost(price, cost)
    _set_version(price, version)
    _set_matched(price, matched)
    _set_unpriced(price, False)
    return price


#: a resolved (version, model): (the Price when constant, version, matched, rates)
_Entry = tuple[Price | None, str, str | None, _Rates | None, _Extras | None]


class PriceBook:
    """Every applied price version, indexed by ``effective_from``; prices events.

    Resolved (version, model) pairs are cached, so pricing an event is a list
    lookup, a dict lookup and a few integer operations.
    """

    __slots__ = ("_by_version", "_entries", "_order", "_starts")

    def __init__(self, tables: Iterable[PriceTable] = ()) -> None:
        self._by_version: dict[str, PriceTable] = {}
        self._order: list[PriceTable] = []
        self._starts: list[datetime] = []
        self._entries: list[dict[str, _Entry]] = []
        for table in tables:
            self._by_version[table.version] = table
        self._reindex()

    @classmethod
    def from_file(cls, path: str | Path | None = None) -> PriceBook:
        """A book of every version in ``path`` (default: the shipped price file)."""
        return cls(load_price_file(default_price_file() if path is None else path))

    def _reindex(self) -> None:
        self._order = sorted(self._by_version.values(), key=lambda t: (t.effective_from, t.version))
        self._starts = [t.effective_from for t in self._order]
        self._entries = [{} for _ in self._order]

    def add(self, table: PriceTable) -> None:
        """Apply a version; a version applied again replaces the earlier one."""
        self._by_version[table.version] = table
        self._reindex()

    def remove(self, version: str) -> None:
        """Forget a version (a tombstone on the pricing topic); unknown versions are ignored."""
        if self._by_version.pop(version, None) is not None:
            self._reindex()

    @property
    def tables(self) -> list[PriceTable]:
        """Every version, oldest ``effective_from`` first."""
        return list(self._order)

    def __len__(self) -> int:
        return len(self._order)

    def _index_at(self, at: datetime) -> int:
        starts = self._starts
        if starts and at >= starts[-1]:
            return len(starts) - 1
        return bisect_right(starts, at) - 1

    def table_at(self, at: datetime) -> PriceTable | None:
        """The version in force at ``at`` (latest effective_from <= at), or None."""
        if at.tzinfo is None:
            raise ContractError(f"time {at.isoformat()} has no time zone; spendbus works in UTC")
        index = self._index_at(at)
        return None if index < 0 else self._order[index]

    def _resolve(self, index: int, model: str) -> _Entry:
        table = self._order[index]
        price = table.resolve(model)
        entry: _Entry
        if price is None:
            entry = (Price(0, table.version, None, True), table.version, None, None, None)
        else:
            entry = (None, table.version, price.match, price._rates, price._extras)
        cache = self._entries[index]
        if len(cache) >= MAX_CACHED_MODELS:
            cache.clear()
        cache[model] = entry
        return entry

    def price(
        self,
        model: str,
        *,
        at: datetime,
        input_tokens: int = 0,
        cache_read_tokens: int = 0,
        cache_write_tokens: int = 0,
        cache_write_1h_tokens: int = 0,
        output_tokens: int = 0,
        units: Mapping[str, int] | None = None,
        service_tier: str | None = None,
    ) -> Price:
        """The cost of one call of ``model`` at ``at`` (``cache_write_1h_tokens`` is part of
        ``cache_write_tokens``; ``units`` and ``service_tier`` as a UsageEvent carries them)."""
        for name, value in (
            ("input_tokens", input_tokens),
            ("cache_read_tokens", cache_read_tokens),
            ("cache_write_tokens", cache_write_tokens),
            ("cache_write_1h_tokens", cache_write_1h_tokens),
            ("output_tokens", output_tokens),
        ):
            if type(value) is not int or value < 0:
                raise ContractError(f"{name}: must be an integer >= 0, got {value!r}")
        for unit, count in (units or {}).items():
            if not valid_unit_name(unit) or type(count) is not int or count < 0:
                raise ContractError(f"units: {unit!r}: a unit name and a count >= 0, got {count!r}")
        if service_tier is not None and not valid_service_tier(service_tier):
            raise ContractError(f"service_tier: {service_tier!r} is not a tier name")
        if at.tzinfo is None:
            raise ContractError(f"time {at.isoformat()} has no time zone; spendbus works in UTC")
        index = self._index_at(at)
        if index < 0:
            return NO_VERSION
        entry = self._entries[index].get(model) or self._resolve(index, model)
        fixed, version, matched, rates, extras = entry
        if fixed is not None:
            return fixed
        assert rates is not None
        if extras is not None and (units or service_tier is not None):
            if cache_write_1h_tokens > cache_write_tokens:
                raise ContractError("cache_write_1h_tokens is a part of cache_write_tokens")
            token_total = _token_total(
                rates,
                input_tokens,
                cache_read_tokens,
                cache_write_tokens,
                cache_write_1h_tokens,
                output_tokens,
            )
            cost = _with_extras(token_total, rates[3], extras, units, service_tier)
            return Price(cost, version, matched, False)
        cost = _cost(
            rates,
            input_tokens,
            cache_read_tokens,
            cache_write_tokens,
            cache_write_1h_tokens,
            output_tokens,
        )
        return Price(cost, version, matched, False)

    def price_event(self, event: Mapping[str, Any]) -> Price:
        """Price a (validated) UsageEvent record by the version in force at its occurred_at.

        The aggregator's hot path: a cached (version, model) costs one bisect (or
        none, for the newest version), one dict lookup and integer arithmetic.
        """
        at = event["occurred_at"]
        starts = self._starts
        try:  # the newest version prices most events: no bisect for them
            newest = bool(starts) and at >= starts[-1]
            index = len(starts) - 1 if newest else bisect_right(starts, at) - 1
        except TypeError:
            raise InvalidRecord(
                "occurred_at",
                f"must be a UTC timestamp, got {at!r}",
                record_id=event.get("event_id"),
            ) from None
        if index < 0:
            return NO_VERSION
        model = event["model"]
        entry = self._entries[index].get(model)
        if entry is None:
            entry = self._resolve(index, model)
        fixed, version, matched, rates, extras = entry
        if fixed is not None:
            return fixed
        threshold, base, tier, den = rates  # type: ignore[misc]
        inp = event["input_tokens"]
        read = event["cache_read_tokens"]
        write = event["cache_write_tokens"]
        write_1h = event["cache_write_1h_tokens"]
        if write_1h > write:
            raise InvalidRecord(
                "cache_write_1h_tokens",
                "is a part of cache_write_tokens: cannot exceed it",
                record_id=event.get("event_id"),
            )
        a, b, c, d, e = tier if 0 <= threshold < inp + read + write else base
        total = (
            inp * a + read * b + (write - write_1h) * c + write_1h * d + event["output_tokens"] * e
        )
        if extras is not None:  # only entries that price units or tiers look at them
            units = event.get("units")
            service_tier = event.get("service_tier")
            if units or service_tier is not None:
                return _charged(
                    _with_extras(total, den, extras, units, service_tier), version, matched
                )
        if den != 1:
            quotient, remainder = divmod(total, den)
            twice = remainder + remainder
            if twice > den or (twice == den and quotient & 1):
                quotient += 1
            total = quotient
        return _charged(total, version, matched)

    def worst_case_nanos(
        self,
        model: str,
        *,
        at: datetime,
        input_tokens: int,
        max_output_tokens: int,
        units: Mapping[str, int] | None = None,
    ) -> int:
        """The enforcer's pre-forward estimate: the prompt at the input price (long-context
        tier included) plus ``max_output_tokens`` at the output price, plus the billed
        units the request can cost at most (``units``, known before it is sent) at their
        unit prices; 0 when unpriced."""
        return self.price(
            model, at=at, input_tokens=input_tokens, output_tokens=max_output_tokens, units=units
        ).cost_nanos

    def unpriced_models(self, models: Iterable[str], at: datetime) -> list[str]:
        """The models (each once, in the given order) no entry nor fallback prices at ``at``."""
        table = self.table_at(at)
        unique = list(dict.fromkeys(models))
        if table is None:
            return unique
        return [m for m in unique if table.resolve(m) is None]
