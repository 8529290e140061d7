"""The worst case counts every candidate: ``n`` completions (OpenAI ``n``, Gemini
``candidateCount``) each write up to the max output (issue 21)."""

from __future__ import annotations

import pytest

from enforcer import Context
from enforcer.errors import InvalidContext
from tests.enforcer.kit import budget, ctx, loaded_enforcer, verdict


def test_the_hold_is_the_max_output_times_the_candidates() -> None:
    b = budget("tokens", limit_tokens=100_000)
    e, _ = loaded_enforcer([b], [verdict(b, ["acme"])], default_max_output_tokens=4000)
    one = e.check(ctx(max_output_tokens=1000))
    eight = e.check(ctx(max_output_tokens=1000, candidates=8))
    default = e.check(ctx(max_output_tokens=None, candidates=3))
    held = [e.holds.get(d.hold_id) for d in (one, eight, default) if d.hold_id is not None]
    assert [h.tokens for h in held if h is not None] == [2000, 9000, 1000 + 12_000]


def test_n_eight_does_not_fit_where_one_does_and_the_fit_is_per_candidate() -> None:
    """$3/$15 per Mtok: 1000 input + 8 x 1000 output = $0.123 over the $0.05 left; the
    largest max_tokens that fits is per candidate: (0.05 - 0.003) / 15e-6 / 8 = 391."""
    b = budget("tight", limit_nanos=50_000_000)
    e, _ = loaded_enforcer([b], [verdict(b, ["acme"])])
    assert e.peek(ctx()).allowed
    d = e.check(ctx(candidates=8))
    assert not d.allowed and d.body is not None
    assert d.body["reason"] == "request_too_large"
    assert d.body["request_tokens"] == 9000
    assert d.body["max_tokens_that_fits"] == 391
    assert e.peek(ctx(candidates=8, max_output_tokens=391)).allowed
    assert not e.peek(ctx(candidates=8, max_output_tokens=392)).allowed


@pytest.mark.parametrize("bad", [0, -1, 129, "2", 2.0, True])
def test_candidates_must_be_a_small_positive_integer(bad: object) -> None:
    with pytest.raises(InvalidContext) as raised:
        ctx(candidates=bad)
    assert raised.value.field == "candidates"


def test_candidates_round_trip_through_the_sidecar_mapping() -> None:
    c = Context.from_mapping({"org_id": "acme", "secret_id": "sk-1", "candidates": 4})
    assert c.candidates == 4 and c.to_json()["candidates"] == 4
    assert "candidates" not in Context(org_id="acme", secret_id="sk-1").to_json()
