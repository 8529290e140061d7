"""Budgets: the policy model and which counters an event (or a request) belongs to.

Shared by the aggregator (which adds events to counters) and the enforcer
(which checks requests against the same counters), so that "how much is
used?" always reads the counters enforcement uses (docs/design.md invariant 5).

Scopes and the scope values that make one counter (all canonical ids):

=========  ==========================================  ===============================
scope      scope values                                note
=========  ==========================================  ===============================
secret     (org_id, secret_id)
org        (org_id,)                                   all of an org's secrets
project    (org_id, project_id)
grant      (org_id, grant_id)                          every permission row and
                                                       connector of the grant: one
group      (org_id, group)                             an event counts in each group
user       (org_id, user_id)
session    (org_id, identity, session_id)              the per-job ceiling; identity =
                                                       user_id, else secret_id
tag:<t>    (org_id, tags[t])
=========  ==========================================  ===============================

An event without the scope's attribute (no project_id for a project budget)
does not count in that budget. ``match`` filters on event attributes; every
pair must equal (or, given a list, be one of) the event's canonical values.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Final, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from schemas.errors import ConfigError, ContractError
from schemas.ids import canonical_id, counter_key
from schemas.money import nanos_to_usd, usd_to_nanos
from schemas.periods import WEEKDAYS, Window, parse_window, with_calendar
from schemas.usage import BUDGET_EXCEEDED, JOB_BUDGET_EXCEEDED

SCOPES: Final = ("secret", "org", "project", "grant", "group", "user", "session")
#: a session counter whose newest event is older than this is pruned (a job that stopped:
#: the counting stage's tombstone; ``spendbus verify`` expects none): seconds
SESSION_IDLE_SECONDS: Final = 86_400
#: seed 001: a job budget enabled without a number allows this many requests per job
DEFAULT_REQUESTS_PER_JOB: Final = 500
ACTIONS: Final = ("enforce", "warn")
#: what an enforce budget with a USD limit does with a request for a model without a price
#: (no entry and no fallback in the price table in force): refuse it, or admit it at $0
UNPRICED_REFUSE: Final = "refuse"
UNPRICED_ALLOW_FREE: Final = "allow_free"
UNPRICED_POLICIES: Final = (UNPRICED_REFUSE, UNPRICED_ALLOW_FREE)
#: attribute names a ``match`` may use, besides ``tag:<name>``
MATCH_ATTRIBUTES: Final = frozenset(
    {
        "org_id",
        "secret_id",
        "project_id",
        "grant_id",
        "permission_id",
        "user_id",
        "session_id",
        "group",
        "provider",
        "api",
        "model",
    }
)
#: the list-valued attribute a ``match`` on ``group`` tests membership in
_GROUPS: Final = "groups"


class Attributes(Protocol):
    """What a budget reads of an event (a dict) or a request context: ``get(name)``."""

    def get(self, name: str, /) -> Any: ...


def _values(attrs: Attributes, attribute: str) -> list[str]:
    """Canonical values of ``attribute`` in an event or request context (0, 1 or many)."""
    if attribute.startswith("tag:"):
        value = (attrs.get("tags") or {}).get(attribute[4:])
        raw: list[str] = [] if value is None else [value]
    elif attribute == "group":
        raw = list(attrs.get(_GROUPS) or ())
    else:
        value = attrs.get(attribute)
        raw = [] if value is None else [value]
    # a blank id is no id: it must not name a counter of its own
    return [v for v in (canonical_id(r, attribute) for r in raw) if v]


#: the rate windows a ``rate:`` may name, in seconds (YAML key suffix -> seconds)
RATE_WINDOWS: Final = {"second": 1, "minute": 60}


@dataclass(frozen=True, slots=True)
class RateLimit:
    """A budget's ``rate:`` (seed 001's ``throttled``; LiteLLM's rpm/tpm): requests and
    tokens per second and per minute, per counter of the budget. The enforcer keeps one
    token bucket per limit and counter, each replica its share (enforcer/README.md)."""

    requests_per_second: int | None = None
    requests_per_minute: int | None = None
    tokens_per_second: int | None = None
    tokens_per_minute: int | None = None

    def limits(self) -> list[tuple[str, int, int]]:
        """(unit ``requests``|``tokens``, count, window seconds) of every limit set."""
        out = []
        for unit in ("requests", "tokens"):
            for window, seconds in RATE_WINDOWS.items():
                count = getattr(self, f"{unit}_per_{window}")
                if count is not None:
                    out.append((unit, count, seconds))
        return out

    def to_record(self) -> dict[str, int | None]:
        return {
            "requests_per_second": self.requests_per_second,
            "requests_per_minute": self.requests_per_minute,
            "tokens_per_second": self.tokens_per_second,
            "tokens_per_minute": self.tokens_per_minute,
        }


@dataclass(frozen=True, slots=True)
class Budget:
    """One budget policy, parsed and validated (from YAML or from a BudgetPolicy record)."""

    budget_id: str
    scope: str
    window: Window
    action: str = "enforce"
    match: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    limit_nanos: int | None = None
    limit_tokens: int | None = None
    limit_requests: int | None = None
    alert_at: tuple[float, ...] = ()
    count_denied: bool = False
    rate: RateLimit | None = None
    #: UNPRICED_POLICIES, or None: the enforcer's default (``unpriced_models``)
    unpriced: str | None = None

    @property
    def counting_fingerprint(self) -> str:
        """What decides which events this budget counts and in which period (not its
        limits, alerts or action), hashed: a worker tells by it whether it counted a budget's
        current period from its start (aggregator/counting/backfill.py), and `budgets apply`
        whether the workers did."""
        window = self.window
        described = [
            self.scope,
            sorted((k, sorted(v)) for k, v in self.match.items()),
            window.spec,
            sorted(window.calendar.items()),
            self.count_denied,
        ]
        return hashlib.sha256(json.dumps(described).encode()).hexdigest()[:16]

    @property
    def refusal(self) -> str:
        """The decision value a refusal by this budget carries."""
        return JOB_BUDGET_EXCEEDED if self.scope == "session" else BUDGET_EXCEEDED

    def matches(self, attrs: Attributes) -> bool:
        for attribute, allowed in self.match.items():
            if not any(v in allowed for v in _values(attrs, attribute)):
                return False
        return True

    def scope_values(self, attrs: Attributes) -> list[tuple[str, ...]]:
        """The scope values of every counter of this budget that ``attrs`` counts in."""
        orgs = _values(attrs, "org_id")
        if not orgs or not self.matches(attrs):
            return []
        org = orgs[0]
        scope = self.scope
        if scope == "org":
            return [(org,)]
        if scope == "session":
            sessions = _values(attrs, "session_id")
            identity = _values(attrs, "user_id") or _values(attrs, "secret_id")
            if not sessions or not identity:
                return []
            return [(org, identity[0], sessions[0])]
        attribute = {
            "secret": "secret_id",
            "project": "project_id",
            "grant": "grant_id",
            "group": "group",
            "user": "user_id",
        }.get(scope, scope)  # tag:<name> is its own attribute
        return [(org, value) for value in dict.fromkeys(_values(attrs, attribute))]

    def counter_keys(self, attrs: Attributes) -> list[tuple[str, tuple[str, ...]]]:
        """(counter key, scope values) for every counter ``attrs`` counts in."""
        return [
            (counter_key(self.budget_id, values), values) for values in self.scope_values(attrs)
        ]

    # --- the BudgetPolicy record (topic budget.policies) -------------------------------
    def to_record(self, applied_at: datetime | None = None) -> dict[str, Any]:
        return {
            "budget_id": self.budget_id,
            "scope": self.scope,
            "match": {k: "\x1f".join(v) for k, v in self.match.items()},
            "window": self.window.spec,
            "limit_nanos": self.limit_nanos,
            "limit_tokens": self.limit_tokens,
            "limit_requests": self.limit_requests,
            "action": self.action,
            "alert_at": list(self.alert_at),
            "count_denied": self.count_denied,
            "rate": None if self.rate is None else self.rate.to_record(),
            "timezone": self.window.timezone,
            "week_start": WEEKDAYS[self.window.week_start],
            "month_start_day": self.window.month_start_day,
            "unpriced": self.unpriced,
            "applied_at": applied_at or datetime.now(UTC),
        }

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Budget:
        return cls(
            budget_id=record["budget_id"],
            scope=record["scope"],
            # the calendar is absent from a v1/v2 record decoded without resolution: UTC
            window=with_calendar(
                parse_window(record["window"]),
                record.get("timezone"),
                record.get("week_start"),
                record.get("month_start_day"),
            ),
            action=record["action"],
            # a list-valued match travels as one string joined by the unit separator
            match={k: tuple(v.split("\x1f")) for k, v in record["match"].items()},
            limit_nanos=record["limit_nanos"],
            limit_tokens=record["limit_tokens"],
            limit_requests=record["limit_requests"],
            alert_at=tuple(record["alert_at"]),
            count_denied=record["count_denied"],
            # absent from a v1 record (decoded without resolution, e.g. by hand)
            rate=None if record.get("rate") is None else RateLimit(**record["rate"]),
            # absent from v1/v2 records decoded without resolution
            unpriced=record.get("unpriced"),
        )


class _RateSpec(BaseModel):
    """The YAML form of ``rate:``."""

    model_config = ConfigDict(extra="forbid")

    requests_per_second: int | None = Field(default=None, ge=1)
    requests_per_minute: int | None = Field(default=None, ge=1)
    tokens_per_second: int | None = Field(default=None, ge=1)
    tokens_per_minute: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _some(self) -> _RateSpec:
        if not RateLimit(**self.model_dump()).limits():
            raise ValueError(
                "needs at least one of requests_per_second, requests_per_minute, "
                "tokens_per_second, tokens_per_minute"
            )
        return self


class _JobBudgetSpec(BaseModel):
    """Seed 001's per-job ceiling: ``job_budget: true`` or ``{requests_per_job: N}``."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    requests_per_job: int = Field(default=DEFAULT_REQUESTS_PER_JOB, ge=1)


