"""check(ctx) → Decision: pure, in memory, no I/O.

The counters a request counts in are exactly those of
``schemas.budgets.applicable(budgets, ctx)`` (a property test holds the fast
path below to it); this module only precomputes, per policy version, what
``applicable`` would recompute on every call:

* budgets whose ``match`` pins ``org_id`` are indexed by org, so a check only
  looks at the budgets that can apply to its org;
* counters are looked up by id, ``(budget_id, *scope_values)`` (the decomposed
  counter key, with budget ids and orgs interned), so no key string is built
  or hashed per check; the string key is composed only for display;
* the current period of each budget is cached until the period ends, and
  worst-case estimates per (model, input, max output) until prices change.

Every applicable budget must pass. For one counter (spend = the verdict's, or
zero when the verdict is of another period; limits = the budget's):

=========  =========================================  ==============================
action     condition                                  outcome
=========  =========================================  ==============================
enforce    spent ≥ limit                              refused: budget.refusal
                                                      (budget_exceeded, or
                                                      job_budget_exceeded for session)
enforce    spent + R × estimate > limit               refused: budget.refusal, reason
                                                      request_too_large (this request's
                                                      worst case alone does not fit)
enforce    spent + R × (held + estimate) > limit      refused: in_flight_budget_exceeded
                                                      (holds are what keeps it out)
enforce    its ``rate:`` bucket cannot admit now      refused: throttled (checked last:
                                                      a budget refusal takes no rate)
enforce    spent ≥ an alert threshold × limit         allowed, X-Spend-Budget state=alert
warn       spent ≥ limit / ≥ an alert threshold      allowed, X-Spend-Budget state=exceeded|alert
=========  =========================================  ==============================

When the verdicts are not ready or stale beyond ``grace``, a request that an
enforce budget applies to is decided by ``fail_mode`` (failed_open /
failed_closed); warn budgets never block.

``held`` is this process's holds and R is ``EnforcerConfig.replicas``, the number
of enforcers admitting against the same budgets: each may commit at most 1/R of
what the verdict leaves (``limit − spent``), so together they stay within it.
R = 1 is one enforcer; the multiplier is precomputed, the hot path has no branch on it.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final, final

from enforcer import refusals
from enforcer.config import EnforcerConfig
from enforcer.errors import InvalidContext
from enforcer.holds import CounterHolds, CounterPeriod, Holds
from enforcer.metrics import EnforcerMetrics
from enforcer.state import CounterId, CounterVerdict, EnforcerState
from schemas.billed_units import MAX_UNITS_PER_EVENT, valid_unit_name
from schemas.budgets import UNPRICED_REFUSE, Budget
from schemas.ids import CASE_INSENSITIVE_ATTRIBUTES, MAX_ID_LENGTH, canonical_id, compose
from schemas.periods import from_micros, period_end, period_key
from schemas.raises import BudgetRaise
from schemas.usage import (
    ALLOWED,
    FAILED_CLOSED,
    FAILED_OPEN,
    IN_FLIGHT_BUDGET_EXCEEDED,
    MAX_TOKENS_PER_EVENT,
    PRICED_TOKEN_FIELDS,
    THROTTLED,
    billed_tokens,
    new_usage_event,
)

log = logging.getLogger("spendbus.enforcer.decisions")

#: a request's input is estimated at one token per this many bytes when no token
#: estimate is given (typical text runs ~4 bytes/token: 3 errs on the side of holding more)
BYTES_PER_TOKEN_ESTIMATE: Final = 3
MAX_GROUPS: Final = 256
MAX_TAGS: Final = 64
MAX_REQUEST_BYTES: Final = 1 << 40
#: distinct billed units a request may name in ``units``
MAX_UNIT_CAPS: Final = 32


_FIELDS: Final = (
    "org_id",
    "secret_id",
    "project_id",
    "grant_id",
    "permission_id",
    "user_id",
    "groups",
    "session_id",
    "tags",
    "provider",
    "api",
    "model",
    "input_tokens",
    "request_bytes",
    "max_output_tokens",
    "units",
)
_FIELD_NAMES: Final = frozenset(_FIELDS)


def _id(name: str, value: Any) -> tuple[str, ...]:
    """Validate one optional id/text field (not None); its canonical values.

    ``schemas.ids.canonical_id`` inlined (one call per field instead of three; the
    property test against ``applicable`` holds the two equal)."""
    if type(value) is not str:
        if value == "":
            return ()  # as schemas.budgets reads an absent attribute
        raise InvalidContext(name, "must be a string or null")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidContext(name, f"longer than {MAX_ID_LENGTH} characters")
    value = value.strip()
    if name in CASE_INSENSITIVE_ATTRIBUTES:
        value = value.lower()
    return (value,) if value else ()  # a blank id is no id: it names no counter


def _required(name: str, value: Any) -> None:
    if type(value) is not str or not value.strip():
        raise InvalidContext(name, "required, a non-empty string")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidContext(name, f"longer than {MAX_ID_LENGTH} characters")


def _present(value: str) -> tuple[str, ...]:
    """A blank id is no id (as schemas.budgets reads it): it names no counter."""
    return (value,) if value else ()


#: which of the always-present ids the contract lower-cases (schemas.ids.canonical_id)
_LOWER_ORG: Final = "org_id" in CASE_INSENSITIVE_ATTRIBUTES
_LOWER_SECRET: Final = "secret_id" in CASE_INSENSITIVE_ATTRIBUTES
_LOWER_GROUP: Final = "" in CASE_INSENSITIVE_ATTRIBUTES  # groups: canonical_id(g), no attribute


def _units(value: Any) -> dict[str, int]:
    """The request's unit caps: a map (or pairs) of unit name to a count."""
    pairs = value.items() if isinstance(value, Mapping) else value
    try:
        items = list(pairs)
    except TypeError:
        raise InvalidContext("units", "a map of unit name to count") from None
    if len(items) > MAX_UNIT_CAPS:
        raise InvalidContext("units", f"more than {MAX_UNIT_CAPS} units")
    out: dict[str, int] = {}
    for item in items:
        if not isinstance(item, tuple | list) or len(item) != 2:
            raise InvalidContext("units", "a map of unit name to count")
        name, count = item
        if not valid_unit_name(name):
            raise InvalidContext("units", f"{name!r} is not a unit name")
        if type(count) is not int or not 0 <= count <= MAX_UNITS_PER_EVENT:
            raise InvalidContext("units", f"{name}: an integer in 0..{MAX_UNITS_PER_EVENT}")
        if count:
            out[name] = count
    return out


def _count(name: str, value: Any, bound: int) -> None:
    if type(value) is not int or not 0 <= value <= bound:
        raise InvalidContext(name, f"an integer in 0..{bound} or null")


