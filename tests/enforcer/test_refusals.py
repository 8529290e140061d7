"""Every refusal style's status, body and headers, and the warn header."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from enforcer import Decision
from enforcer.response import header_text
from tests.enforcer.kit import NOW, budget, ctx, loaded_enforcer, refresh, verdict

USD = 1_000_000_000
ORG = budget("org-monthly", limit_usd=100)
JOB = budget("job", "session", window="total", limit_usd=1)
EXHAUSTED = [
    verdict(ORG, ["acme"], spent_nanos=100 * USD),
    verdict(JOB, ["acme", "sk-1", "run-1"], spent_nanos=USD),
]
RESET = "2026-12-01T00:00:00Z"
TWELVE_HOURS = str(12 * 3600)


def refused(style: str = "default", **fields: object) -> Decision:
    e, _ = loaded_enforcer([ORG], EXHAUSTED, refusal_style=style)
    d = e.check(ctx(**fields))
    assert not d.allowed
    return d


def test_default_body_and_headers() -> None:
    d = refused()
    assert d.status == 402
    assert d.body == {
        "error": "budget_exceeded",
        "budget_id": "org-monthly",
        "counter": "11:org-monthly,4:acme,",
        "period": "m:2026-11",
        "limit_nanos": 100 * USD,
        "spent_nanos": 100 * USD,
        "reset_at": RESET,
        "limit_tokens": None,
        "spent_tokens": 0,
        "limit_requests": None,
        "spent_requests": 0,
        "held_nanos": 0,
        "reason": "exhausted",
        "message": f"Budget 'org-monthly' is exhausted until {RESET}.",
    }
    assert d.headers == (
        ("Content-Type", "application/json"),
        ("Retry-After", TWELVE_HOURS),
        ("x-should-retry", "false"),
        ("X-Spend-Budget", f"org-monthly; scope=org; used=100%; state=exceeded; reset={RESET}"),
    )


def test_job_ceiling_default() -> None:
    e, _ = loaded_enforcer([JOB], EXHAUSTED)
    d = e.check(ctx(session_id="run-1"))
    assert d.status == 429 and d.body is not None
    assert d.body["error"] == "job_budget_exceeded" and d.body["reset_at"] is None
    assert d.retry_after is None  # a total budget never resets


@pytest.mark.parametrize("provider", ["anthropic", "Anthropic"])
def test_native_anthropic(provider: str) -> None:
    d = refused("native", provider=provider)
    assert d.status == 429
    assert d.body == {
        "type": "error",
        "error": {
            "type": "rate_limit_error",
            "message": f"Budget 'org-monthly' is exhausted until {RESET}.",
        },
    }
    assert ("Retry-After", TWELVE_HOURS) in d.headers


@pytest.mark.parametrize("provider", ["openai", "azure_openai"])
def test_native_openai(provider: str) -> None:
    d = refused("native", provider=provider)
    assert d.status == 429
    assert d.body == {
        "error": {
            "message": f"Budget 'org-monthly' is exhausted until {RESET}.",
            "type": "insufficient_quota",
            "param": None,
            "code": "insufficient_quota",
        }
    }
    assert ("Retry-After", TWELVE_HOURS) in d.headers


@pytest.mark.parametrize("provider", ["gemini", "vertex_ai"])
def test_native_gemini(provider: str) -> None:
    d = refused("native", provider=provider)
    assert d.status == 429
    assert d.body == {
        "error": {
            "code": 429,
            "message": f"Budget 'org-monthly' is exhausted until {RESET}.",
            "status": "RESOURCE_EXHAUSTED",
        }
    }
    assert ("Retry-After", TWELVE_HOURS) in d.headers


def test_native_bedrock() -> None:
    d = refused("native", provider="bedrock")
    assert d.status == 429
    assert d.body == {"message": f"Budget 'org-monthly' is exhausted until {RESET}."}
    assert ("x-amzn-ErrorType", "ThrottlingException") in d.headers
    assert ("Retry-After", TWELVE_HOURS) in d.headers


def test_native_job_ceiling_is_429_too() -> None:
    e, _ = loaded_enforcer([JOB], EXHAUSTED, refusal_style="native")
    d = e.check(ctx(provider="openai", session_id="run-1"))
    assert d.status == 429 and d.body is not None
    assert d.body["error"]["type"] == "insufficient_quota"


def test_native_with_an_unknown_provider_falls_back_to_default() -> None:
    d = refused("native", provider="some-local-llm")
    assert d.status == 402 and d.body is not None and d.body["error"] == "budget_exceeded"


@pytest.mark.parametrize(
    ("provider", "check"),
    [
        (None, lambda b: b["error"] == "failed_closed" and b["reason"] == "stale"),
        ("anthropic", lambda b: b["error"]["type"] == "api_error"),
        ("openai", lambda b: b["error"]["type"] == "server_error"),
        ("gemini", lambda b: b["error"]["status"] == "UNAVAILABLE"),
        ("bedrock", lambda b: "message" in b),
    ],
)
def test_failed_closed_is_503_retry_after_30_in_every_style(
    provider: str | None, check: Callable[[Any], bool]
) -> None:
    e, clock = loaded_enforcer(
        [ORG], fail_mode="closed", refusal_style="default" if provider is None else "native"
    )
    clock.advance(3600)
    d = e.check(ctx(provider=provider))
    assert d.status == 503 and ("Retry-After", "30") in d.headers and check(d.body)
    if provider == "bedrock":
        assert ("x-amzn-ErrorType", "ServiceUnavailableException") in d.headers


def test_in_flight_refusal_only_when_holds_keep_the_request_out() -> None:
    # $3/$15 per Mtok: 1000 in + 1000 out = $0.018 worst case; $0.030 left
    b = budget("tight", limit_nanos=30_000_000)
    e, _ = loaded_enforcer([b], [verdict(b, ["acme"])], in_flight_retry_after_s=3)
    first = e.check(ctx())
    assert first.allowed  # holds $0.018: $0.012 left, the same request no longer fits
    d = e.check(ctx())
    assert d.decision == "in_flight_budget_exceeded"
    assert d.status == 402 and d.retry_after == 3
    assert ("x-should-retry", "true") in d.headers  # a retry soon may pass
    assert d.body is not None and d.body["reason"] == "in_flight"
    assert d.body["held_nanos"] == 18_000_000 and d.body["held_requests"] == 1
    assert d.body["remaining_nanos"] == 12_000_000
    assert d.body["request_nanos"] == 18_000_000 and d.body["request_tokens"] == 2000
    # 1000 input = $0.003; what is left after the hold buys 9000 / 15 = 600 output tokens
    assert d.body["max_tokens_that_fits"] == 600
    assert "retry when they finish" in d.body["message"] and "600" in d.body["message"]
    assert not any(name == "X-Spend-Budget" for name, _ in d.headers)
    e.release(first.hold_id)
    assert e.check(ctx()).allowed  # the hold gone, the same request passes


def test_a_request_too_large_for_what_is_left_is_not_called_in_flight() -> None:
    """Nothing in flight, 95.7 % spent: the worst case does not fit the $0.0129 left."""
    b = budget("tight", limit_nanos=300_000_000)
    e, _ = loaded_enforcer([b], [verdict(b, ["acme"], spent_nanos=287_100_000)])
    d = e.check(ctx())
    assert len(e.holds) == 0 and d.decision == "budget_exceeded"
    assert d.status == 402 and d.retry_after == int(TWELVE_HOURS)  # the period's reset
    assert ("x-should-retry", "false") in d.headers
    body = d.body
    assert body is not None and body["reason"] == "request_too_large"
    assert body["remaining_nanos"] == 12_900_000 and body["held_nanos"] == 0
    assert body["request_nanos"] == 18_000_000 and body["replicas"] == 1
    # (12.9M - 3M input) / 15 per token = 660 output tokens
    assert body["max_tokens_that_fits"] == 660
    assert "does not fit what is left ($0.012900)" in body["message"]
    assert "The largest max_tokens that fits now is 660." in body["message"]
    assert e.check(ctx(max_output_tokens=660)).allowed  # what it said fits does
    assert not e.check(ctx(max_output_tokens=661)).allowed
    assert [c.state for c in d.counters] == ["too_large"]


def test_too_large_with_nothing_that_fits_and_a_total_budget_has_no_retry_after() -> None:
    b = budget("lifetime", window="total", limit_nanos=2_000_000)  # less than the input alone
    e, _ = loaded_enforcer([b], [verdict(b, ["acme"])])
    d = e.check(ctx())
    assert d.body is not None and d.body["reason"] == "request_too_large"
    assert d.body["max_tokens_that_fits"] is None and d.retry_after is None
    assert not any(name == "Retry-After" for name, _ in d.headers)
    assert "Not even the input fits" in d.body["message"]


def test_too_large_names_this_replicas_share() -> None:
    b = budget("tight", limit_nanos=30_000_000)
    e, _ = loaded_enforcer([b], [verdict(b, ["acme"])], replicas=2)
    d = e.check(ctx())  # 2 x 0.018 > 0.030: the share of one replica is $0.015
    assert d.body is not None and d.body["reason"] == "request_too_large"
    assert d.body["replicas"] == 2 and d.body["max_tokens_that_fits"] == 800
    assert "$0.015000 of it this replica's 1/2 share" in d.body["message"]


def test_native_too_large_tells_the_sdk_not_to_retry() -> None:
    b = budget("tight", limit_nanos=10_000_000)
    e, _ = loaded_enforcer([b], [verdict(b, ["acme"])], refusal_style="native")
    d = e.check(ctx(provider="openai"))
    assert d.status == 429 and ("x-should-retry", "false") in d.headers
    assert d.body is not None and "does not fit" in d.body["error"]["message"]


def test_seed000_body_field_by_field() -> None:
    """Seed 000's 402 body: error, secretId, period, limitCents, spentCents, nothing else."""
    e, _ = loaded_enforcer([ORG], EXHAUSTED, refusal_style="seed000")
    d = e.check(ctx(secret_id="sk-Seed"))
    assert d.status == 402
    assert d.body == {
        "error": "budget_exceeded",
        "secretId": "sk-Seed",
        "period": "m:2026-11",
        "limitCents": 10_000,
        "spentCents": 10_000,
    }
    assert ("Retry-After", TWELVE_HOURS) in d.headers
    assert ("x-should-retry", "false") in d.headers
    [message] = [v for name, v in d.headers if name == "X-Spend-Refusal"]
    assert message.startswith("Budget%20'org-monthly'%20is%20exhausted")


