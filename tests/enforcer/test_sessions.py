"""The bound on new session ids per key (issue 21): a client that sends a new
``X-Spend-Session`` per request made a new counter (and a verdict every enforcer holds)
per request, and each one had a whole session budget of its own. Past
``max_sessions_per_key`` new ids in a UTC day, a request with another new id is refused
(429 ``job_budget_exceeded``, reason ``too_many_sessions``) and its refusal event carries
no session id, so it makes no counter either."""

from __future__ import annotations

from tests.enforcer.kit import budget, ctx, loaded_enforcer, verdict

#: the per-job ceiling: 2 requests per session
PER_JOB = budget("per-job", "session", window="total", limit_requests=2)
BOUND = 3


def test_new_session_ids_past_the_bound_are_refused_with_a_clear_reason() -> None:
    e, clock = loaded_enforcer([PER_JOB], max_sessions_per_key=BOUND)
    for i in range(BOUND):
        assert e.check(ctx(session_id=f"job-{i}")).allowed
    d = e.check(ctx(session_id="job-new"))
    assert not d.allowed and d.hold_id is None
    assert d.status == 429 and d.decision == "job_budget_exceeded"
    assert d.body is not None and d.body["reason"] == "too_many_sessions"
    assert d.body["session_id"] == "job-new" and d.body["max_sessions_per_key"] == BOUND
    assert "max_sessions_per_key" in d.body["message"] and "'sk-1'" in d.body["message"]
    # retrying cannot help before the UTC day ends (the test clock is at 12:00 UTC)
    assert ("Retry-After", "43200") in d.headers and ("x-should-retry", "false") in d.headers
    assert d.counters[0].state == "too_many_sessions"
    # its refusal event names no session: it would make the very counter refused
    event = d.refusal_event()
    assert event is not None and event["session_id"] is None and event["outcome"] == "refused"
    assert event["decision_budget_id"] == "per-job"
    assert b'budget="per-job",outcome="too_many_sessions"} 1.0' in e.metrics.render()
    # the sessions the key opened go on, up to their own ceiling; other keys have their own
    assert e.check(ctx(session_id="job-0")).allowed
    assert not e.check(ctx(session_id="job-0")).allowed  # its 2 requests (holds) are used
    assert e.check(ctx(session_id="job-new", secret_id="sk-2")).allowed
    # a session a verdict knows (another replica counted it) is no new id
    known = verdict(PER_JOB, ["acme", "sk-1", "elsewhere"])
    e.state.apply_verdict(known["counter_key"], known)
    assert e.check(ctx(session_id="elsewhere")).allowed
    # a new UTC day: new ids again
    clock.advance(12 * 3600 + 1)
    e.state.fresh_at_us = int(clock() * 1_000_000)
    assert e.check(ctx(session_id="job-new")).allowed


def test_minting_session_ids_cannot_escape_the_session_budget() -> None:
    """Each admitted request counts in its own session's counter (never split): a client
    minting an id per request gets at most the bound's sessions, each within its ceiling."""
    e, _ = loaded_enforcer([PER_JOB], max_sessions_per_key=BOUND)
    allowed = [e.check(ctx(session_id=f"mint-{i}")).allowed for i in range(50)]
    assert sum(allowed) == BOUND
    assert len(e.holds) == BOUND
    # unbounded (None), every new id had a budget of its own: the escape
    e, _ = loaded_enforcer([PER_JOB], max_sessions_per_key=None)
    assert all(e.check(ctx(session_id=f"mint-{i}")).allowed for i in range(50))


def test_a_peek_asks_without_counting_and_warn_budgets_never_refuse() -> None:
    e, _ = loaded_enforcer([PER_JOB], max_sessions_per_key=1)
    assert e.peek(ctx(session_id="a")).allowed
    assert e.peek(ctx(session_id="b")).allowed  # the peek of a took no place
    assert e.check(ctx(session_id="b")).allowed
    assert not e.peek(ctx(session_id="c")).allowed
    warn = budget("per-job-warn", "session", window="total", limit_requests=2, action="warn")
    e, _ = loaded_enforcer([warn], max_sessions_per_key=1)
    assert all(e.check(ctx(session_id=f"w-{i}")).allowed for i in range(5))
    # no session budget: session ids make no counter, nothing is bounded
    e, _ = loaded_enforcer([budget("org", limit_requests=100)], max_sessions_per_key=1)
    assert all(e.check(ctx(session_id=f"o-{i}")).allowed for i in range(5))
