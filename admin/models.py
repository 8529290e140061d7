"""The JSON bodies the admin API takes, as pydantic models: the handlers validate with them
and the OpenAPI document is written from them (admin/openapi.py). A budget's body is its
YAML form, validated by schemas/budgets.py itself (``BudgetBody`` documents it)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from schemas.ids import MAX_ID_LENGTH

_ID = Field(min_length=1, max_length=MAX_ID_LENGTH)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


class BudgetBody(_Body):
    """A budget as its YAML file gives it (README.md, "Using it")."""

    id: str = Field(min_length=1, max_length=200)
    scope: str
    match: dict[str, str | list[str]] = Field(default_factory=dict)
    window: str = "total"
    limit_usd: str | int | None = None
    limit_tokens: int | None = Field(default=None, ge=1)
    limit_requests: int | None = Field(default=None, ge=1)
    action: str = "enforce"
    alert_at: list[float] = Field(default_factory=list)
    count_denied: bool = False
    rate: dict[str, int] | None = None
    timezone: str | None = None
    week_start: str | None = None
    month_start_day: int | None = None
    unpriced: str | None = None
    job_budget: bool | dict[str, int] | None = None


class KeyBody(_Body):
    """A virtual key to mint: its name and principal (the ids its usage events carry)."""

    name: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9._@-]+$")
    #: the org the key spends for: an org-scoped token's own when left out
    org_id: str | None = Field(default=None, min_length=1, max_length=MAX_ID_LENGTH)
    secret_id: str = _ID
    project_id: str | None = Field(default=None, min_length=1, max_length=MAX_ID_LENGTH)
    grant_id: str | None = Field(default=None, min_length=1, max_length=MAX_ID_LENGTH)
    user_id: str | None = Field(default=None, min_length=1, max_length=MAX_ID_LENGTH)
    groups: list[str] = Field(default_factory=list, max_length=100)
    tags: dict[str, str] = Field(default_factory=dict, max_length=100)

    @field_validator("groups")
    @classmethod
    def _groups(cls, value: list[str]) -> list[str]:
        for group in value:
            if not group.strip() or len(group) > MAX_ID_LENGTH:
                raise ValueError(f"a group must be 1-{MAX_ID_LENGTH} characters, not blank")
        return value


class RaiseBody(_Body):
    """A temporary raise of a budget's limits (``spendbus budgets raise``)."""

    budget_id: str = Field(min_length=1, max_length=200)
    #: one counter (as ``spendbus usage`` names it: ORG or ORG/ID); else every counter
    scope: str | None = Field(default=None, min_length=1, max_length=2 * MAX_ID_LENGTH)
    by_usd: Decimal | None = Field(default=None, gt=0, max_digits=20, decimal_places=9)
    to_usd: Decimal | None = Field(default=None, gt=0, max_digits=20, decimal_places=9)
    tokens: int | None = Field(default=None, ge=1, le=2**62)
    requests: int | None = Field(default=None, ge=1, le=2**62)
    #: an ISO 8601 time with its zone, or a duration from now (90s, 30m, 6h, 2d)
    until: str = Field(min_length=1, max_length=64)
    reason: str = Field(min_length=1, max_length=1000)


# --- answers ----------------------------------------------------------------------------
class ErrorAnswer(BaseModel):
    """Every refusal: what is wrong, and the field when one is to blame."""

    error: str
    field: str | None = None


class KeyView(BaseModel):
    """A live key as listed: its id is its keyed digest; the key itself is never stored."""

    key_id: str
    name: str
    org_id: str
    secret_id: str
    project_id: str | None
    grant_id: str | None
    user_id: str | None
    groups: list[str]
    tags: dict[str, str]
    applied_at: str


class MintedKey(KeyView):
    """A key just minted or rotated: ``key`` is shown this once."""

    key: str


class RaiseView(BaseModel):
    raise_id: str
    budget_id: str
    scope: str | None
    mode: str
    raise_nanos: int | None
    raise_tokens: int | None
    raise_requests: int | None
    starts_at: str
    until: str
    revoked_at: str | None
    reason: str
    created_by: str
    status: str


