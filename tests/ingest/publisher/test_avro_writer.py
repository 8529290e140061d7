"""The generated UsageEvent writer is byte-identical to fastavro's, for every valid event and
for odd values too (which it hands to fastavro), and what it writes decodes back."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, cast

import pytest
from fastavro import parse_schema, schemaless_writer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.publisher import InvalidRecord, prepare
from schemas.avro_writer import compile_record_writer
from schemas.codec import USAGE_EVENT
from schemas.records import UsageEvent
from schemas.usage import MAX_TOKENS_PER_EVENT, OUTCOMES, USAGE_SOURCES

FIELDS = {f["name"]: f for f in USAGE_EVENT.schema["fields"]}


def fastavro_bytes(record: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    buf.write(USAGE_EVENT.header)
    schemaless_writer(buf, USAGE_EVENT.parsed, record)
    return buf.getvalue()


def outcome(encode: Any, record: dict[str, Any]) -> tuple[str, Any]:
    try:
        return "bytes", encode(record)
    except Exception as exc:
        return "error", type(exc)


# text without lone surrogates (those cannot be UTF-8): ASCII, accents, CJK, emoji, and
# now and then long enough for a length prefix of several bytes
SHORT = st.text(st.characters(exclude_categories=["Cs"]), max_size=40)
LONG = st.builds(
    lambda piece, times: piece * times,
    st.sampled_from(["a", "é", "漢", "😀"]),
    st.integers(2048, 9000),
)
TEXT = st.one_of(SHORT, SHORT, SHORT, LONG)
ID = SHORT.filter(lambda s: bool(s.strip()))
TOKENS = st.integers(0, MAX_TOKENS_PER_EVENT) | st.integers(0, 9000)
ZONES = st.integers(-23 * 60, 23 * 60).map(lambda m: timezone(timedelta(minutes=m)))
WHEN = st.builds(
    lambda naive, tz: naive.replace(tzinfo=tz),
    st.datetimes(datetime(2000, 1, 2), datetime(2099, 12, 30)),
    ZONES | st.just(UTC),
)
MISSING = object()


def optional(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A field that may be left out of the dict (the schema's default applies)."""
    return st.just(MISSING) | st.none() | values


@st.composite
def usage_events(draw: st.DrawFn) -> dict[str, Any]:
    cache_write = draw(TOKENS)
    output = draw(TOKENS)
    event: dict[str, Any] = {
        "event_id": draw(ID.filter(str.isprintable)),
        "occurred_at": draw(WHEN),
        **{n: draw(ID) for n in ("provider", "api", "model", "secret_id", "org_id", "gateway_id")},
        **{
            n: draw(optional(ID))
            for n in ("project_id", "grant_id", "permission_id", "user_id", "session_id")
        },
        "groups": draw(st.lists(TEXT, max_size=4)),
        "tags": draw(st.dictionaries(TEXT, TEXT, max_size=4)),
        "input_tokens": draw(TOKENS),
        "cache_read_tokens": draw(TOKENS),
        "cache_write_tokens": cache_write,
        "cache_write_1h_tokens": draw(st.integers(0, cache_write)),
        "output_tokens": output,
        "reasoning_tokens": draw(st.integers(0, output)),
        "usage_source": draw(st.sampled_from(USAGE_SOURCES)),
        "estimate_reason": draw(optional(TEXT)),
        "outcome": draw(st.sampled_from(OUTCOMES)),
        "decision": draw(st.just(MISSING) | ID),
        "decision_budget_id": draw(optional(TEXT)),
        "status_code": draw(st.integers(100, 599)),
        "stream": draw(st.just(MISSING) | st.booleans()),
        "gateway_id": draw(ID),
        "request_id": draw(optional(TEXT)),
        "latency_ms": draw(optional(st.integers(0, 2**31 - 1))),
    }
    return {k: v for k, v in event.items() if v is not MISSING}


FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_usage_event_has_a_generated_writer() -> None:
    assert USAGE_EVENT.body_writer is not None


@FAST
@given(usage_events())
def test_every_valid_event_is_byte_identical_to_fastavro_and_decodes_back(
    event: dict[str, Any],
) -> None:
    # valid by construction (validation passes), some fields with defaults left out: the
    # event a producer may send, not a whole UsageEvent
    prepared = prepare(cast(UsageEvent, event))
    assert prepared.value == fastavro_bytes(event)
    assert USAGE_EVENT.body_writer is not None
    # the generated writer itself wrote it (not the fallback)
    assert USAGE_EVENT.header + USAGE_EVENT.body_writer(event) == prepared.value
    decoded = USAGE_EVENT.decode(prepared.value)
    expected = {name: event.get(name, FIELDS[name].get("default")) for name in FIELDS}
    assert decoded == expected