class Context:
    """The verified principal and the request, as the proxy knows them.

    Built once per request and validated here: ids longer than the contract
    allows (the usage event would be dead-lettered, so the request would never
    be charged), wrong types, blank required ids and oversized lists raise
    :class:`InvalidContext`. Values are kept as given; which counters they
    reach is decided by the contract's canonical ids (``schemas.ids``).
    Read-only by contract (a plain slotted class: built once per request, it
    must be cheap).
    """

    __slots__ = (*_FIELDS, "canon", "group", "org", "secret", "session", "user")

    org_id: str
    secret_id: str
    project_id: str | None
    grant_id: str | None
    permission_id: str | None
    user_id: str | None
    groups: tuple[str, ...]
    session_id: str | None
    tags: Mapping[str, str]
    provider: str | None
    api: str | None
    model: str | None
    #: estimated input tokens of the request (preferred over request_bytes)
    input_tokens: int | None
    #: size of the request body, used for the input estimate when input_tokens is absent
    request_bytes: int | None
    max_output_tokens: int | None
    #: billed units beyond tokens the request can be charged at most, known before it is
    #: sent (a server tool's max_uses...): the worst case adds their price; None for none
    units: dict[str, int] | None
    #: derived: canonical values per attribute (``tag:<name>`` included), the canonical org
    canon: dict[str, tuple[str, ...]]
    org: str
    #: derived: the canonical secret, user and session ("" for none) and groups, as check()
    #: reads them (typed attributes: no dict lookups, fewer cache lines per check)
    secret: str
    user: str
    session: str
    group: tuple[str, ...]

    def __init__(
        self,
        *,
        # Any: each value comes from a request and is validated below; compiled (mypyc),
        # a declared type would be enforced first, with a TypeError naming no field
        # (and True would pass as an int)
        org_id: Any,
        secret_id: Any,
        project_id: Any = None,
        grant_id: Any = None,
        permission_id: Any = None,
        user_id: Any = None,
        groups: Any = (),
        session_id: Any = None,
        tags: Any = None,
        provider: Any = None,
        api: Any = None,
        model: Any = None,
        input_tokens: Any = None,
        request_bytes: Any = None,
        max_output_tokens: Any = None,
        units: Any = None,
    ) -> None:
        # built once per request: one dict literal (sized once), no call for an absent
        # field, the contract's canonical_id inlined (the property test against
        # ``applicable`` holds the two equal)
        if type(org_id) is not str or len(org_id) > MAX_ID_LENGTH or not (org := org_id.strip()):
            _required("org_id", org_id)  # raises the precise error
            raise AssertionError  # unreachable: _required raised
        if type(secret_id) is not str or len(secret_id) > MAX_ID_LENGTH:
            _required("secret_id", secret_id)
        secret = secret_id.strip()
        if not secret:
            _required("secret_id", secret_id)
        if _LOWER_ORG:
            org = org.lower()
        if _LOWER_SECRET:
            secret = secret.lower()
        # the state holds orgs interned: lookups compare them by identity
        org = sys.intern(org)
        if type(groups) is not tuple:
            if type(groups) is not list:
                raise InvalidContext("groups", "must be a list of strings")
            groups = tuple(groups)
        group: tuple[str, ...] = ()
        if groups:
            if len(groups) > MAX_GROUPS:
                raise InvalidContext("groups", f"more than {MAX_GROUPS} groups")
            for g in groups:
                if type(g) is not str or len(g) > MAX_ID_LENGTH:
                    raise InvalidContext("groups", f"each group a string of <= {MAX_ID_LENGTH}")
            if len(groups) == 1:
                one = groups[0].strip().lower() if _LOWER_GROUP else groups[0].strip()
                if one:
                    group = (one,)
            else:  # each group once, in order
                group = tuple(dict.fromkeys(c for g in groups if (c := canonical_id(g))))
        users = () if user_id is None else _id("user_id", user_id)
        sessions = () if session_id is None else _id("session_id", session_id)
        canon: dict[str, tuple[str, ...]] = {
            "org_id": (org,),
            "secret_id": (secret,),
            "project_id": () if project_id is None else _id("project_id", project_id),
            "grant_id": () if grant_id is None else _id("grant_id", grant_id),
            "permission_id": () if permission_id is None else _id("permission_id", permission_id),
            "user_id": users,
            "session_id": sessions,
            "provider": () if provider is None else _id("provider", provider),
            "api": () if api is None else _id("api", api),
            "model": () if model is None else _id("model", model),
            "group": group,
        }
        if tags:
            if not isinstance(tags, Mapping):
                raise InvalidContext("tags", "must be a map of string to string")
            if len(tags) > MAX_TAGS:
                raise InvalidContext("tags", f"more than {MAX_TAGS} tags")
            tags = dict(tags)
            for k, v in tags.items():
                if type(k) is not str or type(v) is not str:
                    raise InvalidContext("tags", "must be a map of string to string")
                if len(k) > MAX_ID_LENGTH or len(v) > MAX_ID_LENGTH:
                    raise InvalidContext(
                        "tags", f"keys and values of <= {MAX_ID_LENGTH} characters"
                    )
                canon[f"tag:{k}"] = _present(canonical_id(v))
        elif tags is None or isinstance(tags, Mapping):
            tags = {}
        else:
            raise InvalidContext("tags", "must be a map of string to string")
        if input_tokens is not None and (
            type(input_tokens) is not int or not 0 <= input_tokens <= MAX_TOKENS_PER_EVENT
        ):
            _count("input_tokens", input_tokens, MAX_TOKENS_PER_EVENT)
        if request_bytes is not None:
            _count("request_bytes", request_bytes, MAX_REQUEST_BYTES)
        if max_output_tokens is not None and (
            type(max_output_tokens) is not int or not 0 <= max_output_tokens <= MAX_TOKENS_PER_EVENT
        ):
            _count("max_output_tokens", max_output_tokens, MAX_TOKENS_PER_EVENT)
        self.org_id = org_id
        self.secret_id = secret_id
        self.project_id = project_id
        self.grant_id = grant_id
        self.permission_id = permission_id
        self.user_id = user_id
        self.groups = groups
        self.session_id = session_id
        self.tags = tags
        self.provider = provider
        self.api = api
        self.model = model
        self.input_tokens = input_tokens
        self.request_bytes = request_bytes
        self.max_output_tokens = max_output_tokens
        self.units = _units(units) if units else None
        self.canon = canon
        self.org = org
        self.secret = secret
        self.user = users[0] if users else ""
        self.session = sessions[0] if sessions else ""
        self.group = group

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self.to_json().items())
        return f"Context({shown})"

    @classmethod
    def from_mapping(cls, data: Any) -> Context:
        """A context from JSON-like data (the sidecar, the CLI); unknown keys are refused."""
        if type(data) is not dict and not isinstance(data, Mapping):
            raise InvalidContext("<ctx>", "must be a JSON object")
        if not _FIELD_NAMES.issuperset(data):
            for name in data:
                if name not in _FIELD_NAMES:
                    raise InvalidContext(str(name), "not a context field")
        if "org_id" not in data or "secret_id" not in data:
            name = "secret_id" if "org_id" in data else "org_id"
            raise InvalidContext(name, "required, a non-empty string")
        # each field by name, not cls(**data): compiled, this is a direct call of __init__
        # (parsing 15 keyword arguments cost as much as building the context)
        fields: dict[str, Any] = data if type(data) is dict else dict(data)
        return Context(
            org_id=fields["org_id"],
            secret_id=fields["secret_id"],
            project_id=fields.get("project_id"),
            grant_id=fields.get("grant_id"),
            permission_id=fields.get("permission_id"),
            user_id=fields.get("user_id"),
            groups=fields.get("groups", ()),
            session_id=fields.get("session_id"),
            tags=fields.get("tags"),
            provider=fields.get("provider"),
            api=fields.get("api"),
            model=fields.get("model"),
            input_tokens=fields.get("input_tokens"),
            request_bytes=fields.get("request_bytes"),
            max_output_tokens=fields.get("max_output_tokens"),
            units=fields.get("units"),
        )

    # Mapping-like access for schemas.budgets (Budget.counter_keys / applicable)
    def get(self, name: str, default: Any = None) -> Any:
        return getattr(self, name, default) if name in _FIELD_NAMES else default

    def values(self, attribute: str) -> tuple[str, ...]:
        """Canonical values of ``attribute`` (as schemas.budgets reads them)."""
        return self.canon.get(attribute, ())

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in _FIELDS:
            value = getattr(self, name)
            if value is None or (name in ("groups", "tags") and not value):
                continue
            out[name] = list(value) if name == "groups" else value
        return out


# --- the per-policy index -----------------------------------------------------------
_SCOPE_ATTRIBUTE: Final = {
    "secret": "secret_id",
    "project": "project_id",
    "grant": "grant_id",
    "group": "group",
    "user": "user_id",
}
_NEVER: Final = 1 << 62
#: X-Spend-Budget headers kept per plan (cleared when full)
SPEND_HEADER_CACHE_SIZE: Final = 1024
#: counter states, as the hot path keeps them (indexes into per-budget metric slots)
#: (each one ``Final``: compiled, a constant is inlined; a plain module global is a dict
#: lookup at every use)
OK_I: Final = 0
ALERT_I: Final = 1
EXCEEDED_I: Final = 2
IN_FLIGHT_I: Final = 3
FAILED_OPEN_I: Final = 4
FAILED_CLOSED_I: Final = 5
#: this request's worst case alone does not fit what is left (no holds needed to refuse it)
TOO_LARGE_I: Final = 6
#: the budget's ``rate`` refuses it for now (this replica's token bucket is empty)
THROTTLED_I: Final = 7
#: an enforce USD budget whose unpriced policy is ``refuse``, for a model without a price
UNPRICED_I: Final = 8
STATE_NAMES: Final = (
    "ok",
    "alert",
    "exceeded",
    "in_flight",
    "failed_open",
    "failed_closed",
    "too_large",
    "throttled",
    "unpriced",
)
#: how a plan reads its scope values from the context (Plan.kind)
KIND_ORG: Final = 0
KIND_ONE: Final = 1
KIND_MANY: Final = 2
KIND_SESSION: Final = 3
KIND_SECRET: Final = 4
KIND_USER: Final = 5


