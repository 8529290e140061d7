"""Canonical ids and counter keys.

A counter key is a length-prefixed composition of the budget id and the
scope values (the period is not part of it: one counter lives on across
periods, and its compacted verdict always shows the newest one); every part is written as ``<len>:<text>,`` where len
counts code points, so ``("a|b", "c")`` and ``("a", "b|c")`` can never
collide, whatever characters an id contains.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from schemas.errors import ContractError

MAX_ID_LENGTH: Final = 512
#: scope attributes whose values are case-insensitive identities (e-mail-like)
CASE_INSENSITIVE_ATTRIBUTES: Final = frozenset({"user_id"})


def canonical_id(value: str, attribute: str = "") -> str:
    """Surrounding blanks removed; user ids lower-cased."""
    value = value.strip()
    if attribute in CASE_INSENSITIVE_ATTRIBUTES:
        value = value.lower()
    return value


#: the UsageEvent scope ids kept canonical in the counters and in ClickHouse's usage_events,
#: with whether each is optional (an optional id empty once canonical counts as absent)
SCOPE_ID_FIELDS: Final = (
    ("secret_id", False),
    ("org_id", False),
    ("project_id", True),
    ("grant_id", True),
    ("permission_id", True),
    ("user_id", True),
    ("session_id", True),
)


def ids_are_canonical(event: Mapping[str, Any]) -> bool:
    """Is every scope id of ``event`` (and each group) already in its canonical form, an
    optional one absent or non-empty? Then storing the event as sent stores canonical ids."""
    # canonical_id spelled out (strip; lower for case-insensitive ids): the counting stage
    # asks this of every event, and a call per id costs more than the test
    # (tests/schemas/test_ids_canonical.py holds the two equal)
    for name, optional in SCOPE_ID_FIELDS:
        value = event[name]
        if value is None:
            if optional:
                continue
            return False
        if not value or value != value.strip():
            return False
        if name in CASE_INSENSITIVE_ATTRIBUTES and value != value.lower():
            return False
    return all(group == group.strip() for group in event["groups"])


#: (field, optional, case-insensitive) for each of SCOPE_ID_FIELDS
_SCOPE_ID_CHECKS: Final = tuple(
    (name, optional, name in CASE_INSENSITIVE_ATTRIBUTES) for name, optional in SCOPE_ID_FIELDS
)


class CanonicalIds:
    """``ids_are_canonical`` remembered per id: the ids of a stream repeat (one org, a few
    secrets and users), so each distinct one is tested once, and after that a set lookup
    answers, where the test builds a stripped and a lower-cased copy every time."""

    def __init__(self, limit: int = 100_000) -> None:
        self.limit = limit
        #: ids known canonical as a case-sensitive id, and as a case-insensitive one
        self._exact: set[str] = set()
        self._folded: set[str] = set()

    def event_is_canonical(self, event: Mapping[str, Any]) -> bool:
        """``ids_are_canonical(event)``."""
        exact = self._exact
        folded = self._folded
        for name, optional, insensitive in _SCOPE_ID_CHECKS:
            value = event[name]
            if value is None:
                if optional:
                    continue
                return False
            known = folded if insensitive else exact
            if value in known:
                continue
            if not value or value != value.strip():
                return False
            if insensitive and value != value.lower():
                return False
            if len(known) >= self.limit:
                known.clear()
            known.add(value)
        return all(group == group.strip() for group in event["groups"])


def with_canonical_ids(event: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``event`` whose scope ids and groups are canonical, an optional id that is
    empty once canonical absent (None): the event as the counters and usage_events see it."""
    out = dict(event)
    for name, optional in SCOPE_ID_FIELDS:
        value = event[name]
        if value is not None:
            value = canonical_id(value, name)
            out[name] = (value or None) if optional else value
    out["groups"] = [canonical_id(group) for group in event["groups"]]
    return out


def compose(parts: Iterable[str]) -> str:
    """Length-prefixed, unambiguous concatenation of ``parts``."""
    return "".join(f"{len(part)}:{part}," for part in parts)


def decompose(key: str) -> list[str]:
    """Inverse of :func:`compose`; raises ContractError on a malformed key."""
    parts: list[str] = []
    pos = 0
    while pos < len(key):
        colon = key.find(":", pos)
        if colon < 0 or not key[pos:colon].isdigit():
            raise ContractError(f"malformed composed key at position {pos}: {key!r}")
        length = int(key[pos:colon])
        end = colon + 1 + length
        if end >= len(key) + 1 or key[end : end + 1] != ",":
            raise ContractError(f"malformed composed key at position {pos}: {key!r}")
        parts.append(key[colon + 1 : end])
        pos = end + 1
    return parts


def counter_key(budget_id: str, scope_values: Iterable[str]) -> str:
    """The key of one counter: the budget, then its scope values in scope order."""
    return compose([budget_id, *scope_values])


def period_state_key(counter: str, period: str) -> str:
    """The key of one counter's totals within one period (late events land in their own period)."""
    return compose([counter, period])


def check_id(value: str, field: str) -> None:
    if len(value) > MAX_ID_LENGTH:
        raise ContractError(f"{field}: longer than {MAX_ID_LENGTH} characters")