class Text(str):
    """A str subclass: valid to the validator, not an exact type for the generated writer."""


ODD_VALUES: list[Any] = [
    None,
    True,
    0,
    -1,
    2**31,
    2**63,
    1.5,
    "x",
    Text("x"),
    "\ud800",
    b"x",
    [],
    ["a", 1],
    ("a",),
    {},
    {"k": 1},
    {1: "v"},
    datetime(2026, 1, 1, 12, 0),  # naive: fastavro reads it as local time
    datetime(2026, 1, 1, 12, 0, tzinfo=UTC),
    1_700_000_000_000_000,
]


@settings(max_examples=300, deadline=None)
@given(usage_events(), st.sampled_from(sorted(FIELDS)), st.sampled_from(ODD_VALUES))
def test_any_value_gives_fastavro_s_bytes_or_fastavro_s_error(
    event: dict[str, Any], name: str, value: Any
) -> None:
    event[name] = value
    assert outcome(USAGE_EVENT.encode, event) == outcome(fastavro_bytes, event)


def test_a_missing_field_without_default_is_fastavro_s_error() -> None:
    event = {"event_id": "e-1"}
    assert outcome(USAGE_EVENT.encode, event) == outcome(fastavro_bytes, event)


def test_a_lone_surrogate_is_refused_by_prepare_naming_the_encoder() -> None:
    event = {
        "event_id": "e-1",
        "occurred_at": datetime(2026, 1, 1, tzinfo=UTC),
        "provider": "p",
        "api": "a",
        "model": "m\ud800",
        "secret_id": "s",
        "org_id": "o",
        "gateway_id": "g",
        "groups": [],
        "tags": {},
        "input_tokens": 1,
        "cache_read_tokens": 0,
        "cache_write_tokens": 0,
        "cache_write_1h_tokens": 0,
        "output_tokens": 1,
        "reasoning_tokens": 0,
        "usage_source": "reported",
        "outcome": "allowed",
        "status_code": 200,
    }
    with pytest.raises(InvalidRecord, match="UnicodeEncodeError") as caught:
        prepare(cast(UsageEvent, event))  # not valid UTF-8 (and partial): the point of the test
    assert caught.value.field == "<event>"


SCHEMA_WITH_EVERY_KIND = {
    "type": "record",
    "name": "Kinds",
    "fields": [
        {"name": "n", "type": ["string", "null"]},
        {"name": "i", "type": "int"},
        {"name": "l", "type": {"type": "long"}},
        {"name": "b", "type": "boolean", "default": True},
        {"name": "li", "type": ["null", "int"], "default": None},
        {"name": "arr", "type": {"type": "array", "items": "long"}},
        {"name": "m", "type": {"type": "map", "values": ["null", "string"]}},
    ],
}


@settings(max_examples=200, deadline=None)
@given(
    st.fixed_dictionaries(
        {
            "n": st.none() | TEXT,
            "i": st.integers(-(2**31), 2**31 - 1),
            "l": st.integers(-(2**63), 2**63 - 1),
            "li": st.none() | st.integers(-(2**31), 2**31 - 1),
            "arr": st.lists(st.integers(-(2**63), 2**63 - 1), max_size=5),
            "m": st.dictionaries(TEXT, st.none() | TEXT, max_size=3),
        },
        optional={"b": st.booleans()},
    )
)
def test_the_generator_covers_negative_numbers_null_second_and_nested_unions(
    record: dict[str, Any],
) -> None:
    writer = compile_record_writer(SCHEMA_WITH_EVERY_KIND)
    assert writer is not None
    buf = io.BytesIO()
    schemaless_writer(buf, parse_schema(SCHEMA_WITH_EVERY_KIND), record)
    assert writer(record) == buf.getvalue()


def test_a_schema_with_an_unspecialised_type_gets_no_writer() -> None:
    for kind in ("double", "bytes", {"type": "fixed", "name": "F", "size": 2}):
        schema = {"type": "record", "name": "R", "fields": [{"name": "x", "type": kind}]}
        assert compile_record_writer(schema) is None


def reference_varint(z: int) -> bytes:
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def test_the_varint_tables_hold_every_varint_of_14_bits() -> None:
    from schemas import avro_writer

    for z in range(1 << 14):
        assert avro_writer._VARINT14[z] == reference_varint(z)
        # a 14-bit group followed by more: both bytes carry the continuation bit
        assert avro_writer._GROUP14[z] == reference_varint(z | 1 << 14)[:2]
