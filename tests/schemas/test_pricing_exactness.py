"""Every cost is the exact sum of its lines rounded once, half to even: checked against a
brute-force ``Fraction`` computation and ``money.line_cost`` over random prices and tokens."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.money import line_cost, round_nanos
from schemas.pricing import (
    LongContextTier,
    ModelPrice,
)
from tests.schemas.kit import AT, book


def half_even(value: Fraction) -> int:
    floor = value.numerator // value.denominator
    rest = value - floor
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and floor % 2 == 1):
        return floor + 1
    return floor


def brute_force(price: ModelPrice, inp: int, read: int, write: int, write_1h: int, out: int) -> int:
    """Each line in exact fractions (USD per Mtok x tokens x 10^9 / 10^6), summed, rounded once."""
    prices = [
        Fraction(str(p))
        for p in (
            price.input_per_mtok,
            price.cache_read_per_mtok,
            price.cache_write_per_mtok,
            price.cache_write_1h_per_mtok,
            price.output_per_mtok,
        )
    ]
    tier = price.long_context
    if tier is not None and inp + read + write > tier.above_input_tokens:
        ratio = Fraction(str(tier.input_per_mtok)) / prices[0]
        prices = [
            Fraction(str(tier.input_per_mtok)),
            prices[1] * ratio,
            prices[2] * ratio,
            prices[3] * ratio,
            Fraction(str(tier.output_per_mtok)),
        ]
    counts = [inp, read, write - write_1h, write_1h, out]
    exact = sum(
        (Fraction(n) * p * 10**9 / 10**6 for n, p in zip(counts, prices, strict=True)), Fraction(0)
    )
    return half_even(exact)


#: decimal strings with 2 to 6 places, at most 10^5 USD/Mtok
usd_per_mtok = st.builds(
    lambda units, places: str(Decimal(units).scaleb(-places)),
    st.integers(min_value=0, max_value=10**7),
    st.integers(min_value=2, max_value=6),
)
optional_usd = st.none() | usd_per_mtok
token_counts = st.integers(min_value=0, max_value=3_000_000)
thresholds = st.integers(min_value=0, max_value=4_000_000)


@st.composite
def model_prices(draw: st.DrawFn) -> ModelPrice:
    tier = None
    base = draw(usd_per_mtok)
    if Decimal(base) > 0 and draw(st.booleans()):
        tier = LongContextTier(
            draw(thresholds), Decimal(draw(usd_per_mtok)), Decimal(draw(usd_per_mtok))
        )
    return ModelPrice.of(
        "m",
        base,
        draw(usd_per_mtok),
        cache_read_per_mtok=draw(optional_usd),
        cache_write_per_mtok=draw(optional_usd),
        cache_write_1h_per_mtok=draw(optional_usd),
        long_context=tier,
    )


@settings(max_examples=300, deadline=None)
@given(
    price=model_prices(),
    inp=token_counts,
    read=token_counts,
    write=token_counts,
    write_1h=token_counts,
    out=token_counts,
)
def test_cost_is_the_exact_sum_rounded_once_half_even(
    price: ModelPrice, inp: int, read: int, write: int, write_1h: int, out: int
) -> None:
    write_1h = min(write_1h, write)
    expected = brute_force(price, inp, read, write, write_1h, out)
    b = book(price)
    got = b.price(
        "m",
        at=AT,
        input_tokens=inp,
        cache_read_tokens=read,
        cache_write_tokens=write,
        cache_write_1h_tokens=write_1h,
        output_tokens=out,
    )
    assert got.cost_nanos == expected
    if price.long_context is None:  # the same as summing money.line_cost and rounding once
        lines = (
            line_cost(inp, price.input_per_mtok)
            + line_cost(read, price.cache_read_per_mtok)
            + line_cost(write - write_1h, price.cache_write_per_mtok)
            + line_cost(write_1h, price.cache_write_1h_per_mtok)
            + line_cost(out, price.output_per_mtok)
        )
        assert round_nanos(lines) == expected