def test_seed000_rounds_limit_down_and_spend_up_and_nulls_without_usd() -> None:
    b = budget("odd", limit_nanos=12_345_678_901)
    tokens = budget("tok", limit_tokens=10)
    e, _ = loaded_enforcer(
        [b, tokens],
        [verdict(b, ["acme"]), verdict(tokens, ["acme"])],
        refusal_style="seed000",
    )
    d = e.check(ctx())  # tokens: 2000 > 10, nothing fits; the USD budget still has room
    assert d.body == {
        "error": "budget_exceeded",
        "secretId": "sk-1",
        "period": "m:2026-11",
        "limitCents": None,
        "spentCents": None,
    }
    e2, _ = loaded_enforcer(
        [b], [verdict(b, ["acme"], spent_nanos=12_345_678_901)], refusal_style="seed000"
    )
    body = e2.check(ctx()).body
    assert body is not None and (body["limitCents"], body["spentCents"]) == (1234, 1235)
    # in flight: the same body, a short Retry-After and a retry allowed
    b3 = budget("tight", limit_nanos=30_000_000)
    e3, _ = loaded_enforcer([b3], [verdict(b3, ["acme"])], refusal_style="seed000")
    assert e3.check(ctx()).allowed
    d3 = e3.check(ctx())
    assert d3.status == 402 and d3.body is not None and d3.body["error"] == "budget_exceeded"
    assert d3.retry_after == 5 and ("x-should-retry", "true") in d3.headers