class AuditEntry(BaseModel):
    """One change made through the API: who, what (before and after), when, from where."""

    audit_id: str
    at: str
    token_id: str
    role: str
    remote: str
    action: str
    resource: str
    resource_id: str
    org_id: str | None
    before: dict[str, Any] | None
    after: dict[str, Any] | None


class Forecast(BaseModel):
    #: the trailing burn per hour ({nanos, tokens, requests}); null without one
    burn_per_hour: dict[str, int] | None
    #: when the counter runs out at that burn, if before its period resets
    exhausts_at: str | None


class CounterView(BaseModel):
    """One counter of a budget, as the enforcers check it: spend, limits (raised while a
    raise is in force), what remains, the period and when it resets, the forecast."""

    budget_id: str
    scope: str
    scope_values: list[str]
    period: str
    state: str
    action: str
    spent_nanos: int
    spent_tokens: int
    spent_requests: int
    limit_nanos: int | None
    limit_tokens: int | None
    limit_requests: int | None
    remaining_nanos: int | None
    remaining_tokens: int | None
    remaining_requests: int | None
    #: the raise in force ({raise_id, mode, raise_nanos, ..., until, reason})
    raise_: dict[str, Any] | None = Field(alias="raise")
    reset_at: str | None
    forecast: Forecast
    as_of: str | None


class CounterList(BaseModel):
    counters: list[CounterView]


class SpendRow(BaseModel):
    #: the period's first day (YYYY-MM-DD; a week starts on Monday)
    period: str
    org_id: str
    #: the group's value: a project, secret, user, model or tag value ('' when absent)
    key: str
    events: int
    cost_nanos: int
    cost_usd: str
    billed_tokens: int


class SpendReport(BaseModel):
    """One page of spend by period and group (query: by=day|week|month, group=org|project|
    secret|user|model|tag:<name>, from and to as YYYY-MM-DD, org_id for a platform admin,
    limit rows a page, cursor: the previous page's next_cursor). Rows are in (period,
    org_id, key) order; the totals are this page's."""

    by: str
    group: str
    rows: list[SpendRow]
    total_cost_nanos: int
    total_events: int
    #: the next page's cursor; null on the last page
    next_cursor: str | None


class DeliveryView(BaseModel):
    """One webhook's finished delivery of an alert (never its URL or secret)."""

    webhook: str
    #: delivered (a 2xx) or failed (given up)
    status: str
    attempts: int
    http_status: int | None
    #: the last error ('' when delivered)
    error: str
    finished_at: str | None


class AlertView(BaseModel):
    """A budget alert as ``spendbus notify`` sends it, with its finished deliveries (a
    webhook still trying, or one that has not started, has none yet)."""

    alert_id: str
    #: threshold, unpriced_model or forecast
    kind: str
    budget_id: str
    scope_values: list[str]
    period: str
    threshold: float
    state: str
    spent_nanos: int
    spent_tokens: int
    spent_requests: int
    limit_nanos: int | None
    limit_tokens: int | None
    limit_requests: int | None
    model: str | None
    as_of: str | None
    exhausts_at: str | None
    deliveries: list[DeliveryView]


class AlertList(BaseModel):
    alerts: list[AlertView]


class DeadLetterReason(BaseModel):
    """The dead letters of one reason: how many, the stages that refused them, and the
    newest one's time and detail (it names the field at fault)."""

    reason: str
    count: int
    stages: list[str]
    last_failed_at: str | None
    last_detail: str


class DeadLetterList(BaseModel):
    #: every letter the caller sees
    total: int
    #: false for an org-scoped caller: letters whose bytes do not read carry no org
    #: and are counted for a platform-admin only
    includes_unattributed: bool
    reasons: list[DeadLetterReason]


class BudgetList(BaseModel):
    budgets: list[BudgetBody]


class KeyList(BaseModel):
    keys: list[KeyView]


class RaiseList(BaseModel):
    raises: list[RaiseView]


class AuditList(BaseModel):
    entries: list[AuditEntry]


class Deleted(BaseModel):
    deleted: str


class Revoked(BaseModel):
    revoked: str
