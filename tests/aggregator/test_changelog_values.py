"""The counter changelog value written directly equals ``json.dumps`` of ``to_json()``,
byte for byte, for every counter shape (and decodes back to the same state)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from aggregator.counting.counter_codec import decode_counter, encode_counter, encode_counter_json
from aggregator.counting.fold import CounterState, PeriodTotals

INTS = st.integers(-(2**70), 2**70)
PERIOD_KEYS = st.one_of(
    st.sampled_from(["m:2026-11", "d:2026-11-30", "w:2026-W48", "t", "r:1h", "r:90m"]),
    st.text(max_size=8),  # anything, quotes, escapes and non-ASCII included
)


@st.composite
def counter_states(draw: st.DrawFn) -> CounterState:
    periods = {
        key: PeriodTotals(
            draw(INTS),
            draw(INTS),
            draw(INTS),
            draw(INTS),
            draw(st.lists(st.sampled_from([0.5, 0.8, 1.0, 0.25]), max_size=3, unique=True)),
            draw(
                st.dictionaries(
                    st.integers(0, 2**40), st.lists(INTS, min_size=3, max_size=3), max_size=48
                )
            ),
        )
        for key in draw(st.lists(PERIOD_KEYS, max_size=4, unique=True))
    }
    return CounterState(
        period=draw(PERIOD_KEYS),
        seq=draw(INTS),
        periods=periods,
        fence=draw(st.dictionaries(st.integers(0, 2**31), st.integers(-1, 2**62), max_size=4)),
    )


@settings(max_examples=300, deadline=None)
@given(state=counter_states())
def test_the_direct_writer_equals_json_dumps(state: CounterState) -> None:
    assert encode_counter(state) == encode_counter_json(state)
    assert decode_counter(encode_counter(state)) == state


def test_values_json_writes_differently_go_through_json_dumps() -> None:
    odd = CounterState(
        period='m:"quoted"\\',  # json escapes it; an f-string would not
        seq=1,
        # a bool in a list: json writes true, an f-string would write True
        periods={"t": PeriodTotals(1, 2, 3, 4, [], {0: [True, 2, 3]})},
    )
    assert encode_counter(odd) == encode_counter_json(odd)
    assert b'"p":"m:\\"quoted\\"\\\\"' in encode_counter(odd)
    assert b'"0":[true,2,3]' in encode_counter(odd)
