"""UsageEvent records: decision vocabulary, construction, validation, JSON form.

Records are plain dicts (what fastavro reads and writes) so the hot path pays
no conversion, typed as ``schemas.records.UsageEvent``; this module is the one place
that knows their rules.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final, cast

from schemas.billed_units import (
    MAX_UNITS_PER_EVENT,
    SERVICE_TIER_NAME,
    UNIT_NAME,
    valid_service_tier,
    valid_unit_name,
)
from schemas.errors import InvalidRecord
from schemas.ids import MAX_ID_LENGTH
from schemas.periods import from_micros, to_micros
from schemas.records import UsageEvent

# Decision values, shared by the enforcer (which decides), the aggregator (which
# counts and logs) and ClickHouse (which reports).
ALLOWED: Final = "allowed"
BUDGET_EXCEEDED: Final = "budget_exceeded"
JOB_BUDGET_EXCEEDED: Final = "job_budget_exceeded"
IN_FLIGHT_BUDGET_EXCEEDED: Final = "in_flight_budget_exceeded"
THROTTLED: Final = "throttled"
FAILED_OPEN: Final = "failed_open"
FAILED_CLOSED: Final = "failed_closed"
#: the policy engine's refusals (enforcer/policy.py, seed 001): the job waits for a person,
#: the policy refused the request, a person refused the job
APPROVAL_REQUIRED: Final = "approval_required"
POLICY_DENIED: Final = "policy_denied"
APPROVAL_DENIED: Final = "approval_denied"
REFUSAL_DECISIONS: Final = frozenset(
    {
        BUDGET_EXCEEDED,
        JOB_BUDGET_EXCEEDED,
        IN_FLIGHT_BUDGET_EXCEEDED,
        THROTTLED,
        FAILED_CLOSED,
        APPROVAL_REQUIRED,
        POLICY_DENIED,
        APPROVAL_DENIED,
    }
)
OUTCOMES: Final = ("allowed", "refused", "failed_open", "failed_closed")
USAGE_SOURCES: Final = ("reported", "estimated", "none")
#: a request's input tokens, when nothing better is known, are its bytes / this (rounded
#: up): seed 003's rule, for the enforcer's hold and the tap's estimate alike. Text runs
#: ~4 bytes a token in English but ~3 in UTF-8 CJK (a character a token): 3 stays on the
#: side of charging more, as estimates must (docs/design.md invariant 7)
REQUEST_BYTES_PER_TOKEN: Final = 3

#: the six token counts of a UsageEvent, in the order of its schema (and of the
#: usage_events columns)
TOKEN_FIELDS: Final = (
    "input_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "cache_write_1h_tokens",
    "output_tokens",
    "reasoning_tokens",
)
#: the token counts a price applies to (``PriceBook.price``'s keywords): reasoning tokens
#: are a part of output_tokens, priced with them
PRICED_TOKEN_FIELDS: Final = TOKEN_FIELDS[:5]
#: no single call bills this many tokens; a larger count is a bug or an attack
MAX_TOKENS_PER_EVENT: Final = 100_000_000
#: event times outside these bounds are refused (they would open absurd periods)
MIN_OCCURRED_AT: Final = datetime(2000, 1, 1, tzinfo=UTC)
MAX_OCCURRED_AT: Final = datetime(2100, 1, 1, tzinfo=UTC)
REQUIRED_IDS: Final = ("event_id", "provider", "api", "model", "secret_id", "org_id", "gateway_id")
#: an event's HTTP status (``status_code``): the statuses HTTP defines
MIN_STATUS_CODE: Final = 100
MAX_STATUS_CODE: Final = 599
#: the fields the JSON form of an event must give (HTTP ingest, JSON lines); every other
#: field takes ``new_usage_event``'s default
JSON_REQUIRED_FIELDS: Final = (
    "event_id",
    "occurred_at",
    "provider",
    "api",
    "model",
    "secret_id",
    "org_id",
    "gateway_id",
    "input_tokens",
    "output_tokens",
)
OPTIONAL_IDS: Final = ("project_id", "grant_id", "permission_id", "user_id", "session_id")


def new_event_id() -> str:
    """Time-ordered unique id (UUIDv7 layout): sortable, no coordination."""
    ms = int(datetime.now(UTC).timestamp() * 1000)
    rand = uuid.uuid4().int & ((1 << 74) - 1)
    value = (
        (ms << 80) | (0x7 << 76) | ((rand >> 62) << 64) | (0b10 << 62) | (rand & ((1 << 62) - 1))
    )
    return str(uuid.UUID(int=value))


def billed_tokens(event: UsageEvent | Mapping[str, int]) -> int:
    """Every billed token of the event (or of its token counts alone): input + cache reads +
    cache writes + output."""
    return (
        event["input_tokens"]
        + event["cache_read_tokens"]
        + event["cache_write_tokens"]
        + event["output_tokens"]
    )


def new_usage_event(
    *,
    # Any: validated below (validate_usage_event); compiled (mypyc), a declared type would
    # be enforced first, with a TypeError naming no field (and True would pass as an int)
    provider: Any,
    api: Any,
    model: Any,
    secret_id: Any,
    org_id: Any,
    gateway_id: Any,
    input_tokens: Any,
    output_tokens: Any,
    status_code: Any = 200,
    occurred_at: Any = None,
    event_id: Any = None,
    **optional: Any,
) -> UsageEvent:
    """A complete, validated UsageEvent record; ``optional`` takes any other schema field."""
    record: dict[str, Any] = {
        "event_id": event_id or new_event_id(),
        "occurred_at": occurred_at or datetime.now(UTC),
        "provider": provider,
        "api": api,
        "model": model,
        "secret_id": secret_id,
        "org_id": org_id,
        "project_id": None,
        "grant_id": None,
        "permission_id": None,
        "user_id": None,
        "groups": [],
        "session_id": None,
        "tags": {},
        "input_tokens": input_tokens,
        "cache_read_tokens": 0,
        "cache_write_tokens": 0,
        "cache_write_1h_tokens": 0,
        "output_tokens": output_tokens,
        "reasoning_tokens": 0,
        "usage_source": "reported",
        "estimate_reason": None,
        "outcome": "allowed",
        "decision": ALLOWED,
        "decision_budget_id": None,
        "status_code": status_code,
        "stream": False,
        "gateway_id": gateway_id,
        "request_id": None,
        "latency_ms": None,
        "units": {},
        "service_tier": None,
        "charge_of": None,
    }
    unknown = set(optional) - set(record)
    if unknown:
        raise InvalidRecord(
            sorted(unknown)[0], "not a UsageEvent field", record_id=record["event_id"]
        )
    record.update(optional)
    validate_usage_event(record)
    return cast(UsageEvent, record)  # validated: every field of the schema, of its type


# Any: the values of an event not yet validated are what the validators read and check


def validate_usage_event(event: Mapping[str, Any]) -> None:
    """Raise InvalidRecord naming the first field that breaks the contract."""
    # Every proxy and the aggregator validate each event: the common, valid case takes a
    # quick test; only an event it does not pass is read again to name the fault.
    if not _plainly_valid(event):
        _explain_invalid(event)


#: MIN_OCCURRED_AT and MAX_OCCURRED_AT in µs since the epoch
_MIN_OCCURRED_US: Final = to_micros(MIN_OCCURRED_AT)
_MAX_OCCURRED_US: Final = to_micros(MAX_OCCURRED_AT)


def validate_decoded_usage_event(event: dict[str, Any], occurred_us: int) -> None:
    """``validate_usage_event`` for an event an Avro reader decoded from the UsageEvent
    schema, whose ``occurred_at`` is ``occurred_us``: the reader made every type what the
    schema says (strings, longs, the enums' symbols, an aware UTC time), so only the
    contract's bounds are tested; an event that fails them is read field by field."""
    if not _decoded_plainly_valid(event, occurred_us):
        _explain_invalid(event)


def _decoded_plainly_valid(event: dict[str, Any], occurred_us: int) -> bool:
    """:func:`_plainly_valid` less what an Avro reader guarantees (a property test holds
    it as narrow as :func:`_explain_invalid` on decoded events)."""
    for name in REQUIRED_IDS:
        value: str = event[name]
        if not 0 < len(value) <= MAX_ID_LENGTH or value.isspace():
            return False
    for name in OPTIONAL_IDS:
        optional: str | None = event[name]
        if optional is not None and len(optional) > MAX_ID_LENGTH:
            return False
    for name in TOKEN_FIELDS:
        tokens: int = event[name]
        if not 0 <= tokens <= MAX_TOKENS_PER_EVENT:
            return False
    if (
        event["cache_write_1h_tokens"] > event["cache_write_tokens"]
        or event["reasoning_tokens"] > event["output_tokens"]
        or not event["event_id"].isprintable()
        or not _MIN_OCCURRED_US <= occurred_us < _MAX_OCCURRED_US
    ):
        return False
    status: int = event["status_code"]
    if not MIN_STATUS_CODE <= status <= MAX_STATUS_CODE:
        return False
    units: dict[str, int] = event["units"]
    if units:
        for name, count in units.items():
            if not 0 <= count <= MAX_UNITS_PER_EVENT or UNIT_NAME.fullmatch(name) is None:
                return False
    tier: str | None = event["service_tier"]
    if tier is not None and SERVICE_TIER_NAME.fullmatch(tier) is None:
        return False
    charge_of: str | None = event["charge_of"]
    return charge_of is None or (0 < len(charge_of) <= MAX_ID_LENGTH and charge_of.isprintable())


def _plainly_valid(event: Mapping[str, Any]) -> bool:
    """True when ``event`` keeps the contract with exact types (``str``, ``int``, ``list``...).

    Strictly narrower than :func:`_explain_invalid`: it never passes an event that
    function refuses (a property test holds them so); a subclass of ``str`` or an
    unusual value makes it answer False, and the full reading decides.
    """
    get = event.get
    for name in REQUIRED_IDS:
        value = get(name)
        if type(value) is not str or not 0 < len(value) <= MAX_ID_LENGTH or value.isspace():
            return False
    for name in OPTIONAL_IDS:
        value = get(name)
        if value is not None and (type(value) is not str or len(value) > MAX_ID_LENGTH):
            return False
    for name in TOKEN_FIELDS:
        value = get(name)
        if type(value) is not int or not 0 <= value <= MAX_TOKENS_PER_EVENT:
            return False
    if (
        event["cache_write_1h_tokens"] > event["cache_write_tokens"]
        or event["reasoning_tokens"] > event["output_tokens"]
        or not event["event_id"].isprintable()
    ):
        return False
    occurred_at = get("occurred_at")
    if (
        type(occurred_at) is not datetime
        or occurred_at.tzinfo is None
        or not MIN_OCCURRED_AT <= occurred_at < MAX_OCCURRED_AT
    ):
        return False
    # tuples, not sets: an unhashable value must answer False, not raise
    if get("usage_source") not in USAGE_SOURCES or get("outcome") not in OUTCOMES:
        return False
    status = get("status_code")
    if type(status) is not int or not MIN_STATUS_CODE <= status <= MAX_STATUS_CODE:
        return False
    groups = get("groups")
    if type(groups) is not list:
        return False
    for group in groups:
        if type(group) is not str:
            return False
    tags = get("tags")
    if type(tags) is not dict:
        return False
    # loops, not all(): no generator object per event on the hot path
    for key, value in tags.items():
        if type(key) is not str or type(value) is not str:
            return False
    # v2 fields: absent in a record built before them (they default)
    units = get("units")
    if units:
        if type(units) is not dict:
            return False
        for name, count in units.items():
            if (
                type(count) is not int
                or not 0 <= count <= MAX_UNITS_PER_EVENT
                or type(name) is not str
                or UNIT_NAME.fullmatch(name) is None
            ):
                return False
    elif units is not None and type(units) is not dict:
        return False
    tier = get("service_tier")
    if tier is not None and (type(tier) is not str or SERVICE_TIER_NAME.fullmatch(tier) is None):
        return False
    # v3
    charge_of = get("charge_of")
    return charge_of is None or (
        type(charge_of) is str and 0 < len(charge_of) <= MAX_ID_LENGTH and charge_of.isprintable()
    )


def _explain_invalid(event: Mapping[str, Any]) -> None:
    """Read ``event`` field by field; raise InvalidRecord naming the first fault found."""
    event_id = event.get("event_id") if isinstance(event.get("event_id"), str) else None
    for name in REQUIRED_IDS:
        value = event.get(name)
        if not isinstance(value, str) or not value.strip():
            raise InvalidRecord(name, "required, a non-empty string", record_id=event_id)
        if len(value) > MAX_ID_LENGTH:
            raise InvalidRecord(name, f"longer than {MAX_ID_LENGTH} characters", record_id=event_id)
    if not event["event_id"].isprintable():
        # control characters are reserved for the aggregator's own keys
        raise InvalidRecord("event_id", "must be printable text", record_id=None)
    for name in OPTIONAL_IDS:
        value = event.get(name)
        if value is not None and (not isinstance(value, str) or len(value) > MAX_ID_LENGTH):
            raise InvalidRecord(
                name,
                f"must be null or a string of <= {MAX_ID_LENGTH} characters",
                record_id=event_id,
            )
    for name in TOKEN_FIELDS:
        value = event.get(name)
        if type(value) is not int:  # bool is an int subclass: refuse it too
            raise InvalidRecord(name, f"must be an integer, got {value!r}", record_id=event_id)
        if value < 0:
            raise InvalidRecord(name, f"must be >= 0, got {value}", record_id=event_id)
        if value > MAX_TOKENS_PER_EVENT:
            raise InvalidRecord(
                name, f"{value} exceeds the sanity bound {MAX_TOKENS_PER_EVENT}", record_id=event_id
            )
    if event["cache_write_1h_tokens"] > event["cache_write_tokens"]:
        raise InvalidRecord(
            "cache_write_1h_tokens",
            "is a part of cache_write_tokens: cannot exceed it",
            record_id=event_id,
        )
    if event["reasoning_tokens"] > event["output_tokens"]:
        raise InvalidRecord(
            "reasoning_tokens", "is a part of output_tokens: cannot exceed it", record_id=event_id
        )
    occurred_at = event.get("occurred_at")
    if not isinstance(occurred_at, datetime) or occurred_at.tzinfo is None:
        raise InvalidRecord("occurred_at", "must be a UTC timestamp", record_id=event_id)
    if not MIN_OCCURRED_AT <= occurred_at < MAX_OCCURRED_AT:
        raise InvalidRecord(
            "occurred_at", f"{occurred_at.isoformat()} is out of range", record_id=event_id
        )
    if event.get("usage_source") not in USAGE_SOURCES:
        raise InvalidRecord("usage_source", f"one of {USAGE_SOURCES}", record_id=event_id)
    if event.get("outcome") not in OUTCOMES:
        raise InvalidRecord("outcome", f"one of {OUTCOMES}", record_id=event_id)
    status = event.get("status_code")
    if type(status) is not int or not MIN_STATUS_CODE <= status <= MAX_STATUS_CODE:
        raise InvalidRecord(
            "status_code",
            f"an HTTP status {MIN_STATUS_CODE}..{MAX_STATUS_CODE}, got {status!r}",
            record_id=event_id,
        )
    groups = event.get("groups")
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        raise InvalidRecord("groups", "must be a list of strings", record_id=event_id)
    tags = event.get("tags")
    if not isinstance(tags, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in tags.items()
    ):
        raise InvalidRecord("tags", "must be a map of string to string", record_id=event_id)
    units = event.get("units")
    if units is not None:
        if not isinstance(units, dict):
            raise InvalidRecord("units", "must be a map of unit name to count", record_id=event_id)
        for name, count in units.items():
            if not valid_unit_name(name):
                raise InvalidRecord(
                    "units",
                    f"unit name {name!r} is not [a-z][a-z0-9_]* (at most 40 characters)",
                    record_id=event_id,
                )
            if type(count) is not int or not 0 <= count <= MAX_UNITS_PER_EVENT:
                raise InvalidRecord(
                    "units",
                    f"{name}: a count 0..{MAX_UNITS_PER_EVENT}, got {count!r}",
                    record_id=event_id,
                )
    tier = event.get("service_tier")
    if tier is not None and not valid_service_tier(tier):
        raise InvalidRecord(
            "service_tier", f"null or a short lower-case word, got {tier!r}", record_id=event_id
        )
    charge_of = event.get("charge_of")
    if charge_of is not None and (
        not isinstance(charge_of, str)
        or not 0 < len(charge_of) <= MAX_ID_LENGTH
        or not charge_of.isprintable()
    ):
        raise InvalidRecord(
            "charge_of",
            f"null or the event_id of the call it is a charge of (<= {MAX_ID_LENGTH} printable "
            "characters)",
            record_id=event_id,
        )


_JSON_TIME_FIELDS: Final = ("occurred_at",)


def usage_event_from_json(obj: Any) -> UsageEvent:
    """A UsageEvent from its JSON form (HTTP ingest, JSON lines); validated.

    ``occurred_at`` is an RFC 3339 string or integer microseconds since the epoch;
    optional fields may be omitted.
    """
    if not isinstance(obj, dict):
        raise InvalidRecord("<event>", "each event must be a JSON object")
    event_id = obj.get("event_id") if isinstance(obj.get("event_id"), str) else None
    data = dict(obj)
    raw_time = data.get("occurred_at")
    if isinstance(raw_time, str):
        try:
            parsed = datetime.fromisoformat(raw_time.replace("Z", "+00:00"))
        except ValueError:
            raise InvalidRecord(
                "occurred_at", f"not an RFC 3339 time: {raw_time!r}", record_id=event_id
            ) from None
        if parsed.tzinfo is None:
            raise InvalidRecord(
                "occurred_at", "needs a time zone (use Z for UTC)", record_id=event_id
            )
        data["occurred_at"] = parsed.astimezone(UTC)
    elif type(raw_time) is int:
        data["occurred_at"] = from_micros(raw_time)
    elif raw_time is None:
        raise InvalidRecord("occurred_at", "required", record_id=event_id)
    else:
        raise InvalidRecord(
            "occurred_at", f"must be a string or integer, got {raw_time!r}", record_id=event_id
        )
    for name in JSON_REQUIRED_FIELDS:
        if name not in data and name != "event_id":  # occurred_at: read above
            raise InvalidRecord(name, "required", record_id=event_id)
    if "event_id" not in data:
        raise InvalidRecord("event_id", "required (assign it once, keep it across retries)")
    return new_usage_event(**data)


def usage_event_to_json(event: UsageEvent) -> dict[str, object]:
    out: dict[str, object] = dict(event)
    out["occurred_at"] = event["occurred_at"].isoformat().replace("+00:00", "Z")
    return out
