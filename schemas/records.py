"""The Avro records as TypedDicts, generated from ``schemas/avro/*.avsc`` by
``python -m schemas.recordgen schemas/records.py``: do not edit.

Each is a record as ``schemas.codec`` decodes it: every field present, a
``timestamp-micros`` field as an aware UTC datetime, an enum as its symbol, a union with
null as ``X | None``. The encoders take the same shape (and timestamps as integer
microseconds too).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal, TypedDict

UsageSource = Literal["reported", "estimated", "none"]


Outcome = Literal["allowed", "refused", "failed_open", "failed_closed"]


class UsageEvent(TypedDict):
    """One upstream LLM call (or one refused admission), as the proxy saw it. Topic usage.raw, key
    org_id. Token fields are normalised: see docs/design.md, 'Normalised usage'.
    """

    #: Assigned once when the event is created; kept across every retry.
    event_id: str
    #: Event time (UTC). Windows and prices follow it.
    occurred_at: datetime
    #: anthropic | openai | gemini | bedrock | ...
    provider: str
    #: Wire format: anthropic-messages | openai-chat | openai-responses | gemini | bedrock-converse
    #: | openai-realtime | ...
    api: str
    model: str
    #: The upstream credential used (verified by the proxy).
    secret_id: str
    org_id: str
    project_id: str | None
    grant_id: str | None
    permission_id: str | None
    user_id: str | None
    groups: list[str]
    session_id: str | None
    tags: dict[str, str]
    #: Input read at the full price: excludes cache reads and writes.
    input_tokens: int
    cache_read_tokens: int
    #: All cache writes, every TTL.
    cache_write_tokens: int
    #: The part of cache_write_tokens written with a 1-hour TTL.
    cache_write_1h_tokens: int
    #: All billed output, reasoning included.
    output_tokens: int
    #: The part of output_tokens spent on reasoning.
    reasoning_tokens: int
    usage_source: UsageSource
    estimate_reason: str | None
    #: What the enforcer decided for this request.
    outcome: Outcome
    #: allowed | budget_exceeded | job_budget_exceeded | in_flight_budget_exceeded | throttled |
    #: failed_open | failed_closed
    decision: str
    #: The budget that refused (or warned), if any.
    decision_budget_id: str | None
    #: HTTP status returned to the client.
    status_code: int
    stream: bool
    #: Which proxy instance saw the call.
    gateway_id: str
    #: The provider's request/response id, for support tickets.
    request_id: str | None
    latency_ms: int | None
    #: v2: billed units beyond tokens by unit name (schemas/billed_units.py), e.g. web_search: 3.
    #: Empty for events written before v2.
    units: dict[str, int]
    #: v2: the service tier the provider says served the call (standard | priority | batch | default
    #: | flex | ...), as it says it; null when it does not say.
    service_tier: str | None
    #: v3: the event_id of the call this event is a further charge of, billed apart at its own model
    #: (an Anthropic declined fallback hop that had written output); such an event counts no request
    #: of its own. Null for the call itself and for events written before v3.
    charge_of: str | None


BudgetAction = Literal["enforce", "warn"]


class RateLimit(TypedDict):
    """Requests and tokens per second and per minute, per counter; the enforcer's token buckets
    (each replica its share).
    """

    requests_per_second: int | None
    requests_per_minute: int | None
    tokens_per_second: int | None
    tokens_per_minute: int | None


UnpricedModels = Literal["refuse", "allow_free"]


class BudgetPolicy(TypedDict):
    """One budget. Topic budget.policies (compacted), key budget_id; a null value deletes the
    budget.
    """

    budget_id: str
    #: secret | org | project | grant | user | group | session | tag:<name>
    scope: str
    #: Filter on event attributes; every pair must equal the event's canonical value.
    match: dict[str, str]
    #: day | week | month | total | rolling:<duration>
    window: str
    limit_nanos: int | None
    limit_tokens: int | None
    limit_requests: int | None
    action: BudgetAction
    alert_at: list[float]
    count_denied: bool
    #: The budget's rate limits (null: none).
    rate: RateLimit | None
    #: IANA zone the day/week/month periods follow (schemas/periods.py).
    timezone: str
    #: A week window's first day: monday ... sunday.
    week_start: str
    #: A month window's billing-cycle day, 1-28.
    month_start_day: int
    #: What an enforce budget with a USD limit does with a request for a model no price entry (nor
    #: the price table's fallback) prices: refuse it, or admit it at $0. Null: the enforcer's
    #: default (unpriced_models, refuse unless configured).
    unpriced: UnpricedModels | None
    applied_at: datetime


CounterState = Literal["ok", "alert", "exceeded"]


class Verdict(TypedDict):
    """The live state of one budget counter, with its forecast (v2) and, for a rolling window, its
    buckets in the window (v3). Topic budget.verdicts (compacted), key counter_key. The enforcers'
    whole state.
    """

    counter_key: str
    budget_id: str
    scope: str
    scope_values: list[str]
    #: d:YYYY-MM-DD | w:YYYY-Www | m:YYYY-MM | t | r:<duration>
    period: str
    state: CounterState
    spent_nanos: int
    spent_tokens: int
    spent_requests: int
    limit_nanos: int | None
    limit_tokens: int | None
    limit_requests: int | None
    action: BudgetAction
    #: The decision value a refusal by this counter carries: budget_exceeded | job_budget_exceeded.
    refusal: str
    #: When the period ends; null for total.
    reset_at: datetime | None
    #: Event time of the last event applied.
    as_of: datetime
    #: Per-counter sequence number; enforcers ignore a lower one.
    seq: int
    #: Processing time, for staleness and latency.
    emitted_at: datetime
    #: v2: spend in the trailing window (schemas/forecast.py: the last 12 five-minute buckets up to
    #: as_of, within the period); null for a rolling window and in v1 records.
    burn_nanos: int | None
    #: v2: tokens in the trailing window.
    burn_tokens: int | None
    #: v2: requests in the trailing window.
    burn_requests: int | None
    #: v2: the time the trailing window covers, in microseconds (at least one bucket).
    burn_span_us: int | None
    #: v2: when the first limit runs out at that burn; null when none would, when one has already,
    #: and for a rolling window.
    exhausts_at: datetime | None
    #: v3, rolling windows only (else empty): each bucket with spend still in the window at as_of,
    #: as how many buckets (of duration / 48) it lies before as_of's bucket, 0 to 47; a bucket of
    #: age a leaves the window 48 - a buckets after the start of as_of's bucket (schemas/periods.py
    #: rolling_leaves_at). Parallel to bucket_nanos, bucket_tokens and bucket_requests, whose sums
    #: are the spent_* fields; empty in v1 and v2 records.
    bucket_ages: list[int]
    #: v3: each bucket's spend in nano-dollars (parallel to bucket_ages).
    bucket_nanos: list[int]
    #: v3: each bucket's billed tokens (parallel to bucket_ages).
    bucket_tokens: list[int]
    #: v3: each bucket's requests (parallel to bucket_ages).
    bucket_requests: list[int]


class CounterCount(TypedDict):
    """A CounterCount record."""

    counter_key: str
    budget_id: str
    scope_values: list[str]
    #: day | week | month | total | rolling:<dur>
    window: str
    #: The period key (schemas/periods.py) of occurred_at.
    period: str
    #: Rolling windows: occurred_at's bucket index (width = duration / 48); 0 otherwise.
    bucket: int
    #: 1 when the event counts as a request in this budget, else 0.
    requests: int
    limit_nanos: int | None
    limit_tokens: int | None
    limit_requests: int | None
    alert_at: list[float]


class PricedUsage(TypedDict):
    """A UsageEvent after pricing, as the aggregator charged it. Topic usage.priced, key org_id.
    Feeds ClickHouse.
    """

    event: UsageEvent
    #: Exact cost in nano-dollars, rounded once per event, ties to even.
    cost_nanos: int
    price_version: str | None
    #: The model prefix that matched; null when unpriced.
    price_match: str | None
    unpriced: bool
    #: usage.raw partition the event was read from.
    source_partition: int
    #: usage.raw offset: with source_partition, the idempotency key of every sink.
    source_offset: int
    priced_at: datetime
    #: Every budget counter the event counts in, with its period and the policy in force: ClickHouse
    #: sums these into the exact budget history (infra/clickhouse/README.md). Empty for records
    #: written before v2.
    counts: list[CounterCount]


class LongContextTier(TypedDict):
    """A LongContextTier record."""

    above_input_tokens: int
    input_per_mtok: str
    output_per_mtok: str


class ModelPrice(TypedDict):
    """A ModelPrice record."""

    #: Model id prefix; the longest matching prefix wins.
    match: str
    input_per_mtok: str
    output_per_mtok: str
    cache_read_per_mtok: str | None
    cache_write_per_mtok: str | None
    cache_write_1h_per_mtok: str | None
    long_context: LongContextTier | None
    #: v2: decimal USD per billed unit (schemas/billed_units.py), e.g. web_search: 0.01.
    unit_prices: dict[str, str]
    #: v2: decimal multiplier of every token price when the response names the tier (batch: 0.5);
    #: other tiers pay the base prices.
    service_tiers: dict[str, str]
    #: v3: per tier, the decimal USD per million tokens of each token class (input_per_mtok,
    #: cache_read_per_mtok, cache_write_per_mtok, cache_write_1h_per_mtok, output_per_mtok) the tier
    #: bills apart from its multiplier (batch: {cache_read_per_mtok: 0.13}); above the long-context
    #: edge such a rate scales as its base price does, unless the tier names its rate there as
    #: long_context_ + the class (batch: {long_context_cache_read_per_mtok: 0.25}).
    service_tier_rates: dict[str, dict[str, str]]


class PriceTable(TypedDict):
    """One price version. Topic pricing (compacted), key version. Prices are decimal USD per million
    tokens, kept as strings so they stay exact.
    """

    version: str
    effective_from: datetime
    models: list[ModelPrice]
    #: Charged for models no prefix matches; null = unpriced (charged 0 and flagged).
    fallback: ModelPrice | None


class Alert(TypedDict):
    """A threshold crossing: exactly one per (counter, period, threshold). Topic budget.alerts, key
    counter_key. Also unpriced-model alerts, once per model, and (v2) forecast alerts, once per
    (counter, period).
    """

    #: Deterministic: counter_key|period|threshold (or unpriced|model, forecast|counter_key|period).
    alert_id: str
    #: threshold | unpriced_model | forecast
    kind: str
    counter_key: str
    budget_id: str
    period: str
    threshold: float
    state: CounterState
    spent_nanos: int
    spent_tokens: int
    spent_requests: int
    limit_nanos: int | None
    limit_tokens: int | None
    limit_requests: int | None
    model: str | None
    as_of: datetime
    #: v2, forecast alerts: when the counter's first limit runs out at its trailing-window burn
    #: (schemas/forecast.py), before its period ends.
    exhausts_at: datetime | None


class DeadLetter(TypedDict):
    """What could not be read or priced, with the original bytes and the reason. Topic usage.dlq.
    Nothing is dropped silently.
    """

    #: Machine-readable reason code: bad_magic | unknown_fingerprint | malformed | wrong_schema |
    #: invalid_field | ...
    reason: str
    #: Human-readable explanation naming the field.
    detail: str
    #: Which stage refused it: aggregator | ingest-http | ...
    stage: str
    source_topic: str
    source_partition: int
    source_offset: int
    key: bytes | None
    value: bytes | None
    failed_at: datetime


class VirtualKey(TypedDict):
    """One virtual key of the gateways. Topic gateway.keys (compacted), key = SHA-256 hex of the
    virtual key (never the key itself); a null value revokes the key. The fields are a gateway
    config file's key entry: its name and its principal.
    """

    #: For logs, metrics and automatic session ids; unique among live keys.
    name: str
    org_id: str
    #: The upstream credential used (a secret of the gateway's config).
    secret_id: str
    project_id: str | None
    grant_id: str | None
    user_id: str | None
    groups: list[str]
    tags: dict[str, str]
    applied_at: datetime


class GenerationSwitch(TypedDict):
    """Which generation of derived topics (verdicts, priced usage, alerts) is current. Topic
    spendbus.generations (compacted), key 'current'. See docs/replay.md.
    """

    #: The current generation ('' = the default one).
    generation: str
    #: The generation it replaced.
    previous: str
    #: The previous generation's workers are stopped: it writes nothing any more.
    previous_retired: bool
    switched_at: datetime


RaiseMode = Literal["by", "to"]


class BudgetRaise(TypedDict):
    """A temporary raise of a budget's limits (spendbus budgets raise). Topic budget.raises
    (compacted), key raise_id; a revocation rewrites the record with revoked_at, so the topic keeps
    every raise.
    """

    raise_id: str
    budget_id: str
    #: The counter raised (its scope values, org first); empty: every counter of the budget.
    scope_values: list[str]
    #: by: added to the base limit; to: the limit while the raise lasts.
    mode: RaiseMode
    raise_nanos: int | None
    raise_tokens: int | None
    raise_requests: int | None
    starts_at: datetime
    until: datetime
    reason: str
    created_by: str
    revoked_at: datetime | None


JobApprovalKind = Literal["request", "approve", "deny"]


class JobApproval(TypedDict):
    """One step of a job's approval (seed 001): an enforcer's request when its policy answered
    approval, or an operator's decision (spendbus approvals approve|deny). Topic budget.approvals
    (delete, kept forever: the audit trail), key job_key.
    """

    #: The job's opaque one-way key (schemas/jobs.py: a keyed hash of org, identity and session).
    job_key: str
    kind: JobApprovalKind
    at: datetime
    #: Who: the enforcer's gateway_id for a request, the operator for a decision.
    by: str
    org_id: str
    #: The user id, else the secret id (the session budget's identity).
    identity: str
    session_id: str
    #: The session budget refusing the job when the request was made (the one an approval raises).
    budget_id: str | None
    reason: str
    #: An approval's raise on budget.raises.
    raise_id: str | None