class _BudgetSpec(BaseModel):
    """The YAML form of a budget (README.md, "Using it")."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    id: str = Field(min_length=1, max_length=200)
    scope: str
    match: dict[str, str | list[str]] = Field(default_factory=dict)
    #: optional for a budget with only a ``rate`` (its counters then never reset)
    window: str = "total"
    limit_usd: Decimal | str | None = None
    limit_tokens: int | None = Field(default=None, ge=1)
    limit_requests: int | None = Field(default=None, ge=1)
    action: str = "enforce"
    alert_at: list[float] = Field(default_factory=list)
    count_denied: bool = False
    rate: _RateSpec | None = None
    #: the calendar of a day/week/month window (periods, reset_at); UTC by default
    timezone: str | None = None
    week_start: str | None = None
    month_start_day: int | None = None
    unpriced: str | None = None

    @field_validator("unpriced")
    @classmethod
    def _unpriced(cls, value: str | None) -> str | None:
        if value is not None and value not in UNPRICED_POLICIES:
            raise ValueError(f"must be one of {', '.join(UNPRICED_POLICIES)}, got {value!r}")
        return value

    @field_validator("scope")
    @classmethod
    def _scope(cls, value: str) -> str:
        if value in SCOPES or (value.startswith("tag:") and len(value) > 4):
            return value
        raise ValueError(f"must be one of {', '.join(SCOPES)} or tag:<name>, got {value!r}")

    @field_validator("action")
    @classmethod
    def _action(cls, value: str) -> str:
        if value not in ACTIONS:
            raise ValueError(f"must be enforce or warn, got {value!r}")
        return value

    @field_validator("window")
    @classmethod
    def _window(cls, value: str) -> str:
        try:
            parse_window(value)
        except ContractError as exc:
            raise ValueError(str(exc)) from None
        return value

    @model_validator(mode="after")
    def _calendar(self) -> _BudgetSpec:
        try:
            with_calendar(
                parse_window(self.window), self.timezone, self.week_start, self.month_start_day
            )
        except ContractError as exc:
            raise ValueError(str(exc)) from None
        return self

    @field_validator("match")
    @classmethod
    def _match(cls, value: dict[str, str | list[str]]) -> dict[str, str | list[str]]:
        for attribute in value:
            if attribute not in MATCH_ATTRIBUTES and not attribute.startswith("tag:"):
                raise ValueError(
                    f"cannot match on {attribute!r}; use one of "
                    f"{', '.join(sorted(MATCH_ATTRIBUTES))} or tag:<name>"
                )
        return value

    @field_validator("alert_at")
    @classmethod
    def _alert_at(cls, value: list[float]) -> list[float]:
        for threshold in value:
            if not 0 < threshold <= 1:
                raise ValueError(f"thresholds are fractions in (0, 1], got {threshold}")
        return sorted(set(value))

    @field_validator("limit_usd", mode="before")
    @classmethod
    def _limit_usd(cls, value: Any) -> Any:
        if isinstance(value, float):
            raise ValueError('give USD as a string ("500") or an integer, not a float')
        return value

    @model_validator(mode="after")
    def _some_limit(self) -> _BudgetSpec:
        if (
            self.limit_usd is None
            and self.limit_tokens is None
            and self.limit_requests is None
            and self.rate is None
        ):
            raise ValueError("needs at least one of limit_usd, limit_tokens, limit_requests, rate")
        if self.unpriced is not None and (self.limit_usd is None or self.action != "enforce"):
            raise ValueError(
                "unpriced: only an enforce budget with limit_usd prices requests (give "
                "limit_usd, or drop unpriced)"
            )
        return self


def budget_from_yaml(item: Any, *, source: str = "<budgets>", index: int = 0) -> Budget:
    """Validate one YAML budget; errors name the file, the budget and the field (the first
    error found is raised: `parse_budgets_yaml` lists them all)."""
    budget, errors = _parse_budget(item, source, index)
    if budget is None:
        raise ConfigError(errors[0])
    return budget


def parse_budget(item: Any, *, source: str = "<budget>") -> tuple[Budget | None, list[str]]:
    """One budget in its YAML form (a mapping; the admin API's JSON is the same), or None
    and every error found in it, each naming the field."""
    return _parse_budget(item, source, 0)


def budget_fields(budget: Budget) -> dict[str, Any]:
    """``budget`` in its YAML form: what :func:`parse_budget` reads back to the same budget
    (the optional fields at their defaults left out)."""
    fields: dict[str, Any] = {
        "id": budget.budget_id,
        "scope": budget.scope,
        "window": budget.window.spec,
        "action": budget.action,
    }
    if budget.match:
        fields["match"] = {k: v[0] if len(v) == 1 else list(v) for k, v in budget.match.items()}
    if budget.limit_nanos is not None:
        fields["limit_usd"] = format(nanos_to_usd(budget.limit_nanos).normalize(), "f")
    if budget.limit_tokens is not None:
        fields["limit_tokens"] = budget.limit_tokens
    if budget.limit_requests is not None:
        fields["limit_requests"] = budget.limit_requests
    if budget.alert_at:
        fields["alert_at"] = list(budget.alert_at)
    if budget.count_denied:
        fields["count_denied"] = True
    if budget.rate is not None:
        fields["rate"] = {k: v for k, v in budget.rate.to_record().items() if v is not None}
    fields.update(budget.window.calendar)
    if budget.unpriced is not None:
        fields["unpriced"] = budget.unpriced
    return fields


def _field_errors(where: str, exc: ValidationError, prefix: tuple[str, ...] = ()) -> list[str]:
    """One message per error pydantic found (it checks every field, not only the first)."""
    errors = []
    for error in exc.errors():
        path = ".".join([*prefix, *(str(p) for p in error["loc"])]) or "<budget>"
        message = error["msg"].removeprefix("Value error, ")
        errors.append(f"{where}: field {path!r}: {message}")
    return errors


def _limit_nanos(where: str, value: Any) -> tuple[int | None, list[str]]:
    """``limit_usd`` in nanos, or the error naming it."""
    if value is None:
        return None, []
    try:
        nanos = usd_to_nanos(value)
    except ContractError as exc:
        return None, [f"{where}: field 'limit_usd': {exc}"]
    if nanos <= 0:
        return None, [f"{where}: field 'limit_usd': must be > 0"]
    return nanos, []


def _parse_budget(item: Any, source: str, index: int) -> tuple[Budget | None, list[str]]:
    """The budget, or None and every error found in it (at least one)."""
    name = item.get("id", f"#{index + 1}") if isinstance(item, dict) else f"#{index + 1}"
    where = f"{source}: budget {name!r}"
    if not isinstance(item, dict):
        return None, [f"{where}: each budget must be a mapping"]
    try:
        expanded = _expand_job_budget(item)
    except ValidationError as exc:
        return None, _field_errors(where, exc, ("job_budget",))
    except ValueError as exc:
        return None, [f"{where}: field 'job_budget': {exc}"]
    try:
        spec = _BudgetSpec.model_validate(expanded)
    except ValidationError as exc:
        errors = _field_errors(where, exc)
        # the spec accepts any string as limit_usd: its amount is read after, so read it
        # here too, or a bad amount would be named only once the other fields are fixed
        raw_limit = expanded.get("limit_usd")
        if isinstance(raw_limit, str | int) and not any("'limit_usd'" in e for e in errors):
            errors.extend(_limit_nanos(where, raw_limit)[1])
        return None, errors
    limit_nanos, errors = _limit_nanos(where, spec.limit_usd)
    if errors:
        return None, errors
    budget = Budget(
        budget_id=spec.id,
        scope=spec.scope,
        window=with_calendar(
            parse_window(spec.window), spec.timezone, spec.week_start, spec.month_start_day
        ),
        action=spec.action,
        match={
            k: tuple(canonical_id(x, k) for x in ([v] if isinstance(v, str) else v))
            for k, v in spec.match.items()
        },
        limit_nanos=limit_nanos,
        limit_tokens=spec.limit_tokens,
        limit_requests=spec.limit_requests,
        alert_at=tuple(spec.alert_at),
        count_denied=spec.count_denied,
        rate=None if spec.rate is None else RateLimit(**spec.rate.model_dump()),
        unpriced=spec.unpriced,
    )
    return budget, []


def _expand_job_budget(item: dict[str, Any]) -> dict[str, Any]:
    """Seed 001's shorthand: ``job_budget: true`` (or ``{requests_per_job: N}``) is a
    per-job ceiling of N requests (500 when no number is given), i.e. ``scope: session``,
    ``window: total``, ``limit_requests: N``; ``job_budget: false`` (the feature flag
    off) is the same budget, warning instead of refusing. Given together with any of
    those fields it is refused (two ways to say one thing)."""
    if "job_budget" not in item:
        return item
    raw = item["job_budget"]
    spec = _JobBudgetSpec.model_validate({"enabled": raw} if isinstance(raw, bool) else raw)
    clash = [k for k in ("scope", "window", "limit_requests") if k in item]
    if clash:
        raise ValueError(f"job_budget sets {', '.join(clash)}: give one or the other")
    expanded = {k: v for k, v in item.items() if k != "job_budget"}
    expanded.update(scope="session", window="total", limit_requests=spec.requests_per_job)
    if not spec.enabled:
        expanded.setdefault("action", "warn")
    return expanded


def budgets_from_yaml(items: Any, *, source: str = "<budgets>") -> list[Budget]:
    """A YAML budgets document (a list of budgets); ids must be unique. Raises the first
    error `parse_budgets_yaml` lists (`budgets apply` stops there)."""
    budgets, errors = parse_budgets_yaml(items, source=source)
    if errors:
        raise ConfigError(errors[0])
    return budgets


def parse_budgets_yaml(items: Any, *, source: str = "<budgets>") -> tuple[list[Budget], list[str]]:
    """Every valid budget of a YAML budgets document, and every error of the document
    (each naming the file, the budget and the field), so that one run lists them all:
    each budget's own errors in file order, then the ids defined twice."""
    if not isinstance(items, list):
        return [], [f"{source}: expected a list of budgets"]
    budgets: list[Budget] = []
    errors: list[str] = []
    for i, item in enumerate(items):
        budget, found = _parse_budget(item, source, i)
        errors.extend(found)
        if budget is not None:
            budgets.append(budget)
    seen: set[str] = set()
    for budget in budgets:
        if budget.budget_id in seen:
            errors.append(f"{source}: budget {budget.budget_id!r}: field 'id': defined twice")
        seen.add(budget.budget_id)
    return budgets, errors


def applicable(
    budgets: Iterable[Budget], attrs: Attributes
) -> list[tuple[Budget, str, tuple[str, ...]]]:
    """Every (budget, counter key, scope values) that ``attrs`` counts in."""
    return [(b, key, values) for b in budgets for key, values in b.counter_keys(attrs)]