class Plan:
    """One budget, with what a check needs precomputed (key prefix, period cache, limits)."""

    __slots__ = (
        "alert_min",
        "budget",
        "budget_id",
        "counts",
        "enforce",
        "holdable",
        "kind",
        "limit_nanos",
        "limit_requests",
        "limit_tokens",
        "match",
        "period",
        "period_end_us",
        "period_from_us",
        "period_until_us",
        "rates",
        "refuse_unpriced",
        "scope",
        "scope_attribute",
        "spend_headers",
        "window",
    )

    def __init__(
        self, budget: Budget, counts: list[int] | None = None, unpriced_default: str = "refuse"
    ) -> None:
        self.budget = budget
        self.budget_id = sys.intern(budget.budget_id)
        self.scope = budget.scope
        self.scope_attribute = _SCOPE_ATTRIBUTE.get(budget.scope, budget.scope)
        self.window = budget.window
        self.enforce = budget.action == "enforce"
        self.limit_nanos = budget.limit_nanos
        self.limit_tokens = budget.limit_tokens
        self.limit_requests = budget.limit_requests
        self.holdable = self.enforce and (
            budget.limit_nanos is not None
            or budget.limit_tokens is not None
            or budget.limit_requests is not None
        )
        #: a request for a model without a price cannot be counted against a USD limit:
        #: refused unless the budget (or the enforcer's default) allows it at $0
        self.refuse_unpriced = (
            self.enforce
            and budget.limit_nanos is not None
            and (budget.unpriced or unpriced_default) == UNPRICED_REFUSE
        )
        self.alert_min = min(budget.alert_at) if budget.alert_at else None
        #: the budget's rate limits: (tokens, not requests; count; window µs); enforce only
        self.rates: tuple[tuple[bool, int, int], ...] = (
            tuple(
                (unit == "tokens", count, seconds * 1_000_000)
                for unit, count, seconds in budget.rate.limits()
            )
            if budget.rate is not None and self.enforce
            else ()
        )
        self.match = tuple((a, frozenset(v)) for a, v in budget.match.items())
        #: how keys() reads the scope (the hot path inlines the common kinds)
        if budget.scope == "org":
            self.kind = KIND_ORG
        elif budget.scope == "session":
            self.kind = KIND_SESSION
        elif budget.scope == "group":
            self.kind = KIND_MANY
        elif budget.scope == "secret":
            self.kind = KIND_SECRET
        elif budget.scope == "user":
            self.kind = KIND_USER
        else:  # ids and tags: one value at most
            self.kind = KIND_ONE
        #: X-Spend-Budget headers by (state, period end µs, whole percent used): warned
        #: counters repeat them request after request
        self.spend_headers: dict[tuple[int, int | None, int], tuple[str, str]] = {}
        #: per-state check counts (metrics), shared across plan rebuilds of one budget
        self.counts = counts if counts is not None else [0] * len(STATE_NAMES)
        # the current period, valid for now_us in [period_from_us, period_until_us)
        self.period = ""
        self.period_end_us: int | None = None
        self.period_from_us = _NEVER
        self.period_until_us = 0

    def current_period(self, now_us: int) -> tuple[str, int | None]:
        """(period key, end of the period in µs or None), recomputed only when it ends."""
        if self.period_from_us <= now_us < self.period_until_us:
            return self.period, self.period_end_us
        now = from_micros(now_us)
        end = period_end(self.window, now)
        end_us = None if end is None else _micros(end)
        self.period = sys.intern(period_key(self.window, now))
        self.period_end_us = end_us
        self.period_from_us = now_us if end_us is not None else 0
        self.period_until_us = _NEVER if end_us is None else end_us
        return self.period, end_us

    def matches(self, canon: dict[str, tuple[str, ...]]) -> bool:
        """Every ``match`` attribute has a canonical value among the allowed ones."""
        for attribute, allowed in self.match:
            for value in canon.get(attribute, ()):
                if value in allowed:
                    break
            else:
                return False
        return True

    def keys(self, ctx: Context) -> Sequence[CounterId]:
        """The id (budget id, *scope values) of every counter of this budget ``ctx`` counts in.

        ``compose`` of each is what ``Budget.counter_keys(ctx)`` returns (a property test
        holds them equal; :meth:`Checker._evaluate` inlines the same rules).
        """
        if self.match and not self.matches(ctx.canon):
            return ()
        return self.scoped(ctx)

    def scoped(self, ctx: Context) -> Sequence[CounterId]:
        """:meth:`keys` without the ``match`` test."""
        canon = ctx.canon
        scope = self.scope
        if scope == "org":
            return ((self.budget_id, ctx.org),)
        if scope == "session":
            sessions = canon["session_id"]
            if not sessions:
                return ()
            identity = canon["user_id"] or canon["secret_id"]
            return ((self.budget_id, ctx.org, identity[0], sessions[0]),)
        values = canon.get(self.scope_attribute, ())
        if len(values) == 1:
            return ((self.budget_id, ctx.org, values[0]),)
        return [(self.budget_id, ctx.org, value) for value in values]


class Index:
    """Every budget as a :class:`Plan`; budgets pinned to orgs by ``match: org_id``."""

    def __init__(
        self,
        budgets: Mapping[str, Budget],
        counts: Callable[[str], list[int]] | None = None,
        unpriced_default: str = UNPRICED_REFUSE,
    ) -> None:
        self.general: list[Plan] = []
        self.by_org: dict[str, list[Plan]] = {}
        for budget_id in sorted(budgets):
            plan = Plan(
                budgets[budget_id], None if counts is None else counts(budget_id), unpriced_default
            )
            orgs = budgets[budget_id].match.get("org_id")
            if orgs:
                for org in set(orgs):
                    self.by_org.setdefault(org, []).append(plan)
            else:
                self.general.append(plan)

    def plans(self, ctx: Context) -> list[Plan]:
        pinned = self.by_org.get(ctx.org)
        return self.general if pinned is None else self.general + pinned

    def applicable(self, ctx: Context) -> list[tuple[Plan, str, tuple[str, ...]]]:
        """(plan, counter key, scope values) for every counter ``ctx`` counts in: the
        contract's ``applicable(budgets, ctx)``, computed from the index."""
        return [(plan, compose(cid), cid[1:]) for plan in self.plans(ctx) for cid in plan.keys(ctx)]


def _micros(ts: datetime) -> int:
    delta = ts - _EPOCH
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


# --- rate limits ----------------------------------------------------------------------
#: a bucket holds this fraction of its window's count (1 s of a per-minute rate, 1/60 s of
#: a per-second one), and at least MIN_REQUESTS_BURST requests or one token
BURST_FRACTION: Final = 1 / 60
#: a request bucket holds at least two: with room for one only, the refill that comes
#: between the bucket filling and the next request is lost, and a saturated replica
#: admits a few percent under its rate (measured: -9 % at 60 requests/s over 3 replicas)
MIN_REQUESTS_BURST: Final = 2.0
#: buckets kept before the full (idle) ones are dropped
MAX_BUCKETS: Final = 100_000