def test_seed000_fail_closed_keeps_the_default_503() -> None:
    e, clock = loaded_enforcer([ORG], fail_mode="closed", refusal_style="seed000")
    clock.advance(3600)
    d = e.check(ctx())
    assert d.status == 503 and d.body is not None and d.body["error"] == "failed_closed"


def test_warn_header_for_several_counters() -> None:
    soft = budget("soft", "user", action="warn", limit_tokens=100, window="day")
    alerting = budget("org", limit_usd=10, alert_at=(0.75,))
    e, _ = loaded_enforcer(
        [soft, alerting],
        [
            verdict(soft, ["acme", "bob"], spent_tokens=150),
            verdict(alerting, ["acme"], spent_nanos=8 * USD),
        ],
    )
    d = e.check(ctx(user_id="bob"))
    assert d.allowed and d.status == 200 and d.body is None
    assert d.headers == (
        ("X-Spend-Budget", f"org; scope=org; used=80%; state=alert; reset={RESET}"),
        ("X-Spend-Budget", f"soft; scope=user; used=150%; state=exceeded; reset={RESET}"),
    )


def test_header_values_cannot_be_split() -> None:
    assert header_text("a;b,c\r\nX-Evil: 1") == "a%3Bb%2Cc%0D%0AX-Evil:%201"
    b = budget("weird; id\r\n", action="warn", limit_nanos=1)
    e, _ = loaded_enforcer([b], [verdict(b, ["acme"], spent_nanos=1)])
    [(_name, value)] = e.check(ctx()).headers
    assert "\r" not in value and "\n" not in value and value.startswith("weird%3B%20id%0D%0A;")


