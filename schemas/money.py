"""Money is integer nano-dollars (1 USD = 10**9 nanos).

Prices are decimal USD per million tokens. A cost is computed with exact
decimal arithmetic over all of an event's token classes and rounded once, to
the nearest nano, ties to even (``ROUND_HALF_EVEN``).
"""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from typing import Final

from schemas.errors import ContractError

NANOS_PER_USD: Final = 1_000_000_000
TOKENS_PER_PRICE_UNIT: Final = 1_000_000  # prices are per million tokens
#: nanos per token for a price of 1 USD/Mtok: 10**9 / 10**6
NANOS_PER_TOKEN_AT_ONE_USD_PER_MTOK: Final = Decimal(NANOS_PER_USD) / Decimal(TOKENS_PER_PRICE_UNIT)


def parse_usd(text: str | int | float | Decimal, *, what: str = "amount") -> Decimal:
    """A non-negative decimal USD amount. Floats are refused: they are not exact."""
    if isinstance(text, float):
        raise ContractError(f'{what}: give USD amounts as strings ("3.00"), not floats ({text!r})')
    try:
        value = Decimal(str(text).strip())
    except InvalidOperation:
        raise ContractError(f"{what}: {text!r} is not a decimal number") from None
    if not value.is_finite() or value < 0:
        raise ContractError(f"{what}: {text!r} must be a finite amount >= 0")
    return value


def usd_to_nanos(usd: str | int | Decimal) -> int:
    """Exact conversion of a USD amount to nanos; refuses sub-nano precision."""
    value = parse_usd(usd) * NANOS_PER_USD
    if value != value.to_integral_value():
        raise ContractError(f"{usd!r} USD is not a whole number of nano-dollars")
    return int(value)


def nanos_to_usd(nanos: int) -> Decimal:
    return Decimal(nanos) / NANOS_PER_USD


def format_usd(nanos: int, places: int = 4) -> str:
    """Human display: ``$12.3456``. Never used for arithmetic."""
    if 0 <= places <= 9:
        # in integers (a report formats tens of thousands of rows): the nanos rounded to
        # ``places`` decimals of a dollar, ties to even, as the Decimal path below does
        unit = 10 ** (9 - places)
        units, rest = divmod(nanos, unit)
        if rest * 2 > unit or (rest * 2 == unit and units % 2):
            units += 1
        whole, fraction = divmod(abs(units), 10**places)
        sign = "-" if nanos < 0 else ""  # Decimal keeps the sign of a -0.0000
        return f"${sign}{whole}.{fraction:0{places}d}" if places else f"${sign}{whole}"
    quantum = Decimal(1).scaleb(-places)
    # fixed-point always: a Decimal's str of a few nanos is scientific ("5E-9")
    return f"${nanos_to_usd(nanos).quantize(quantum, rounding=ROUND_HALF_EVEN):f}"


def line_cost(tokens: int, usd_per_mtok: Decimal) -> Decimal:
    """Unrounded cost in nanos of ``tokens`` at ``usd_per_mtok``; sum these, then round once."""
    return Decimal(tokens) * usd_per_mtok * NANOS_PER_TOKEN_AT_ONE_USD_PER_MTOK


def round_nanos(exact_nanos: Decimal) -> int:
    """The one rounding of an event's cost: nearest nano, ties to even."""
    return int(exact_nanos.to_integral_value(rounding=ROUND_HALF_EVEN))
