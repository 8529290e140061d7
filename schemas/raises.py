"""Temporary raises of a budget's limits (``spendbus budgets raise``), the one place
their effect is computed.

A raise names a budget and either one counter of it (its scope values, org first) or
every counter (no scope values), and lifts the budget's limits from ``starts_at`` until
``until`` (or ``revoked_at``, if earlier): ``by`` adds to the base limit, ``to`` replaces
it. It only changes limits the budget has. While several are active for a counter, the
counter's own raise wins over a budget-wide one, and the newest over older ones.

Records live on the compacted topic ``budget.raises`` under their ``raise_id``: a
revocation rewrites the record with ``revoked_at``, so every raise ever made stays on
the topic (the audit trail).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from schemas.budgets import Budget
from schemas.errors import ConfigError, ContractError
from schemas.ids import canonical_id
from schemas.money import usd_to_nanos
from schemas.periods import from_micros, to_micros

MODES: Final = ("by", "to")


@dataclass(frozen=True, slots=True)
class BudgetRaise:
    raise_id: str
    budget_id: str
    #: the counter raised (org first); () raises every counter of the budget
    scope_values: tuple[str, ...]
    mode: str
    raise_nanos: int | None
    raise_tokens: int | None
    raise_requests: int | None
    starts_at_us: int
    until_us: int
    reason: str
    created_by: str = ""
    revoked_at_us: int | None = None

    @property
    def ends_at_us(self) -> int:
        """When the raise stops applying: ``until``, or its revocation if earlier."""
        if self.revoked_at_us is not None and self.revoked_at_us < self.until_us:
            return self.revoked_at_us
        return self.until_us

    def active(self, at_us: int) -> bool:
        return self.starts_at_us <= at_us < self.ends_at_us

    def limits(
        self, nanos: int | None, tokens: int | None, requests: int | None
    ) -> tuple[int | None, int | None, int | None]:
        """The effective (nanos, tokens, requests) limits over the base ones."""
        return (
            self._limit(nanos, self.raise_nanos),
            self._limit(tokens, self.raise_tokens),
            self._limit(requests, self.raise_requests),
        )

    def _limit(self, base: int | None, amount: int | None) -> int | None:
        if base is None or amount is None:
            return base
        return base + amount if self.mode == "by" else amount

    def to_record(self) -> dict[str, Any]:
        return {
            "raise_id": self.raise_id,
            "budget_id": self.budget_id,
            "scope_values": list(self.scope_values),
            "mode": self.mode,
            "raise_nanos": self.raise_nanos,
            "raise_tokens": self.raise_tokens,
            "raise_requests": self.raise_requests,
            "starts_at": from_micros(self.starts_at_us),
            "until": from_micros(self.until_us),
            "reason": self.reason,
            "created_by": self.created_by,
            "revoked_at": None if self.revoked_at_us is None else from_micros(self.revoked_at_us),
        }

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> BudgetRaise:
        revoked: datetime | None = record["revoked_at"]
        return cls(
            raise_id=record["raise_id"],
            budget_id=record["budget_id"],
            scope_values=tuple(record["scope_values"]),
            mode=record["mode"],
            raise_nanos=record["raise_nanos"],
            raise_tokens=record["raise_tokens"],
            raise_requests=record["raise_requests"],
            starts_at_us=to_micros(record["starts_at"]),
            until_us=to_micros(record["until"]),
            reason=record["reason"],
            created_by=record["created_by"],
            revoked_at_us=None if revoked is None else to_micros(revoked),
        )

    def to_json(self) -> dict[str, Any]:
        """What ``usage``, ``/v1/spend`` and refusals show of the raise."""
        return {
            "raise_id": self.raise_id,
            "mode": self.mode,
            "raise_nanos": self.raise_nanos,
            "raise_tokens": self.raise_tokens,
            "raise_requests": self.raise_requests,
            "until": from_micros(self.ends_at_us).isoformat().replace("+00:00", "Z"),
            "reason": self.reason,
        }


class RaiseBook:
    """Every raise, by budget: what enforcers look up per counter (``active``)."""

    __slots__ = ("by_budget", "by_id")

    def __init__(self) -> None:
        self.by_id: dict[str, BudgetRaise] = {}
        #: budget id -> its raises, newest first (the lookup's order)
        self.by_budget: dict[str, list[BudgetRaise]] = {}

    def apply(self, raise_id: str, record: Mapping[str, Any] | None) -> None:
        """Add or replace (a revocation) one raise; None removes it."""
        old = self.by_id.pop(raise_id, None)
        if old is not None:
            kept = [r for r in self.by_budget[old.budget_id] if r.raise_id != raise_id]
            if kept:
                self.by_budget[old.budget_id] = kept
            else:
                del self.by_budget[old.budget_id]
        if record is None:
            return
        new = BudgetRaise.from_record(record)
        self.by_id[raise_id] = new
        raises = self.by_budget.setdefault(new.budget_id, [])
        raises.append(new)
        raises.sort(key=lambda r: (r.starts_at_us, r.raise_id), reverse=True)

    def active(
        self, budget_id: str, scope_values: tuple[str, ...], at_us: int
    ) -> BudgetRaise | None:
        """The raise that applies to the counter at ``at_us``, if any."""
        raises = self.by_budget.get(budget_id)
        if not raises:
            return None
        wide: BudgetRaise | None = None
        for r in raises:
            if not r.active(at_us):
                continue
            if r.scope_values == scope_values:
                return r
            if not r.scope_values and wide is None:
                wide = r
        return wide


def raised_budget(budget: Budget, granted: BudgetRaise) -> Budget:
    """``budget`` with the limits ``granted`` gives it (what the aggregator counts against)."""
    nanos, tokens, requests = granted.limits(
        budget.limit_nanos, budget.limit_tokens, budget.limit_requests
    )
    return replace(budget, limit_nanos=nanos, limit_tokens=tokens, limit_requests=requests)


#: the attribute of each scope value after the org (canonical ids: schemas/ids.py)
_SCOPE_PARTS: Final = {
    "org": (),
    "session": ("user_id", "session_id"),
    "secret": ("secret_id",),
    "project": ("project_id",),
    "grant": ("grant_id",),
    "user": ("user_id",),
    "group": ("group",),
}


def scope_values_of(scope: str, text: str) -> tuple[str, ...]:
    """The scope values ``text`` names for a budget of ``scope``: its parts joined by ``/``
    as ``spendbus usage`` shows them (``acme``, ``acme/sk-1``), each made canonical."""
    parts = [p.strip() for p in text.split("/")]
    rest = _SCOPE_PARTS.get(scope, (scope,))  # tag:<name>: its value
    if len(parts) != 1 + len(rest) or not all(parts):
        example = "/".join(["ORG", *(a.upper() for a in rest)])
        raise ContractError(
            f"scope {text!r}: a counter of a {scope} budget is named {example} "
            "(as spendbus usage shows it)"
        )
    return tuple(
        canonical_id(value, attribute)
        for value, attribute in zip(parts, ("org_id", *rest), strict=True)
    )


def raise_until(text: str, now: datetime) -> datetime:
    """When a raise ends: an ISO 8601 time with its zone (``2026-12-31T18:00:00Z``) or a
    duration from now (``90s``, ``30m``, ``6h``, ``2d``)."""
    text = text.strip()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
    if text[:-1].isdigit() and text[-1:] in units:
        return now + timedelta(seconds=int(text[:-1]) * units[text[-1]])
    try:
        until = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(
            f"until {text!r}: give a time with its zone (2026-12-31T18:00:00Z) or a "
            "duration from now (90s, 30m, 6h, 2d)"
        ) from None
    if until.tzinfo is None:
        raise ConfigError(f"until {text!r}: the time needs a zone (Z or +01:00)")
    return until.astimezone(UTC)


def grant_raise(
    budget: Budget,
    *,
    scope_text: str | None,
    by_usd: str | None,
    to_usd: str | None,
    tokens: int | None,
    requests: int | None,
    until_text: str,
    reason: str,
    created_by: str,
    now: datetime,
) -> BudgetRaise:
    """A new raise of ``budget`` (``spendbus budgets raise``, ``POST /v1/admin/raises``);
    ConfigError or ContractError naming what is wrong (the option's name without its
    dashes)."""
    if by_usd is not None and to_usd is not None:
        raise ConfigError("give by or to, not both")
    if by_usd is None and to_usd is None and tokens is None and requests is None:
        raise ConfigError("give by USD or to USD (and/or tokens, requests)")
    for name, count in (("tokens", tokens), ("requests", requests)):
        if count is not None and count < 1:
            raise ConfigError(f"{name}: must be >= 1")
    if not reason.strip():
        raise ConfigError("reason: say why the limit is raised")
    until = raise_until(until_text, now)
    if until <= now:
        raise ConfigError(f"until {until.isoformat()} has passed")
    usd = by_usd if by_usd is not None else to_usd
    nanos = None if usd is None else usd_to_nanos(usd)
    if nanos is not None and nanos <= 0:
        raise ConfigError("the USD amount must be > 0")
    for amount, limit, name in (
        (nanos, budget.limit_nanos, "a USD limit (limit_usd)"),
        (tokens, budget.limit_tokens, "limit_tokens"),
        (requests, budget.limit_requests, "limit_requests"),
    ):
        if amount is not None and limit is None:
            raise ConfigError(f"budget {budget.budget_id!r} has no {name} to raise")
    scope_values = () if scope_text is None else scope_values_of(budget.scope, scope_text)
    return BudgetRaise(
        raise_id=f"r-{uuid.uuid4().hex[:12]}",
        budget_id=budget.budget_id,
        scope_values=scope_values,
        mode="to" if to_usd is not None else "by",
        raise_nanos=nanos,
        raise_tokens=tokens,
        raise_requests=requests,
        starts_at_us=to_micros(now),
        until_us=to_micros(until),
        reason=reason.strip(),
        created_by=created_by,
    )
