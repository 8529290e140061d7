"""Every refusal style's status, body and headers, and the warn header."""

from __future__ import annotations

from datetime import timedelta

import pytest
from enforcer_testkit import NOW, budget, ctx, loaded_enforcer, refresh, verdict

from enforcer.refusals import header_text

USD = 1_000_000_000
ORG = budget("org-monthly", limit_usd=100)
JOB = budget("job", "session", window="total", limit_usd=1)
EXHAUSTED = [
    verdict(ORG, ["acme"], spent_nanos=100 * USD),
    verdict(JOB, ["acme", "sk-1", "run-1"], spent_nanos=USD),
]
RESET = "2026-12-01T00:00:00Z"
TWELVE_HOURS = str(12 * 3600)


def refused(style: str = "default", **fields: object):  # type: ignore[no-untyped-def]
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
        "message": f"Budget 'org-monthly' is exhausted until {RESET}.",
    }
    assert d.headers == (
        ("Content-Type", "application/json"),
        ("Retry-After", TWELVE_HOURS),
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
def test_failed_closed_is_503_retry_after_30_in_every_style(provider, check) -> None:  # type: ignore[no-untyped-def]
    e, clock = loaded_enforcer(
        [ORG], fail_mode="closed", refusal_style="default" if provider is None else "native"
    )
    clock.advance(3600)
    d = e.check(ctx(provider=provider))
    assert d.status == 503 and ("Retry-After", "30") in d.headers and check(d.body)
    if provider == "bedrock":
        assert ("x-amzn-ErrorType", "ServiceUnavailableException") in d.headers


def test_in_flight_refusal() -> None:
    b = budget("tight", limit_nanos=1000)
    e, _ = loaded_enforcer([b], [verdict(b, ["acme"])], in_flight_retry_after_s=3)
    d = e.check(ctx())
    assert d.status == 402 and d.retry_after == 3
    assert d.body is not None and d.body["error"] == "in_flight_budget_exceeded"
    assert not any(name == "X-Spend-Budget" for name, _ in d.headers)


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