@final
class RateBucket:
    """One rate limit of one counter on this replica: a token bucket refilled at
    count / window / replicas (this replica's share), refilling up to
    count / replicas x BURST_FRACTION, at least 2 requests or the largest request's
    tokens. Requests take 1
    and need a whole one; tokens take the request's worst case and need the level above
    0 (they may go into debt: settle gives back what was not used, even above the
    bucket's size: it is the past's over-charge, not new room)."""

    __slots__ = ("count", "largest", "level", "tokens", "updated_us", "window_us")

    def __init__(self, tokens: bool, count: int, window_us: int, share: int, now_us: int) -> None:
        self.tokens = tokens
        self.count = count
        self.window_us = window_us
        #: tokens: the largest worst case taken (the bucket holds at least one of them)
        self.largest = 1.0
        self.level = self.capacity(share)
        self.updated_us = now_us

    def capacity(self, share: int) -> float:
        # tokens: room for the largest request seen, or the refill that comes while the
        # bucket waits full for the next one is lost (measured: -10 % at 20k tokens/s)
        least = self.largest if self.tokens else MIN_REQUESTS_BURST
        return max(least, self.count / share * BURST_FRACTION)

    def refill(self, now_us: int, share: int) -> float:
        """The level now (refilled since the last look, at this replica's share; a level
        above the bucket's size, from a settle's refund, is kept, not cut)."""
        if now_us > self.updated_us:
            cap = self.capacity(share)
            if self.level < cap:
                level = self.level + (now_us - self.updated_us) * self.count / (
                    self.window_us * share
                )
                self.level = cap if level > cap else level
            self.updated_us = now_us
        return self.level

    def wait_us(self, share: int) -> int:
        """How long until this bucket admits again (0: it does now)."""
        need = 1.0 - self.level if not self.tokens else -self.level
        if need <= 0 and (self.tokens or self.level >= 1.0):
            return 0
        wait = need * self.window_us * share / self.count
        whole = int(wait)
        return whole + 1 if whole < wait else whole


# --- the decision ---------------------------------------------------------------------
OK: Final = "ok"
ALERT: Final = "alert"
EXCEEDED: Final = "exceeded"
IN_FLIGHT: Final = "in_flight"


@final
class CounterStatus:
    """One applicable counter as the check saw it (read-only for callers).

    ``state``: ok | alert | exceeded | in_flight (this request's estimate and the
    holds would pass the limit) | too_large (the estimate alone would) | failed_open |
    failed_closed (verdicts stale: not evaluated).
    The check builds one per counter (a compiled class: its integers are stored
    unboxed, one allocation per counter).
    """

    __slots__ = (
        "counter_id",
        "end_us",
        "granted",
        "held_nanos",
        "held_requests",
        "held_tokens",
        "limit_nanos",
        "limit_requests",
        "limit_tokens",
        "period",
        "plan",
        "spent_nanos",
        "spent_requests",
        "spent_tokens",
        "state_i",
        "verdict",
    )

    plan: Plan
    counter_id: CounterId
    period: str
    end_us: int | None
    verdict: CounterVerdict | None
    spent_nanos: int
    spent_tokens: int
    spent_requests: int
    held_nanos: int
    held_tokens: int
    held_requests: int
    #: the state as an index into STATE_NAMES (what the hot path compares)
    state_i: int
    #: the limits checked: the budget's, or those of the raise it has now (``granted``)
    limit_nanos: int | None
    limit_tokens: int | None
    limit_requests: int | None
    granted: BudgetRaise | None

    def __init__(
        self,
        plan: Plan,
        counter_id: CounterId,
        period: str,
        end_us: int | None,
        verdict: CounterVerdict | None,
        spent_nanos: int,
        spent_tokens: int,
        spent_requests: int,
        held_nanos: int,
        held_tokens: int,
        held_requests: int,
        state_i: int,
        limit_nanos: int | None,
        limit_tokens: int | None,
        limit_requests: int | None,
        granted: BudgetRaise | None,
    ) -> None:
        self.plan = plan
        self.counter_id = counter_id
        self.period = period
        self.end_us = end_us
        self.verdict = verdict
        self.spent_nanos = spent_nanos
        self.spent_tokens = spent_tokens
        self.spent_requests = spent_requests
        self.held_nanos = held_nanos
        self.held_tokens = held_tokens
        self.held_requests = held_requests
        self.state_i = state_i
        self.limit_nanos = limit_nanos
        self.limit_tokens = limit_tokens
        self.limit_requests = limit_requests
        self.granted = granted

    @property
    def state(self) -> str:
        return STATE_NAMES[self.state_i]

    @property
    def budget_id(self) -> str:
        return self.plan.budget_id

    @property
    def counter(self) -> str:
        """The counter key (``schemas.ids.counter_key``), as on the verdict topic."""
        return compose(self.counter_id)

    @property
    def scope_values(self) -> tuple[str, ...]:
        return self.counter_id[1:]

    @property
    def action(self) -> str:
        return "enforce" if self.plan.enforce else "warn"

    @property
    def reset_at(self) -> datetime | None:
        return None if self.end_us is None else from_micros(self.end_us)

    def used_fraction(self) -> float:
        """The largest spent/limit over the budget's limits (verdict spend, holds excluded)."""
        return _used_fraction(self, self.spent_nanos, self.spent_tokens, self.spent_requests)

    def remaining(self) -> dict[str, int | None]:
        """What is left under each limit after verdict spend and holds (None: no such limit)."""
        return {
            "nanos": _left(self.limit_nanos, self.spent_nanos + self.held_nanos),
            "tokens": _left(self.limit_tokens, self.spent_tokens + self.held_tokens),
            "requests": _left(self.limit_requests, self.spent_requests + self.held_requests),
        }

    def to_json(self) -> dict[str, Any]:
        plan = self.plan
        return {
            "budget_id": plan.budget_id,
            "scope": plan.scope,
            "scope_values": list(self.scope_values),
            "counter": self.counter,
            "action": self.action,
            "window": plan.window.spec,
            "period": self.period,
            "state": self.state,
            "spent_nanos": self.spent_nanos,
            "spent_tokens": self.spent_tokens,
            "spent_requests": self.spent_requests,
            "held_nanos": self.held_nanos,
            "held_tokens": self.held_tokens,
            "held_requests": self.held_requests,
            "limit_nanos": self.limit_nanos,
            "limit_tokens": self.limit_tokens,
            "limit_requests": self.limit_requests,
            "base_limit_nanos": plan.limit_nanos,
            "base_limit_tokens": plan.limit_tokens,
            "base_limit_requests": plan.limit_requests,
            "raise": None if self.granted is None else self.granted.to_json(),
            "remaining": self.remaining(),
            "used_pct": round(self.used_fraction() * 100, 2),
            "reset_at": refusals.iso(self.reset_at),
            "as_of": None if self.verdict is None else refusals.iso_us(self.verdict.as_of_us),
            "seq": None if self.verdict is None else self.verdict.seq,
        }


def _used_fraction(
    row: CounterStatus, spent_nanos: int, spent_tokens: int, spent_requests: int
) -> float:
    """The largest spent / limit over the counter's limits (0.0 for none)."""
    used = 0.0
    if (limit := row.limit_nanos) and spent_nanos / limit > used:
        used = spent_nanos / limit
    if (limit := row.limit_tokens) and spent_tokens / limit > used:
        used = spent_tokens / limit
    if (limit := row.limit_requests) and spent_requests / limit > used:
        used = spent_requests / limit
    return used


def _left(limit: int | None, used: int) -> int | None:
    return None if limit is None else max(0, limit - used)


TOO_LARGE: Final = "too_large"
_REFUSING: Final = (EXCEEDED, IN_FLIGHT, TOO_LARGE)
#: an allowed request without warnings: the same answer every time
_ALLOWED_ANSWER: Final = refusals.Response(200, (), None, None)


