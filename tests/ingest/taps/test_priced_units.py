"""Golden captures with billed units, priced by the shipped price file: what each unit
adds, exactly (audio and image surcharges, code-interpreter sessions, Gemini 3 grounding
queries), hand-computed from the prices the file cites."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from schemas.pricing import PriceBook
from tests.ingest.taps.taps_support import GOLDEN, response_bytes, run

AT = datetime(2026, 12, 2, tzinfo=UTC)
BOOK = PriceBook.from_file()

#: capture name -> (matched entry, cost in nanos): tokens + units
PRICED = {
    # 1227 in x $2 + 416 out x $12 per M, + 3 queries x $0.014
    "gemini 3 stream: grounding billed per search query (distinct webSearchQueries), "
    "query-like text": ("gemini-3-pro", 2_454_000 + 4_992_000 + 42_000_000),
    "gemini 3 body: grounding billed per search query": (
        "gemini-3-pro",
        2_454_000 + 4_992_000 + 42_000_000,
    ),
    # 1300 in x $0.30 + 1302 out x $2.50 per M, + 1290 image tokens x $27.50 per M
    "gemini body: image in and image out (IMAGE modality tokens, inside the totals)": (
        "gemini-2.5-flash-image",
        390_000 + 3_255_000 + 35_475_000,
    ),
    "gemini stream: image in and image out": (
        "gemini-2.5-flash-image",
        390_000 + 3_255_000 + 35_475_000,
    ),
    # 820 in x $0.30, 3200 cache reads x $0.03, 9 out x $2.50 per M, + 800 audio x $0.70 per M
    "gemini body: audio input, most of it from a context cache (cached audio is a cache read)": (
        "gemini-2.5-flash",
        246_000 + 96_000 + 22_500 + 560_000,
    ),
    # 2210 in x $2 + 188 out x $8 per M, + one container session x $0.03
    "openai responses stream: two code-interpreter calls in one auto container (one session)": (
        "gpt-4.1",
        4_420_000 + 1_504_000 + 30_000_000,
    ),
    "openai responses body: two code-interpreter calls in one auto container": (
        "gpt-4.1",
        4_420_000 + 1_504_000 + 30_000_000,
    ),
    "openai responses body: a container the request names by id is no new session": (
        "gpt-4.1",
        4_420_000 + 1_504_000,
    ),
    # 1180 in x $2.50 + 220 out x $10 per M, + 1000 audio in x $37.50 + 200 out x $70 per M
    # (flex is no tier of the audio models: base prices)
    "openai chat body: audio tokens (inside the totals), flex tier": (
        "gpt-4o-audio",
        2_950_000 + 2_200_000 + 37_500_000 + 14_000_000,
    ),
}
CASES = {case["name"]: case for case in GOLDEN}

#: Gemini captures whose tier the response header names (x-gemini-service-tier), priced
#: by the shipped file's newest version (Gemini flex and priority from LiteLLM):
#: 2.5 Flash-Lite $0.10 in, $0.01 cached, $0.40 out per M; flex half of input and
#: output, cached at $0.01; priority 1.8x every price
TIERED = {
    # 2000 x $0.05 + 30000 x $0.01 + 420 x $0.20 per M
    "gemini flex asked for and served (x-gemini-service-tier): charged at flex": 484_000,
    # 2000 x $0.10 + 30000 x $0.01 + 420 x $0.40 per M: a discount not asked for
    "gemini flex served to a request that did not ask for it: the standard rate": 668_000,
    # 1104 x $0.10 + 4096 x $0.01 + 1510 x $0.40 per M: the tier that served, standard
    "gemini priority asked for (enum spelling), served at standard: standard": 755_360,
    # 1104 x $0.18 + 4096 x $0.018 + 1510 x $0.72 per M
    "gemini priority asked for and served: priority": 1_359_648,
}


@pytest.mark.parametrize("name", sorted(PRICED))
def test_each_unit_of_a_capture_is_priced(name: str) -> None:
    case = CASES[name]
    result = run(case, [response_bytes(case)])
    price = BOOK.price(
        result.model or "",
        at=AT,
        input_tokens=result.input_tokens,
        cache_read_tokens=result.cache_read_tokens,
        cache_write_tokens=result.cache_write_tokens,
        cache_write_1h_tokens=result.cache_write_1h_tokens,
        output_tokens=result.output_tokens,
        units=dict(result.units),
        service_tier=result.service_tier,
    )
    assert (price.matched, price.cost_nanos) == PRICED[name]


@pytest.mark.parametrize("name", sorted(TIERED))
def test_a_gemini_tier_the_response_header_names_is_priced_at_it(name: str) -> None:
    case = CASES[name]
    result = run(case, [response_bytes(case)])
    price = BOOK.price(
        result.model or "",
        at=BOOK.tables[-1].effective_from,
        input_tokens=result.input_tokens,
        cache_read_tokens=result.cache_read_tokens,
        output_tokens=result.output_tokens,
        service_tier=result.service_tier,
    )
    assert (price.matched, price.cost_nanos) == ("gemini-2.5-flash-lite", TIERED[name])


def test_gemini_2_grounding_is_per_prompt_and_gemini_3_per_query() -> None:
    """The tap counts both units on every grounded answer; each model prices its own."""
    units = {"grounded_prompt": 1, "grounding_query": 4}
    assert BOOK.price("gemini-2.5-flash", at=AT, units=units).cost_nanos == 35_000_000
    assert BOOK.price("gemini-3-pro-preview", at=AT, units=units).cost_nanos == 56_000_000


def test_realtime_audio_and_image_surcharges_reach_the_modality_rates() -> None:
    """gpt-realtime: text $4 / M; audio in $32, out $64; image in $5 (the cited rates)."""
    price = BOOK.price(
        "gpt-realtime-2025-08-28",
        at=AT,
        input_tokens=3_000_000,
        output_tokens=1_000_000,
        units={
            "input_audio_tokens": 1_000_000,
            "input_image_tokens": 1_000_000,
            "output_audio_tokens": 1_000_000,
        },
    )
    assert price.cost_nanos == (4 + 32 + 5 + 64) * 10**9
