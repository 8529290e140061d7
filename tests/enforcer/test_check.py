"""check(ctx) from memory: budgets, periods, seq rules, fail modes, hostile contexts."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from enforcer import Context, Enforcer, InvalidContext
from enforcer.plans import Index
from schemas.budgets import applicable
from schemas.ids import canonical_id, counter_key
from schemas.records import Verdict
from schemas.usage import (
    ALLOWED,
    BUDGET_EXCEEDED,
    FAILED_CLOSED,
    FAILED_OPEN,
    IN_FLIGHT_BUDGET_EXCEEDED,
    JOB_BUDGET_EXCEEDED,
    MAX_TOKENS_PER_EVENT,
    validate_usage_event,
)
from tests.enforcer.kit import (
    NOW,
    FakeClock,
    budget,
    ctx,
    loaded_enforcer,
    policy_record,
    refresh,
    verdict,
)

USD = 1_000_000_000
ORG = budget("org-monthly", limit_usd=100)


def apply(enforcer: Enforcer, record: Verdict) -> bool:
    return enforcer.state.apply_verdict(record["counter_key"], record)


def test_no_budget_allows_and_holds_nothing() -> None:
    e, _ = loaded_enforcer()
    d = e.check(ctx())
    assert d.allowed and d.decision == ALLOWED and d.status == 200
    assert d.headers == () and d.body is None and d.hold_id is None


def test_blocked_once_the_verdict_marks_exhaustion() -> None:
    e, _ = loaded_enforcer([ORG], [verdict(ORG, ["acme"], spent_nanos=50 * USD)])
    assert e.check(ctx()).allowed
    apply(e, verdict(ORG, ["acme"], spent_nanos=100 * USD, seq=2))  # reaching the limit exhausts
    d = e.check(ctx())
    assert not d.allowed and d.decision == BUDGET_EXCEEDED and d.status == 402
    assert d.budget_id == "org-monthly" and d.outcome == "refused"
    # another org is not affected
    assert e.check(ctx(org_id="globex")).allowed


def test_a_lower_seq_is_ignored() -> None:
    e, _ = loaded_enforcer([ORG], [verdict(ORG, ["acme"], spent_nanos=100 * USD, seq=5)])
    assert not apply(e, verdict(ORG, ["acme"], spent_nanos=0, seq=4))
    assert e.check(ctx()).decision == BUDGET_EXCEEDED
    assert e.state.verdicts_ignored == 1
    assert apply(e, verdict(ORG, ["acme"], spent_nanos=1, seq=5))  # same seq: re-delivery, applied


def test_a_past_period_never_blocks_the_current_one() -> None:
    yesterday = NOW - timedelta(days=1)
    daily = budget("daily", window="day", limit_usd=1)
    e, _clock = loaded_enforcer([daily], [verdict(daily, ["acme"], spent_nanos=USD, at=yesterday)])
    assert e.check(ctx()).allowed  # yesterday's exhaustion is yesterday's
    # and a late verdict of yesterday, even with a higher seq, does not replace today's
    apply(e, verdict(daily, ["acme"], spent_nanos=10, seq=2))
    assert not apply(e, verdict(daily, ["acme"], spent_nanos=USD, seq=3, at=yesterday))
    assert e.check(ctx()).allowed


def test_unblocked_at_period_rollover() -> None:
    e, clock = loaded_enforcer([ORG], [verdict(ORG, ["acme"], spent_nanos=100 * USD)])
    d = e.check(ctx())
    assert d.decision == BUDGET_EXCEEDED
    assert d.retry_after == 12 * 3600  # NOW is 2026-11-30 12:00; the month resets at midnight
    clock.set(NOW.replace(day=30, hour=23, minute=59, second=59))
    refresh(e)
    assert e.check(ctx()).decision == BUDGET_EXCEEDED
    clock.advance(1)  # 2026-12-01T00:00:00Z
    d = e.check(ctx())
    assert d.allowed and d.counters[0].period == "m:2026-12" and d.counters[0].spent_nanos == 0


def test_a_rolling_window_drops_the_buckets_that_left_it_by_the_enforcer_clock() -> None:
    """No verdict follows once traffic stops (refusals are not counted): the enforcer
    drops each bucket as it leaves the window, and the refusal says when the request fits."""
    rolling = budget("five-hours", window="rolling:5h", limit_usd=1)
    width_s = 5 * 3600 // 48  # 375 s
    # $0.40 three buckets before NOW's bucket, $0.60 in NOW's own: exhausted at NOW
    e, clock = loaded_enforcer(
        [rolling],
        [verdict(rolling, ["acme"], buckets={3: (4 * USD // 10, 0, 0), 0: (6 * USD // 10, 0, 0)})],
    )
    d = e.check(ctx())
    assert d.decision == BUDGET_EXCEEDED and d.counters[0].spent_nanos == USD
    # the older bucket leaves 48 - 3 buckets after NOW's bucket began (NOW is on a bucket
    # boundary): then $0.60 is left and the request ($0.018) fits
    reopens = NOW + timedelta(seconds=45 * width_s)
    assert d.body is not None and d.body["reset_at"] == reopens.isoformat().replace("+00:00", "Z")
    assert d.retry_after == 45 * width_s
    clock.set(reopens - timedelta(microseconds=1))
    refresh(e)
    assert e.check(ctx()).decision == BUDGET_EXCEEDED
    clock.set(reopens)
    refresh(e)
    d = e.check(ctx())
    assert d.allowed and d.counters[0].spent_nanos == 6 * USD // 10


def test_a_rolling_refusal_waits_for_room_for_the_request() -> None:
    """Exhausted by requests: it reopens when enough buckets left for one more request,
    and a request the limit cannot hold at all is refused without a Retry-After."""
    rolling = budget("per-hour", window="rolling:1h", limit_requests=3, limit_tokens=10_000)
    width = timedelta(seconds=3600 // 48)
    e, clock = loaded_enforcer(
        [rolling],
        [verdict(rolling, ["acme"], buckets={10: (0, 100, 1), 5: (0, 100, 1), 1: (0, 100, 1)})],
    )
    d = e.check(ctx())
    assert d.decision == BUDGET_EXCEEDED
    # one request more needs one bucket to leave: the oldest (age 10) leaves first
    assert d.retry_after == int((48 - 10) * width.total_seconds())
    too_big = e.check(ctx(input_tokens=9_000, max_output_tokens=2_000))
    assert too_big.decision == BUDGET_EXCEEDED and too_big.retry_after is None
    assert too_big.body is not None and too_big.body["reset_at"] is None
    # once the two oldest buckets left, one request is left in the window
    clock.set(NOW + (48 - 5) * width)
    refresh(e)
    d = e.check(ctx())
    assert d.allowed and d.counters[0].spent_requests == 1


def test_a_v2_rolling_verdict_counts_its_spend_until_its_newest_bucket_leaves() -> None:
    """A verdict without buckets (written before v3): all of its spend is taken to be in
    its newest bucket, the latest it can be, so it never reopens early, but it reopens."""
    rolling = budget("five-hours", window="rolling:5h", limit_usd=1)
    width_s = 5 * 3600 // 48
    old = NOW - timedelta(hours=5) + timedelta(seconds=width_s)  # its bucket: the oldest one
    e, clock = loaded_enforcer([rolling], [verdict(rolling, ["acme"], spent_nanos=USD, at=old)])
    d = e.check(ctx())
    assert d.decision == BUDGET_EXCEEDED and d.retry_after == width_s
    clock.advance(width_s)
    refresh(e)
    d = e.check(ctx())
    assert d.allowed and d.counters[0].spent_nanos == 0


def test_total_budgets_have_no_retry_after() -> None:
    total = budget("lifetime", window="total", limit_usd=1)
    e, _ = loaded_enforcer([total], [verdict(total, ["acme"], spent_nanos=USD)])
    d = e.check(ctx())
    assert d.decision == BUDGET_EXCEEDED and d.retry_after is None
    assert all(name != "Retry-After" for name, _ in d.headers)


def test_every_applicable_budget_must_pass_and_the_last_reset_is_reported() -> None:
    daily = budget("daily", window="day", limit_usd=1)
    monthly = budget("monthly", window="month", limit_usd=10)
    user = budget("per-user", "user", limit_tokens=100_000)
    mid = NOW.replace(day=15)
    e, _ = loaded_enforcer(
        [daily, monthly, user],
        [
            verdict(daily, ["acme"], spent_nanos=USD, at=mid),
            verdict(monthly, ["acme"], spent_nanos=10 * USD, at=mid),
            verdict(user, ["acme", "bob"], spent_tokens=10, at=mid),
        ],
        clock=FakeClock(mid),
    )
    d = e.check(ctx(user_id="Bob"))
    assert d.decision == BUDGET_EXCEEDED and d.budget_id == "monthly"
    assert set(d.exceeded_budgets) == {"daily", "monthly"} and d.over_budget
    assert not d.job_over_budget


def test_job_ceiling_refuses_with_429() -> None:
    job = budget("job-cap", "session", window="total", limit_usd=5)
    e, _ = loaded_enforcer([job], [verdict(job, ["acme", "alice", "run-7"], spent_nanos=5 * USD)])
    d = e.check(ctx(user_id=" Alice ", session_id="run-7"))
    assert d.decision == JOB_BUDGET_EXCEEDED and d.status == 429 and d.job_over_budget
    assert d.body is not None and d.body["error"] == "job_budget_exceeded"
    assert e.check(ctx(user_id="alice", session_id="run-8")).allowed


def test_warn_budgets_pass_with_a_header() -> None:
    warn = budget("soft", action="warn", limit_usd=1, alert_at=(0.5,))
    e, _ = loaded_enforcer([warn], [verdict(warn, ["acme"], spent_nanos=2 * USD)])
    d = e.check(ctx())
    assert d.allowed and d.decision == ALLOWED and d.hold_id is None
    assert d.headers == (
        (
            "X-Spend-Budget",
            "soft; scope=org; used=200%; state=exceeded; reset=2026-12-01T00:00:00Z",
        ),
    )


def test_crossed_alert_threshold_passes_with_a_header() -> None:
    b = budget("org", limit_usd=10, alert_at=(0.5, 0.8))
    e, _ = loaded_enforcer([b], [verdict(b, ["acme"], spent_nanos=6 * USD)])
    d = e.check(ctx())
    assert d.allowed
    assert d.headers == (
        ("X-Spend-Budget", "org; scope=org; used=60%; state=alert; reset=2026-12-01T00:00:00Z"),
    )
    e2, _ = loaded_enforcer([b], [verdict(b, ["acme"], spent_nanos=4 * USD)])
    assert e2.check(ctx()).headers == ()


def test_request_count_budget() -> None:
    b = budget("rpm", limit_requests=3, window="day")
    e, _ = loaded_enforcer([b], [verdict(b, ["acme"], spent_requests=2)])
    first = e.check(ctx())
    assert first.allowed  # 2 spent + 1
    second = e.check(ctx())
    assert second.decision == IN_FLIGHT_BUDGET_EXCEEDED  # 2 spent + 1 held + 1
    e.release(first.hold_id)
    assert e.check(ctx()).allowed


# --- fail mode ------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["open", "closed"])
def test_fail_mode_after_staleness(mode: str) -> None:
    enforce = budget("acme", limit_usd=100, match={"org_id": ["acme"]})
    warn = budget("soft", action="warn", limit_usd=1, match={"org_id": ["warned"]})
    e, clock = loaded_enforcer(
        [enforce, warn], [verdict(enforce, ["acme"], spent_nanos=USD)], fail_mode=mode, grace_s=900
    )
    clock.advance(900)
    assert e.check(ctx()).decision == ALLOWED and not e.stale  # exactly at grace: still fresh
    clock.advance(1)
    assert e.stale
    d = e.check(ctx())
    assert d.reason == "stale" and d.hold_id is None
    if mode == "open":
        assert d.allowed and d.decision == FAILED_OPEN and d.outcome == "failed_open"
        assert d.usage_fields()["outcome"] == "failed_open"
    else:
        assert not d.allowed and d.decision == FAILED_CLOSED and d.status == 503
        assert d.retry_after == 30 and ("Retry-After", "30") in d.headers
        event = d.refusal_event()
        assert event is not None and event["outcome"] == "failed_closed"
        assert event["status_code"] == 503
    assert e.metrics.decisions[d.decision] == 1
    # a request only warn budgets apply to is never blocked
    other = e.check(ctx(org_id="warned"))
    assert other.allowed and other.decision == ALLOWED


@pytest.mark.parametrize("mode", ["open", "closed"])
def test_fail_mode_before_ready(mode: str) -> None:
    e, _ = loaded_enforcer([ORG], fail_mode=mode)
    e.state.ready = False
    d = e.check(ctx(org_id="no-budget-known-yet"))
    assert d.reason == "not_ready"
    assert d.decision == (FAILED_OPEN if mode == "open" else FAILED_CLOSED)


# --- decisions are usage too, policy hook ----------------------------------------------------
def test_refusal_event_is_a_valid_zero_token_usage_event() -> None:
    e, _ = loaded_enforcer([ORG], [verdict(ORG, ["acme"], spent_nanos=100 * USD)])
    d = e.check(ctx(user_id="bob", groups=["eng"], tags={"team": "x"}, api="messages"))
    event = d.refusal_event(gateway_id="gw-1")
    assert event is not None
    validate_usage_event(event)
    assert event["outcome"] == "refused" and event["decision"] == BUDGET_EXCEEDED
    assert event["decision_budget_id"] == "org-monthly" and event["status_code"] == 402
    assert event["input_tokens"] == event["output_tokens"] == 0
    assert (
        event["user_id"] == "bob" and event["groups"] == ["eng"] and event["gateway_id"] == "gw-1"
    )
    assert e.check(ctx(org_id="other")).refusal_event() is None


def test_peek_holds_nothing_and_counts_as_no_request() -> None:
    b = budget("rpm", limit_requests=1, window="day")
    e, _ = loaded_enforcer([b], [verdict(b, ["acme"])])
    for _ in range(5):
        d = e.peek(ctx())
        assert d.allowed and d.hold_id is None and not d.over_budget
        assert d.remaining() == {
            d.counters[0].counter: {"nanos": None, "tokens": None, "requests": 1}
        }
    assert len(e.holds) == 0 and sum(e.metrics.decisions.values()) == 0
    assert e.metrics.peeks[ALLOWED] == 5
    assert e.check(ctx()).allowed and not e.check(ctx()).allowed


def test_usage_reports_spend_holds_and_limits() -> None:
    e, _ = loaded_enforcer([ORG], [verdict(ORG, ["acme"], spent_nanos=USD, spent_tokens=7)])
    held = e.check(ctx())
    [row] = e.usage(ctx())
    assert row.spent_nanos == USD and row.held_nanos == held.counters[0].held_nanos + 18_000_000
    out = row.to_json()
    assert out["limit_nanos"] == 100 * USD and out["spent_tokens"] == 7
    assert out["remaining"]["nanos"] == 100 * USD - USD - 18_000_000


# --- hostile contexts -------------------------------------------------------------------------
def test_separators_inside_ids_cannot_reach_another_counter() -> None:
    per_user = budget("per-user", "user", limit_usd=1)
    victim = verdict(per_user, ["a", "b"], spent_nanos=USD)  # org "a", user "b": exhausted
    e, _ = loaded_enforcer([per_user], [victim])
    assert e.check(ctx(org_id="a", user_id="b")).decision == BUDGET_EXCEEDED
    for org, user in [("a,1:b", ""), ("a", "b,"), ("a|b", "c"), ("1:a,", "b"), ("a", "1:b,")]:
        d = e.check(ctx(org_id=org, user_id=user or None))
        assert d.allowed, (org, user)
        assert all(c.counter != victim["counter_key"] for c in d.counters)


def test_empty_and_blank_ids() -> None:
    with pytest.raises(InvalidContext, match="org_id"):
        ctx(org_id="")
    with pytest.raises(InvalidContext, match="secret_id"):
        ctx(secret_id="   ")
    per_user = budget("per-user", "user", limit_usd=1)
    e, _ = loaded_enforcer([per_user], [verdict(per_user, ["acme", "bob"], spent_nanos=USD)])
    assert e.check(ctx(user_id="")).counters == ()  # no user: the user budget does not apply


def test_huge_values_are_refused_not_truncated() -> None:
    for fields in (
        {"org_id": "x" * 513},
        {"user_id": "u" * 10_000},
        {"groups": ["g"] * 257},
        {"tags": {f"k{i}": "v" for i in range(65)}},
        {"tags": {"team": "t" * 513}},
        {"max_output_tokens": 10**12},
        {"input_tokens": -1},
        {"input_tokens": True},
        {"user_id": 42},
        {"groups": "eng"},
    ):
        with pytest.raises(InvalidContext):
            ctx(**fields)
    assert ctx(org_id="x" * 512).org_id == "x" * 512


def test_each_invalid_field_names_itself_and_why() -> None:
    """The constructor's inlined checks say what the plain rules say, in their order
    (type and blankness before length)."""
    required = "required, a non-empty string"
    longer = "longer than 512 characters"
    tokens = f"an integer in 0..{MAX_TOKENS_PER_EVENT} or null"
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"org_id": ""}, "org_id", required),
        ({"org_id": " \t "}, "org_id", required),
        ({"org_id": 7}, "org_id", required),
        ({"org_id": None}, "org_id", required),
        ({"org_id": "x" * 513}, "org_id", longer),
        ({"org_id": " " * 600}, "org_id", required),
        ({"secret_id": ""}, "secret_id", required),
        ({"secret_id": "  "}, "secret_id", required),
        ({"secret_id": b"sk"}, "secret_id", required),
        ({"secret_id": "s" * 513}, "secret_id", longer),
        ({"secret_id": " " * 513}, "secret_id", required),
        ({"user_id": "u" * 513}, "user_id", longer),
        ({"user_id": 42}, "user_id", "must be a string or null"),
        ({"input_tokens": -1}, "input_tokens", tokens),
        ({"input_tokens": True}, "input_tokens", tokens),
        ({"input_tokens": 1.0}, "input_tokens", tokens),
        ({"max_output_tokens": MAX_TOKENS_PER_EVENT + 1}, "max_output_tokens", tokens),
        ({"request_bytes": -1}, "request_bytes", "an integer in 0..1099511627776 or null"),
        ({"groups": ["a", 1]}, "groups", "each group a string of <= 512"),
        ({"groups": "eng"}, "groups", "must be a list of strings"),
    ]
    for fields, field, detail in cases:
        with pytest.raises(InvalidContext) as raised:
            ctx(**fields)
        assert (raised.value.field, raised.value.detail) == (field, detail), fields
    # at the bounds: accepted, and canonical as schemas.ids says
    c = ctx(org_id=" Org ", secret_id=" Sk ", user_id=" Ann@X ", groups=[" Eng "])
    assert c.canon["org_id"] == (canonical_id(" Org ", "org_id"),)
    assert c.canon["secret_id"] == (canonical_id(" Sk ", "secret_id"),)
    assert c.canon["user_id"] == (canonical_id(" Ann@X ", "user_id"),) == ("ann@x",)
    assert c.canon["group"] == (canonical_id(" Eng "),)
    assert ctx(groups=["  "]).canon["group"] == ()
    assert ctx(input_tokens=MAX_TOKENS_PER_EVENT, max_output_tokens=0).input_tokens


def test_context_from_mapping_refuses_unknown_fields() -> None:
    with pytest.raises(InvalidContext, match="org"):
        Context.from_mapping({"org": "acme", "secret_id": "s"})
    with pytest.raises(InvalidContext, match="org_id"):
        Context.from_mapping({"secret_id": "s"})
    with pytest.raises(InvalidContext):
        Context.from_mapping(["org_id"])


# --- the fast path is the contract's applicable() ------------------------------------------------
_ids = st.one_of(
    st.none(),
    st.sampled_from(["", " ", "a", "A", " a ", "b", "a,b", "1:a,", "x|y", "é"]),
)
_budgets = st.lists(
    st.builds(
        lambda i, scope, match_attr, match_values: budget(
            f"b{i}",
            scope,
            limit_usd=1,
            match={match_attr: match_values} if match_attr else None,
        ),
        st.integers(0, 5),
        st.sampled_from(
            ["org", "secret", "project", "grant", "group", "user", "session", "tag:team"]
        ),
        st.sampled_from([None, "org_id", "user_id", "group", "tag:team", "model", "provider"]),
        st.lists(st.sampled_from(["a", "b", "acme", "x|y", "m"]), min_size=1, max_size=3),
    ),
    max_size=6,
    unique_by=lambda b: b.budget_id,
)


@settings(max_examples=200, deadline=None)
@given(
    budgets=_budgets,
    org=st.sampled_from(["a", "acme", " acme ", "x|y"]),
    user=_ids,
    project=_ids,
    session=_ids,
    groups=st.lists(st.sampled_from(["a", "b", " a", "", "x|y"]), max_size=4),
    team=_ids,
    model=st.sampled_from(["m", "m2", None]),
)
def test_fast_path_equals_applicable(
    budgets: list[Any],
    org: str,
    user: str | None,
    project: str | None,
    session: str | None,
    groups: list[str],
    team: str | None,
    model: str | None,
) -> None:
    c = Context(
        org_id=org,
        secret_id="s",
        user_id=user,
        project_id=project,
        session_id=session,
        groups=groups,
        tags={} if team is None else {"team": team},
        model=model,
    )
    expected = sorted((b.budget_id, key) for b, key, _ in applicable(budgets, c))
    index = Index({b.budget_id: b for b in budgets})
    got = sorted((plan.budget_id, key) for plan, key, _ in index.applicable(c))
    assert got == expected
    for _, key, values in index.applicable(c):
        assert key.endswith("".join(f"{len(v)}:{v}," for v in values))
    # check() inlines org and one-value scopes: its counters are the contract's too
    e, _ = loaded_enforcer(budgets)
    seen = sorted((row.budget_id, row.counter) for row in e.peek(c).counters)
    assert seen == expected


def test_budgets_pinned_to_an_org_only_apply_to_it() -> None:
    pinned = budget("acme-only", match={"org_id": ["acme"]}, limit_usd=1)
    e, _ = loaded_enforcer([pinned], [verdict(pinned, ["acme"], spent_nanos=USD)])
    assert e.check(ctx()).decision == BUDGET_EXCEEDED
    assert e.check(ctx(org_id="globex")).counters == ()


def test_policy_deletion_and_change_take_effect() -> None:
    e, _ = loaded_enforcer([ORG], [verdict(ORG, ["acme"], spent_nanos=100 * USD)])
    assert not e.check(ctx()).allowed
    raised = budget("org-monthly", limit_usd=200)
    e.state.apply_policy("org-monthly", policy_record(raised))
    assert e.check(ctx()).allowed  # limits are the policy's, spend is the verdict's
    e.state.apply_policy("org-monthly", None)
    assert e.check(ctx()).counters == ()


def test_counter_key_is_the_contract_key() -> None:
    e, _ = loaded_enforcer([budget("per-user", "user", limit_usd=1)])
    [c] = e.check(ctx(user_id=" Bob@Example.COM ")).counters
    assert c.counter == counter_key("per-user", ["acme", "bob@example.com"])


def test_clock_is_injectable() -> None:
    clock = FakeClock(NOW + timedelta(days=40))
    e, _ = loaded_enforcer([ORG], clock=clock)
    assert e.check(ctx()).counters[0].period == "m:2027-01"
