"""schemas.ids: the canonical form of an event's scope ids, checked and made.

``ids_are_canonical`` spells canonical_id out for speed (the counting stage asks it of
every event); these properties hold it equal to the definition.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.ids import (
    SCOPE_ID_FIELDS,
    CanonicalIds,
    canonical_id,
    ids_are_canonical,
    with_canonical_ids,
)

#: ids as clients send them: blanks around, mixed case, unicode spaces, empty
_id = st.text(
    st.sampled_from(["a", "B", "é", "É", "ß", "İ", " ", "\t", "\u00a0", "\u2003", "-", "@", "1"]),
    max_size=6,
)


@st.composite
def events(draw: st.DrawFn) -> dict[str, Any]:
    event: dict[str, Any] = {}
    for name, optional in SCOPE_ID_FIELDS:
        event[name] = draw(st.none() | _id) if optional else draw(_id)
    event["groups"] = draw(st.lists(_id, max_size=3))
    event["input_tokens"] = 1  # any other field is left as it is
    return event


@settings(max_examples=2_000, deadline=None)
@given(events())
def test_an_event_is_canonical_exactly_when_making_it_canonical_changes_nothing(
    event: dict[str, Any],
) -> None:
    made = with_canonical_ids(event)
    # a required id must be there at all (validation refuses an empty one anyway)
    required = all(event[name] for name, optional in SCOPE_ID_FIELDS if not optional)
    assert ids_are_canonical(event) == (made == event and required)


@settings(max_examples=2_000, deadline=None)
@given(events())
def test_making_ids_canonical_is_the_counters_canonical_id_and_idempotent(
    event: dict[str, Any],
) -> None:
    made = with_canonical_ids(event)
    for name, optional in SCOPE_ID_FIELDS:
        if event[name] is None:
            assert made[name] is None
        elif optional:
            assert made[name] == (canonical_id(event[name], name) or None)
        else:
            assert made[name] == canonical_id(event[name], name)
    assert made["groups"] == [canonical_id(g) for g in event["groups"]]
    assert with_canonical_ids(made) == made
    assert made["input_tokens"] == 1 and event is not made
    if all(made[n] for n, optional in SCOPE_ID_FIELDS if not optional):
        assert ids_are_canonical(made)


@settings(max_examples=300, deadline=None)
@given(st.lists(events(), min_size=1, max_size=30), st.integers(1, 4))
def test_remembered_ids_answer_as_the_test_does_event_after_event(
    stream: list[dict[str, Any]], limit: int
) -> None:
    # a small limit clears the memory mid-stream; ids recur across events and fields
    memo = CanonicalIds(limit=limit)
    for event in stream + stream:
        assert memo.event_is_canonical(event) == ids_are_canonical(event)