def test_cached_warning_headers_follow_spend_state_and_period() -> None:
    """X-Spend-Budget headers come from a per-plan cache: each answer equals the header
    built afresh from its counter, as the spend, the state and the period move."""
    from enforcer.refusals import spend_header

    soft = budget("soft", "user", action="warn", limit_tokens=1000, window="day", alert_at=(0.8,))
    e, clock = loaded_enforcer([soft], [verdict(soft, ["acme", "bob"], spent_tokens=800)])
    key = verdict(soft, ["acme", "bob"])["counter_key"]
    seen = []
    for seq, (spent, at) in enumerate(
        [
            (800, NOW),
            (800, NOW),
            (815, NOW),
            (1000, NOW),
            (2000, NOW),
            (900, NOW),
            (900, NOW + timedelta(days=1)),
        ],
        start=2,
    ):
        clock.set(at)
        refresh(e)
        e.state.apply_verdict(
            key, verdict(soft, ["acme", "bob"], spent_tokens=spent, seq=seq, at=at)
        )
        d = e.check(ctx(user_id="bob"), reserve=False)
        fresh = tuple(spend_header(c) for c in d.counters if c.state in ("alert", "exceeded"))
        assert d.headers == fresh
        seen.append(d.headers)
    assert seen[0] == seen[1] and len({h for h in seen}) == 6  # each change, a new header
    assert "used=81%; state=alert" in seen[2][0][1] and "state=exceeded" in seen[3][0][1]


@pytest.mark.parametrize("seed", range(12))
def test_the_max_tokens_that_fits_is_the_largest_a_peek_admits(seed: int) -> None:
    """Random spend, limits (USD and tokens), replicas and holds: the refusal's
    max_tokens_that_fits is admitted and one more is not (None: not even 0 is)."""
    import random

    rng = random.Random(seed)
    usd = budget("usd", limit_nanos=rng.randrange(50_000_000, 400_000_000))
    tok = budget("tok", "secret", limit_tokens=rng.randrange(5_000, 60_000))
    verdicts = [
        verdict(usd, ["acme"], spent_nanos=rng.randrange(usd.limit_nanos or 1)),
        verdict(tok, ["acme", "sk-1"], spent_tokens=rng.randrange(tok.limit_tokens or 1)),
    ]
    e, _ = loaded_enforcer([usd, tok], verdicts, replicas=rng.choice([1, 2, 3]))
    for _ in range(rng.randrange(4)):
        e.check(ctx(input_tokens=rng.randrange(2000), max_output_tokens=rng.randrange(1, 3000)))
    refused = 0
    for _ in range(20):
        input_tokens = rng.randrange(3000)
        wanted = rng.randrange(1, 20_000)
        d = e.peek(ctx(input_tokens=input_tokens, max_output_tokens=wanted))
        if d.allowed or d.body is None or d.body["reason"] == "exhausted":
            continue
        refused += 1
        fit = d.body["max_tokens_that_fits"]
        if fit is None:
            assert not e.peek(ctx(input_tokens=input_tokens, max_output_tokens=0)).allowed
            continue
        assert 0 <= fit < wanted
        assert e.peek(ctx(input_tokens=input_tokens, max_output_tokens=fit)).allowed
        assert not e.peek(ctx(input_tokens=input_tokens, max_output_tokens=fit + 1)).allowed
    assert refused > 0
