"""Temporary raises (issue 23): by/to over the base limits, which raise a counter has at
an instant (its own over the budget's, the newest first, revoked and expired ones not),
the record on budget.raises, and --scope naming a counter as usage shows it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from schemas.codec import BUDGET_RAISE
from schemas.errors import ContractError
from schemas.periods import to_micros
from schemas.raises import BudgetRaise, RaiseBook, scope_values_of

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
HOUR = 3_600_000_000


def granted(
    raise_id: str,
    scope_values: tuple[str, ...] = (),
    *,
    mode: str = "by",
    nanos: int | None = 100,
    tokens: int | None = None,
    start: int = 0,
    hours: int = 2,
    revoked_after: int | None = None,
) -> BudgetRaise:
    starts = to_micros(T0) + start * HOUR
    return BudgetRaise(
        raise_id=raise_id,
        budget_id="acme-monthly",
        scope_values=scope_values,
        mode=mode,
        raise_nanos=nanos,
        raise_tokens=tokens,
        raise_requests=None,
        starts_at_us=starts,
        until_us=starts + hours * HOUR,
        reason="launch",
        revoked_at_us=None if revoked_after is None else starts + revoked_after * HOUR,
    )


def test_by_adds_to_the_base_and_to_replaces_it_only_where_the_budget_has_a_limit() -> None:
    assert granted("a", nanos=100, tokens=50).limits(1_000, 2_000, 30) == (1_100, 2_050, 30)
    assert granted("b", mode="to", nanos=5_000).limits(1_000, None, 30) == (5_000, None, 30)
    assert granted("c", tokens=7).limits(None, None, None) == (None, None, None)


def test_the_counters_own_raise_wins_then_the_newest_and_ended_ones_never() -> None:
    book = RaiseBook()
    for r in (
        granted("wide-old", start=0, hours=4),
        granted("wide-new", start=1, hours=4),
        granted("mine", ("acme",), start=2, hours=1),
        granted("revoked", ("beta",), start=0, hours=9, revoked_after=1),
    ):
        book.apply(r.raise_id, BUDGET_RAISE.decode(BUDGET_RAISE.encode(r.to_record())))
    at = to_micros(T0)

    def winner(values: tuple[str, ...], hours: float) -> str | None:
        found = book.active("acme-monthly", values, at + int(hours * HOUR))
        return None if found is None else found.raise_id

    assert winner(("acme",), 0.5) == "wide-old"
    assert winner(("acme",), 1.5) == "wide-new"
    assert winner(("acme",), 2.5) == "mine"
    assert winner(("acme",), 3.0) == "wide-new"  # its own ended at 3 h: the budget's again
    assert winner(("beta",), 0.5) == "revoked"
    assert winner(("beta",), 1.0) == "wide-new"  # revoked at 1 h
    assert winner(("acme",), 5.0) is None  # every raise over
    assert book.active("other", ("acme",), at) is None
    # a revocation replaces the record under its id
    revoked = granted("mine", ("acme",), start=2, hours=1, revoked_after=0)
    book.apply("mine", revoked.to_record())
    assert winner(("acme",), 2.5) == "wide-new"
    book.apply("wide-new", None)
    book.apply("wide-old", None)
    book.apply("revoked", None)
    book.apply("mine", None)
    assert book.by_budget == {} and book.by_id == {}


def test_the_record_round_trips_and_shows_when_it_ends() -> None:
    r = granted("r-1", ("acme", "sk-1"), tokens=10, revoked_after=1)
    assert BudgetRaise.from_record(BUDGET_RAISE.decode(BUDGET_RAISE.encode(r.to_record()))) == r
    assert r.to_json()["until"] == (T0 + timedelta(hours=1)).isoformat().replace("+00:00", "Z")


def test_scope_names_a_counter_as_usage_shows_it() -> None:
    assert scope_values_of("org", " acme ") == ("acme",)
    assert scope_values_of("secret", "acme/sk-1") == ("acme", "sk-1")
    assert scope_values_of("tag:team", "acme/search") == ("acme", "search")
    with pytest.raises(ContractError, match="named ORG/SECRET_ID"):
        scope_values_of("secret", "acme")
    with pytest.raises(ContractError, match="named ORG "):
        scope_values_of("org", "acme/sk-1")