class Decision:
    """What the enforcer decided for one request; every attribute is read-only.

    The policy-hook flags (``over_budget``, ``job_over_budget``,
    ``exceeded_budgets``, ``counters``, ``remaining``) only read what the check
    computed: reading them never counts as a request and changes nothing.
    """

    __slots__ = (
        "_config",
        "_counters",
        "_refusal",
        "_response",
        "_rows",
        "ctx",
        "decision",
        "fitting_max_tokens",
        "hold_id",
        "now_us",
        "outcome",
        "reason",
        "replicas",
        "request_nanos",
        "request_tokens",
        "throttle",
    )

    def __init__(
        self,
        ctx: Context,
        decision: str,
        outcome: str,
        rows: list[CounterStatus],
        refusal: int,
        now_us: int,
        config: EnforcerConfig,
        hold_id: int | None = None,
        reason: str | None = None,
    ) -> None:
        self.ctx = ctx
        self.decision = decision
        self.outcome = outcome
        self._rows = rows
        self._counters: tuple[CounterStatus, ...] | None = None
        #: index of the refusing row, -1 for none
        self._refusal = refusal
        self.now_us = now_us
        self._config = config
        self.hold_id = hold_id
        #: failed_* only: ``not_ready`` or ``stale``
        self.reason = reason
        self._response: refusals.Response | None = None
        #: a refusal by what is left (too large, in flight): the request's worst case,
        #: the replica count its share was taken with, and the largest max output tokens
        #: that would be admitted now (None: not even 0); -1 / None when not computed
        self.request_nanos = -1
        self.request_tokens = -1
        self.replicas = 1
        self.fitting_max_tokens: int | None = None
        #: a throttled request: (tokens?, count, window µs, µs until it would pass)
        self.throttle: tuple[bool, int, int, int] | None = None

    def __repr__(self) -> str:
        return f"<Decision {self.decision} status={self.status} budget={self.budget_id!r}>"

    @property
    def allowed(self) -> bool:
        return self.outcome == "allowed" or self.outcome == "failed_open"

    @property
    def counters(self) -> tuple[CounterStatus, ...]:
        """Every applicable counter, as the check saw it."""
        if self._counters is None:
            self._counters = tuple(self._rows)
        return self._counters

    @property
    def refusing(self) -> CounterStatus | None:
        """The counter that refused (the one resetting last when several do)."""
        return None if self._refusal < 0 else self.counters[self._refusal]

    @property
    def budget_id(self) -> str | None:
        return None if self._refusal < 0 else self._rows[self._refusal].plan.budget_id

    @property
    def warnings(self) -> tuple[CounterStatus, ...]:
        """Counters past an alert threshold or a warn budget's limit (X-Spend-Budget)."""
        return tuple(
            [
                r
                for r in self._rows
                if (r.state_i == ALERT_I or r.state_i == EXCEEDED_I) and r.verdict is not None
            ]
        )

    def warning_headers(self) -> tuple[tuple[str, str], ...]:
        """``X-Spend-Budget`` of each of :attr:`warnings`, cached per plan."""
        headers = []
        for r in self._rows:
            state = r.state_i
            if state in (ALERT_I, EXCEEDED_I) and r.verdict is not None:
                plan = r.plan
                used = _used_fraction(r, r.spent_nanos, r.spent_tokens, r.spent_requests)
                # the header reads the plan, the state, the period end and the whole percent
                key = (state, r.end_us, int(used * 100))
                cache = plan.spend_headers
                header = cache.get(key)
                if header is None:
                    if len(cache) >= SPEND_HEADER_CACHE_SIZE:
                        cache.clear()
                    header = cache[key] = refusals.spend_header_of(
                        plan, STATE_NAMES[state], r.end_us, used
                    )
                headers.append(header)
        return tuple(headers)

    # --- the HTTP answer --------------------------------------------------------------
    def _answer(self) -> refusals.Response:
        if self._response is None:
            outcome = self.outcome
            if outcome == "allowed" or outcome == "failed_open":
                # refusals.respond's allowed branch, here (no call into the interpreted
                # module for the common answer)
                warnings = self.warning_headers()
                self._response = (
                    refusals.Response(200, warnings, None, None) if warnings else _ALLOWED_ANSWER
                )
            else:
                self._response = refusals.respond(self, self._config)
        return self._response

    @property
    def response(self) -> refusals.Response:
        """status, headers, body and retry_after in one (built once, on first read)."""
        return self._answer()

    @property
    def status(self) -> int:
        return self._answer().status

    @property
    def headers(self) -> tuple[tuple[str, str], ...]:
        """Refusal headers (Retry-After...), or X-Spend-Budget warnings on an allowed request."""
        return self._answer().headers

    @property
    def body(self) -> dict[str, Any] | None:
        """The JSON refusal body (None when allowed)."""
        return self._answer().body

    @property
    def retry_after(self) -> int | None:
        return self._answer().retry_after

    # --- the policy hook ----------------------------------------------------------------
    def _refusing_rows(self) -> list[CounterStatus]:
        return [
            r
            for r in self._rows
            if (
                r.state_i == EXCEEDED_I
                or r.state_i == IN_FLIGHT_I
                or r.state_i == TOO_LARGE_I
                or r.state_i == UNPRICED_I
            )
            and r.plan.enforce
        ]

    @property
    def over_budget(self) -> bool:
        """Some enforce budget refuses this request (exhausted or in flight)."""
        return bool(self._refusing_rows())

    @property
    def job_over_budget(self) -> bool:
        """A per-job (session) ceiling refuses this request."""
        return any([r.plan.scope == "session" for r in self._refusing_rows()])

    @property
    def exceeded_budgets(self) -> tuple[str, ...]:
        """The enforce budgets refusing this request (exhausted or in flight)."""
        return tuple(dict.fromkeys([r.plan.budget_id for r in self._refusing_rows()]))

    def remaining(self) -> dict[str, dict[str, int | None]]:
        """Per counter key: what is left under each limit."""
        return {c.counter: c.remaining() for c in self.counters}

    # --- decisions are usage too -------------------------------------------------------------
    def usage_fields(self) -> dict[str, Any]:
        """Fields to set on the request's UsageEvent (outcome, decision, decision budget)."""
        return {
            "outcome": self.outcome,
            "decision": self.decision,
            "decision_budget_id": self.budget_id,
        }

    def refusal_event(
        self, *, gateway_id: str | None = None, event_id: str | None = None, **fields: Any
    ) -> dict[str, Any] | None:
        """The UsageEvent of a refused request (zero tokens); None when the request was allowed."""
        if self.allowed:
            return None
        ctx = self.ctx
        optional = {
            name: getattr(ctx, name)
            for name in ("project_id", "grant_id", "permission_id", "user_id", "session_id")
        }
        optional.update(fields)
        return new_usage_event(
            provider=ctx.provider or "unknown",
            api=ctx.api or "unknown",
            model=ctx.model or "unknown",
            secret_id=ctx.secret_id,
            org_id=ctx.org_id,
            gateway_id=gateway_id or self._config.gateway_id,
            input_tokens=0,
            output_tokens=0,
            status_code=self.status,
            occurred_at=from_micros(self.now_us),
            event_id=event_id,
            groups=list(ctx.groups),
            tags=dict(ctx.tags or {}),
            usage_source="none",
            outcome=self.outcome,
            decision=self.decision,
            decision_budget_id=self.budget_id,
            **optional,
        )

    def to_json(self, *, counters: bool = True) -> dict[str, Any]:
        """The decision as JSON (the sidecar's and ``spendbus check``'s answer)."""
        answer = self._answer()
        outcome = self.outcome
        budget_id = self.budget_id
        # only a budget refusal has refusing rows: skip the scans otherwise
        if outcome == "refused":
            refusing = self._refusing_rows()
            job = any([r.plan.scope == "session" for r in refusing])
            exceeded = list(dict.fromkeys([r.plan.budget_id for r in refusing]))
        else:
            refusing, job, exceeded = [], False, []
        out = {
            "allowed": outcome == "allowed" or outcome == "failed_open",
            "decision": self.decision,
            "outcome": outcome,
            "status": answer.status,
            "budget_id": budget_id,
            "reason": self.reason,
            "retry_after": answer.retry_after,
            "headers": [list(h) for h in answer.headers],
            "body": answer.body,
            "hold_id": self.hold_id,
            "over_budget": bool(refusing),
            "job_over_budget": job,
            "exceeded_budgets": exceeded,
            # usage_fields(), without a second lookup of the budget
            "usage_fields": {
                "outcome": outcome,
                "decision": self.decision,
                "decision_budget_id": budget_id,
            },
        }
        if counters:
            out["counters"] = [c.to_json() for c in self.counters]
        return out


# --- the checker ------------------------------------------------------------------------
Clock = Callable[[], float]
#: estimates cached per (model, input tokens, max output) until prices or time move on
ESTIMATE_CACHE_SIZE: Final = 4096


