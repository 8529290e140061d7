"""The exact cost of tokens and billed units over integer rates, rounded once.

Every price is a finite decimal, or (a long-context tier's cache prices, a service
tier's multiple of a price) a decimal times a quotient of decimals: a rational number. Each :class:`ModelPrice` turns its
prices into nanos per token (price x 1000) and writes them over one common
denominator ``D`` (the lcm of their denominators), so each rate is an integer
numerator. An event's exact cost is then ``N / D`` with ``N`` the integer sum
of tokens x numerators; one integer ``divmod`` gives the quotient and the
remainder, and ties (2 x remainder = D) go to the even quotient. No float
and no Decimal context precision is involved, so nothing is rounded before that
last step, whatever the number of digits of the prices. A service tier has rates of its
own, made the same way, so a call it serves is the same sum over other numerators. It equals
``money.round_nanos(sum of money.line_cost(...))`` whenever the latter is
exact (tests check both against a brute-force ``Fraction`` computation).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Final

from schemas.errors import ContractError
from schemas.money import NANOS_PER_USD, TOKENS_PER_PRICE_UNIT

#: nanos per token for a price of 1 USD per million tokens
NANOS_PER_TOKEN: Final = Fraction(NANOS_PER_USD, TOKENS_PER_PRICE_UNIT)

#: (threshold or -1, base numerators, tier numerators, denominator); numerators are
#: per token class (input, cache read, 5-minute cache write, 1-hour cache write, output)
Rates = tuple[int, tuple[int, int, int, int, int], tuple[int, int, int, int, int], int]

#: (unit -> nanos per unit, exact; service tier -> the rates of a call it serves)
Extras = tuple[dict[str, Fraction], dict[str, Rates]]


def cost_with_units(token_total: int, den: int, unit_nanos: dict[str, Fraction], units: Any) -> int:
    """The exact cost of tokens (``token_total / den`` nanos) plus each priced unit,
    rounded once (nearest nano, ties to even)."""
    exact = Fraction(token_total, den)
    for unit, count in units.items():
        nanos = unit_nanos.get(unit)
        if nanos is not None:
            exact += nanos * count
    quotient, remainder = divmod(exact.numerator, exact.denominator)
    twice = remainder * 2
    if twice > exact.denominator or (twice == exact.denominator and quotient & 1):
        quotient += 1
    return quotient


def token_numerator(rates: Rates, inp: int, read: int, write: int, write_1h: int, out: int) -> int:
    """The unrounded token cost's numerator over ``rates``' denominator."""
    threshold, base, tier, _ = rates
    a, b, c, d, e = tier if 0 <= threshold < inp + read + write else base
    return inp * a + read * b + (write - write_1h) * c + write_1h * d + out * e


def rounded_cost(rates: Rates, inp: int, read: int, write: int, write_1h: int, out: int) -> int:
    """The cost of these tokens (nanos) over ``rates``, rounded once (nearest, ties to even)."""
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