class Checker:
    """Answers check(ctx) from an :class:`EnforcerState` and :class:`Holds`."""

    def __init__(
        self,
        state: EnforcerState,
        holds: Holds,
        config: EnforcerConfig,
        metrics: EnforcerMetrics,
        clock: Clock,
    ) -> None:
        self.state = state
        self.holds = holds
        self.config = config
        self.metrics = metrics
        self.clock = clock
        self._grace_us = config.grace_us
        self._default_output = config.default_max_output_tokens
        #: each of ``replicas`` enforcers may hold at most 1/replicas of the headroom
        self._replicas = config.replicas
        self._index = Index({})
        self._index_version = -1
        self._estimates: dict[tuple[str, int, int], int] = {}
        self._estimates_version = -1
        self._estimates_until_us = 0
        #: the last estimate, in front of the cache (a proxy's requests repeat one shape)
        self._last_model: str | None = None
        self._last_input = 0
        self._last_output = 0
        self._last_nanos = 0
        #: model -> whether no price entry nor fallback prices it (cleared with the estimates)
        self._unpriced: dict[str, bool] = {}
        #: rate limits: one bucket per (counter id, index into the plan's rates)
        self._buckets: dict[tuple[CounterId, int], RateBucket] = {}
        #: hold id -> the token buckets it took its worst case from (settle refunds)
        self._rate_charges: dict[int, list[tuple[RateBucket, int]]] = {}
        #: the metric counters bumped per check (plain dicts, held here: one lookup less)
        self._decisions = metrics.decisions
        self._peeks = metrics.peeks

    @property
    def replicas(self) -> int:
        """The replica count each check's share is taken with (1/replicas of the headroom)."""
        return self._replicas

    def set_replicas(self, replicas: int) -> None:
        """A new count (enforcer.membership): the next check uses it."""
        if replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {replicas}")
        self._replicas = replicas

    @property
    def index(self) -> Index:
        if self._index_version != self.state.policy_version:
            self._index = Index(
                self.state.budgets, self.metrics.budget_counts, self.config.unpriced_models
            )
            self._index_version = self.state.policy_version
        return self._index

    def stale_reason(self, now_us: int) -> str | None:
        state = self.state
        if not state.ready:
            return "not_ready"
        if state.fresh_at_us is None or now_us - state.fresh_at_us > self._grace_us:
            return "stale"
        return None

    def estimate_tokens(self, ctx: Context) -> tuple[int, int]:
        """(input estimate, max output) of the request, in tokens."""
        if ctx.input_tokens is not None:
            input_tokens = ctx.input_tokens
        elif ctx.request_bytes:
            input_tokens = min(
                MAX_TOKENS_PER_EVENT, -(-ctx.request_bytes // BYTES_PER_TOKEN_ESTIMATE)
            )
        else:
            input_tokens = 0
        output = ctx.max_output_tokens
        return input_tokens, self._default_output if output is None else output

    def estimate_nanos(
        self,
        model: str,
        input_tokens: int,
        max_output: int,
        now_us: int,
        units: dict[str, int] | None = None,
    ) -> int:
        """Worst-case cost (schemas.pricing), cached until the price book or version changes;
        a request naming unit caps (rare) is priced with them, uncached."""
        state = self.state
        if state.price_version != self._estimates_version or now_us >= self._estimates_until_us:
            self._estimates.clear()
            self._unpriced.clear()
            self._last_model = None
            self._estimates_version = state.price_version
            self._estimates_until_us = _NEVER
            for table in state.prices.tables:  # the next version to come into force
                start = _micros(table.effective_from)
                if start > now_us:
                    self._estimates_until_us = min(self._estimates_until_us, start)
        if units:
            return state.prices.worst_case_nanos(
                model,
                at=from_micros(now_us),
                input_tokens=input_tokens,
                max_output_tokens=max_output,
                units=units,
            )
        if (
            model == self._last_model
            and input_tokens == self._last_input
            and max_output == self._last_output
        ):
            return self._last_nanos
        key = (model, input_tokens, max_output)
        nanos = self._estimates.get(key)
        if nanos is None:
            if len(self._estimates) >= ESTIMATE_CACHE_SIZE:
                self._estimates.clear()
            nanos = state.prices.worst_case_nanos(
                model,
                at=from_micros(now_us),
                input_tokens=input_tokens,
                max_output_tokens=max_output,
            )
            self._estimates[key] = nanos
        self._last_model = model
        self._last_input = input_tokens
        self._last_output = max_output
        self._last_nanos = nanos
        return nanos

    def model_unpriced(self, model: str, now_us: int) -> bool:
        """No entry nor fallback of the price table in force prices ``model`` (cached with
        the estimates: call after :meth:`estimate_nanos`, which renews the cache)."""
        unpriced = self._unpriced.get(model)
        if unpriced is None:
            if len(self._unpriced) >= ESTIMATE_CACHE_SIZE:
                self._unpriced.clear()
            table = self.state.prices.table_at(from_micros(now_us))
            unpriced = self._unpriced[model] = table is None or table.resolve(model) is None
        return unpriced

    def check(self, ctx: Context, *, reserve: bool = True) -> Decision:
        """Decide for one request. With ``reserve``, an allowed request holds its estimate
        and the decision is counted as a check; without, it is a peek (no hold, no count)."""
        now_us = int(self.clock() * 1_000_000)
        state = self.state
        fresh_at = state.fresh_at_us
        if state.ready and fresh_at is not None and now_us - fresh_at <= self._grace_us:
            decision = self._evaluate(ctx, now_us, reserve, True)
        else:
            decision = self._stale(ctx, now_us, reserve)
        if reserve:
            self._decisions[decision.decision] += 1
        else:
            self._peeks[decision.decision] += 1
        return decision

    def usage(self, ctx: Context) -> list[CounterStatus]:
        """Every counter ``ctx`` counts in, with spend, holds and limits; holds and counts nothing."""
        now_us = int(self.clock() * 1_000_000)
        return list(self._evaluate(ctx, now_us, False, False).counters)

    def _evaluate(self, ctx: Context, now_us: int, reserve: bool, in_flight: bool) -> Decision:
        """Every applicable counter against its budget (the table in the module docstring).

        ``in_flight=False`` reports verdict states only and holds nothing (usage).
        The counters are those of :meth:`Plan.keys`, inlined here for org, session and
        one-value scopes (the property test against ``applicable`` covers every path).
        """
        verdicts = self.state.verdicts
        ahead = self.state.ahead
        raises = self.state.raises
        raised = raises.by_budget
        holds_held = self.holds.held
        # holds are looked up only when some are outstanding; what was found is handed to
        # reserve (no second lookup of the same (counter, period))
        look_up_holds = bool(holds_held)
        rows: list[CounterStatus] = []
        refusal = -1
        refusal_end = 0
        hard = False
        to_hold: list[CounterPeriod] = []
        found: list[CounterHolds | None] = []
        #: rows of counters whose budget has a rate limit (None: none, no list built)
        rated: list[int] | None = None
        est_tokens = -1
        est_nanos = -1
        est_input = 0
        est_output = 0
        share = self._replicas
        index = self._index
        if self._index_version != self.state.policy_version:
            index = self.index
        canon = ctx.canon
        org = ctx.org
        plans = index.general
        if index.by_org:
            pinned = index.by_org.get(org)
            if pinned is not None:
                plans = plans + pinned
        for plan in plans:
            if plan.match and not plan.matches(canon):
                continue
            kind = plan.kind
            # the common scopes name one counter: its id is built here, without a sequence
            # of ids around it; several groups name several (``many``)
            many: Sequence[CounterId] | None = None
            cid: CounterId
            if kind == KIND_ORG:
                cid = (plan.budget_id, org)
            elif kind == KIND_USER:
                if not ctx.user:
                    continue
                cid = (plan.budget_id, org, ctx.user)
            elif kind == KIND_SECRET:
                cid = (plan.budget_id, org, ctx.secret)
            elif kind == KIND_SESSION:
                if not ctx.session:
                    continue
                cid = (plan.budget_id, org, ctx.user or ctx.secret, ctx.session)
            elif kind == KIND_MANY:  # groups: one counter each
                groups = ctx.group
                if not groups:
                    continue
                if len(groups) == 1:
                    cid = (plan.budget_id, org, groups[0])
                else:
                    many = plan.scoped(ctx)
                    cid = many[0]
            else:  # one value (other ids, tags)
                values = canon.get(plan.scope_attribute)
                if not values:
                    continue
                if len(values) == 1:
                    cid = (plan.budget_id, org, values[0])
                else:
                    many = plan.scoped(ctx)
                    cid = many[0]
            if plan.period_from_us <= now_us < plan.period_until_us:
                period = plan.period
                end_us = plan.period_end_us
            else:
                period, end_us = plan.current_period(now_us)
            next_key = 1
            while True:
                # the limits checked: the budget's, or its counter's raise now (raised lists
                # the budgets with raises: one dict lookup when none of them has one)
                granted = None
                if raised and plan.budget_id in raised:
                    granted = raises.active(plan.budget_id, cid[1:], now_us)
                if granted is None:
                    ln = plan.limit_nanos
                    lt = plan.limit_tokens
                    lr = plan.limit_requests
                else:
                    ln, lt, lr = granted.limits(
                        plan.limit_nanos, plan.limit_tokens, plan.limit_requests
                    )
                verdict = verdicts.get(cid)
                if verdict is not None and verdict.period == period:
                    sn = verdict.spent_nanos
                    st = verdict.spent_tokens
                    sr = verdict.spent_requests
                elif ahead and (promoted := self.state.promote(cid, period)) is not None:
                    # a verdict received before our clock reached its period: current now
                    verdict = promoted
                    sn = verdict.spent_nanos
                    st = verdict.spent_tokens
                    sr = verdict.spent_requests
                else:
                    sn = st = sr = 0
                hn = ht = hr = 0
                if (
                    (ln is not None and sn >= ln)
                    or (lt is not None and st >= lt)
                    or (lr is not None and sr >= lr)
                ):
                    state = EXCEEDED_I
                else:
                    state = OK_I
                    if plan.holdable:
                        cp = (cid, period)
                        held: CounterHolds | None = None
                        if look_up_holds:
                            held = holds_held.get(cp)
                            if held is not None:
                                hn = held.nanos
                                ht = held.tokens
                                hr = held.requests
                        if in_flight:
                            if est_tokens < 0:
                                est_input, est_output = self.estimate_tokens(ctx)
                                est_tokens = est_input + est_output
                            if ln is not None and est_nanos < 0:
                                est_nanos = self.estimate_nanos(
                                    ctx.model or "", est_input, est_output, now_us, ctx.units
                                )
                            if (
                                est_nanos == 0
                                and plan.refuse_unpriced
                                and self.model_unpriced(ctx.model or "", now_us)
                            ):
                                # a cost that cannot be priced cannot be held against the limit
                                state = UNPRICED_I
                            # this replica's holds, scaled to all replicas, within the headroom
                            elif (
                                (ln is not None and sn + share * (hn + est_nanos) > ln)
                                or (lt is not None and st + share * (ht + est_tokens) > lt)
                                or (lr is not None and sr + share * (hr + 1) > lr)
                            ):
                                # refused: because of what is in flight, or because this
                                # request's worst case alone does not fit (then waiting for
                                # the holds to settle cannot help)
                                if (
                                    (ln is not None and sn + share * est_nanos > ln)
                                    or (lt is not None and st + share * est_tokens > lt)
                                    or (lr is not None and sr + share > lr)
                                ):
                                    state = TOO_LARGE_I
                                else:
                                    state = IN_FLIGHT_I
                            else:
                                to_hold.append(cp)
                                found.append(held)
                    if state == OK_I and (sn or st or sr) and plan.alert_min is not None:
                        used = sn / ln if ln else 0.0
                        if lt and st / lt > used:
                            used = st / lt
                        if lr and sr / lr > used:
                            used = sr / lr
                        if used >= plan.alert_min:
                            state = ALERT_I
                if reserve:
                    plan.counts[state] += 1
                if state >= EXCEEDED_I and plan.enforce:
                    # exhausted, or too large for what is left: retrying soon cannot help
                    is_hard = state in (EXCEEDED_I, TOO_LARGE_I, UNPRICED_I)
                    end = _NEVER if end_us is None else end_us
                    if (
                        refusal < 0
                        or (is_hard and not hard)
                        or (is_hard == hard and end > refusal_end)
                    ):
                        refusal = len(rows)
                        refusal_end = end
                        hard = is_hard
                if plan.rates and in_flight:
                    if rated is None:
                        rated = []
                    rated.append(len(rows))
                rows.append(
                    CounterStatus(
                        plan,
                        cid,
                        period,
                        end_us,
                        verdict,
                        sn,
                        st,
                        sr,
                        hn,
                        ht,
                        hr,
                        state,
                        ln,
                        lt,
                        lr,
                        granted,
                    )
                )
                if many is None or next_key >= len(many):
                    break
                cid = many[next_key]
                next_key += 1

        config = self.config
        if refusal >= 0:
            refusing = rows[refusal].plan
            value = refusing.budget.refusal if hard else IN_FLIGHT_BUDGET_EXCEEDED
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "refused %s by %s counter %r",
                    value,
                    refusing.budget_id,
                    rows[refusal].counter_id,
                )
            decision = Decision(ctx, value, "refused", rows, refusal, now_us, config)
            refusing_state = rows[refusal].state_i
            if refusing_state != EXCEEDED_I and refusing_state != UNPRICED_I and est_tokens >= 0:
                # what the request asked for, and what would fit now (the refusal says so)
                decision.request_nanos = max(est_nanos, 0)
                decision.request_tokens = est_tokens
                decision.replicas = share
                decision.fitting_max_tokens = self.fitting_max_tokens(
                    rows, ctx.model or "", est_input, est_output, now_us, ctx.units
                )
            return decision
        charges: list[tuple[RateBucket, int]] | None = None
        if rated is not None:
            if est_tokens < 0:
                est_input, est_output = self.estimate_tokens(ctx)
                est_tokens = est_input + est_output
            throttled = self._rate_check(ctx, rows, rated, est_tokens, now_us, reserve)
            if throttled is not None:
                return throttled
            if reserve:
                charges = self._rate_take(rows, rated, est_tokens)
        hold_id = None
        if reserve and (to_hold or charges):
            hold_id = self.holds.reserve(
                to_hold,
                nanos=max(est_nanos, 0),
                tokens=est_tokens,
                requests=1,
                now_us=now_us,
                found=found if look_up_holds else None,
            )
            if charges:
                self._rate_charges[hold_id] = charges
        return Decision(ctx, ALLOWED, "allowed", rows, -1, now_us, config, hold_id)

    # --- rate limits ---------------------------------------------------------------------
    def _bucket(
        self, cid: CounterId, index: int, spec: tuple[bool, int, int], now_us: int
    ) -> RateBucket:
        key = (cid, index)
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= MAX_BUCKETS:
                self._drop_full_buckets(now_us)
            bucket = RateBucket(spec[0], spec[1], spec[2], self._replicas, now_us)
            self._buckets[key] = bucket
        return bucket

    def _drop_full_buckets(self, now_us: int) -> None:
        share = self._replicas
        full = [
            key
            for key, bucket in self._buckets.items()
            if bucket.refill(now_us, share) >= bucket.capacity(share)
        ]
        for key in full:
            del self._buckets[key]

    def _rate_check(
        self,
        ctx: Context,
        rows: list[CounterStatus],
        rated: list[int],
        tokens: int,
        now_us: int,
        reserve: bool,
    ) -> Decision | None:
        """The throttled decision when a bucket of a rated counter cannot admit now (the
        one admitting last is reported), else None."""
        share = self._replicas
        worst = -1
        worst_wait = 0
        worst_spec: tuple[bool, int, int] = (False, 0, 0)
        for i in rated:
            row = rows[i]
            plan = row.plan
            for index in range(len(plan.rates)):
                spec = plan.rates[index]
                bucket = self._bucket(row.counter_id, index, spec, now_us)
                bucket.refill(now_us, share)
                wait = bucket.wait_us(share)
                if wait > worst_wait:
                    worst, worst_wait, worst_spec = i, wait, spec
        if worst < 0:
            return None
        row = rows[worst]
        if reserve:
            row.plan.counts[row.state_i] -= 1
            row.plan.counts[THROTTLED_I] += 1
        row.state_i = THROTTLED_I
        decision = Decision(ctx, THROTTLED, "refused", rows, worst, now_us, self.config)
        decision.throttle = (worst_spec[0], worst_spec[1], worst_spec[2], worst_wait)
        decision.replicas = share
        decision.request_tokens = tokens
        return decision

    def _rate_take(
        self, rows: list[CounterStatus], rated: list[int], tokens: int
    ) -> list[tuple[RateBucket, int]]:
        """Take one request (and the worst case's tokens) from every bucket of the rated
        counters; the token charges, for settle to give back what was not used."""
        charges: list[tuple[RateBucket, int]] = []
        for i in rated:
            row = rows[i]
            for index in range(len(row.plan.rates)):
                bucket = self._buckets[(row.counter_id, index)]
                if bucket.tokens:
                    bucket.level -= tokens
                    if tokens > bucket.largest:
                        bucket.largest = float(tokens)
                    charges.append((bucket, tokens))
                else:
                    bucket.level -= 1.0
                    charges.append((bucket, 1))
        return charges

    def _rate_refund(self, hold_id: int, used_tokens: int, sent: bool) -> None:
        """Settle: give back the tokens the worst case took beyond what was used; release
        (never sent): give back everything, the request included."""
        charges = self._rate_charges.pop(hold_id, None)
        if charges is None:
            return
        for bucket, taken in charges:
            if bucket.tokens:
                bucket.level += taken - (used_tokens if sent else 0)
            elif not sent:
                bucket.level += taken
        if len(self._rate_charges) > 2 * len(self.holds) + 1024:
            # holds that timed out without a settle or release: their charges go too
            self._rate_charges = {
                h: c for h, c in self._rate_charges.items() if self.holds.get(h) is not None
            }

    def release(self, hold_id: int) -> bool:
        """The request never reached the provider: drop its hold, give back its rate."""
        self._rate_refund(hold_id, 0, False)
        return self.holds.release(hold_id)

    def fitting_max_tokens(
        self,
        rows: list[CounterStatus],
        model: str,
        input_tokens: int,
        max_output: int,
        now_us: int,
        units: dict[str, int] | None = None,
    ) -> int | None:
        """The largest max output tokens (below ``max_output``) with which this request
        would be admitted now by every enforce counter in ``rows`` (this replica's share,
        its holds included); None when not even 0 fits. Refusal path only: the worst case
        is linear in the output tokens but for its one rounding, so a guess from the
        slope is checked, then moved by single tokens (two or three price lookups, not a
        search: each costs microseconds)."""
        if not self._fits(rows, model, input_tokens, 0, now_us, units):
            return None
        if max_output <= 1:
            return 0
        share = self._replicas
        prices = self.state.prices
        at = from_micros(now_us)
        base = prices.worst_case_nanos(
            model, at=at, input_tokens=input_tokens, max_output_tokens=0, units=units
        )
        top = prices.worst_case_nanos(
            model, at=at, input_tokens=input_tokens, max_output_tokens=max_output, units=units
        )
        slope = (top - base) / max_output
        guess = max_output - 1
        for row in rows:
            plan = row.plan
            if not plan.holdable:
                continue
            lt = row.limit_tokens
            if lt is not None:
                room = (lt - row.spent_tokens) // share - row.held_tokens - input_tokens
                guess = min(guess, room)
            ln = row.limit_nanos
            if ln is not None and slope > 0:
                room_nanos = (ln - row.spent_nanos) / share - row.held_nanos - base
                guess = min(guess, int(room_nanos / slope))
        guess = max(0, guess)
        # fits(low), not fits(high): the request was refused at max_output
        if self._fits(rows, model, input_tokens, guess, now_us, units):
            if not self._fits(rows, model, input_tokens, guess + 1, now_us, units):
                return guess  # the common case: the guess was exact
            low, high = guess + 1, max_output
        else:
            if guess == 0 or self._fits(rows, model, input_tokens, guess - 1, now_us, units):
                return max(0, guess - 1)
            low, high = 0, guess - 1
        while high - low > 1:  # the guess was off by more than one token: search
            middle = (low + high) // 2
            if self._fits(rows, model, input_tokens, middle, now_us, units):
                low = middle
            else:
                high = middle
        return low

    def _fits(
        self,
        rows: list[CounterStatus],
        model: str,
        input_tokens: int,
        output: int,
        now_us: int,
        units: dict[str, int] | None = None,
    ) -> bool:
        share = self._replicas
        nanos = -1
        for row in rows:
            plan = row.plan
            if not plan.holdable:
                continue
            if row.state_i == EXCEEDED_I:
                return False
            lr = row.limit_requests
            if lr is not None and row.spent_requests + share * (row.held_requests + 1) > lr:
                return False
            lt = row.limit_tokens
            if (
                lt is not None
                and row.spent_tokens + share * (row.held_tokens + input_tokens + output) > lt
            ):
                return False
            ln = row.limit_nanos
            if ln is not None:
                if nanos < 0:
                    nanos = self.state.prices.worst_case_nanos(
                        model,
                        at=from_micros(now_us),
                        input_tokens=input_tokens,
                        max_output_tokens=output,
                        units=units,
                    )
                if row.spent_nanos + share * (row.held_nanos + nanos) > ln:
                    return False
        return True

    def _stale(self, ctx: Context, now_us: int, reserve: bool) -> Decision:
        """Verdicts not loaded or stale: fail_mode decides requests an enforce budget covers."""
        reason = self.stale_reason(now_us) or "stale"
        index = self.index
        hits = [(plan, cid) for plan in index.plans(ctx) for cid in plan.keys(ctx)]
        if reason != "not_ready" and not any([plan.enforce for plan, _ in hits]):
            return self._evaluate(ctx, now_us, reserve, True)  # warn budgets never block
        closed = self.config.fail_mode == "closed"
        state = FAILED_CLOSED_I if closed else FAILED_OPEN_I
        rows: list[CounterStatus] = []
        first = -1
        for plan, cid in hits:
            period, end_us = plan.current_period(now_us)
            if first < 0 and plan.enforce:
                first = len(rows)
            if reserve:
                plan.counts[state] += 1
            granted = self.state.raises.active(plan.budget_id, cid[1:], now_us)
            ln, lt, lr = (
                (plan.limit_nanos, plan.limit_tokens, plan.limit_requests)
                if granted is None
                else granted.limits(plan.limit_nanos, plan.limit_tokens, plan.limit_requests)
            )
            rows.append(
                CounterStatus(
                    plan, cid, period, end_us, None, 0, 0, 0, 0, 0, 0, state, ln, lt, lr, granted
                )
            )
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s (%s) for org %r", STATE_NAMES[state], reason, ctx.org_id)
        if closed:
            return Decision(
                ctx, FAILED_CLOSED, "failed_closed", rows, first, now_us, self.config, None, reason
            )
        return Decision(
            ctx, FAILED_OPEN, "failed_open", rows, -1, now_us, self.config, None, reason
        )

    # --- settle --------------------------------------------------------------------------
    def settle(self, hold_id: int, event: Mapping[str, Any]) -> bool:
        """The usage event of a held request was published: hold its actual cost instead."""
        hold = self.holds.get(hold_id)
        if hold is None:
            return False
        occurred = event["occurred_at"]
        tokens = {name: event.get(name, 0) for name in PRICED_TOKEN_FIELDS}
        price = self.state.prices.price(
            event["model"],
            at=occurred,
            units=event.get("units"),
            service_tier=event.get("service_tier"),
            **tokens,
        )
        counts = event.get("outcome", "allowed") in ("allowed", "failed_open")
        self._rate_refund(hold_id, billed_tokens(tokens), True)
        if not hold.counters:  # held for its rate limits only: nothing waits for a verdict
            self.holds.release(hold_id)
            return True
        verdicts = self.state.verdicts
        seqs = {}
        for totals in hold.counters:
            verdict = verdicts.get(totals.key[0])
            if verdict is not None:
                seqs[totals.key] = verdict.seq
        return self.holds.settle(
            hold_id,
            nanos=price.cost_nanos,
            tokens=billed_tokens(tokens),
            requests=1 if counts else 0,
            occurred_us=_micros(occurred),
            now_us=int(self.clock() * 1_000_000),
            seqs=seqs,
        )
