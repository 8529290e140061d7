"""The generated UsageEvent reader (schemas.avro_reader.compile_record_reader) reads exactly what
fastavro reads, and the hot-path decoder built on it (aggregator.counting.decode) returns the codec's
result or raises the codec's DecodeError (same reason, same message) for every input:
well-formed events of every shape, and damaged ones (flipped, cut, extended bytes)."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_reader
from hypothesis import given, settings
from hypothesis import strategies as st

import aggregator.counting.decode as hot
from aggregator.counting import usage_reader
from aggregator.counting.decode import decode_usage_event, read_usage_event
from schemas.avro_reader import compile_record_reader, record_reader_source
from schemas.codec import HEADER_LEN, USAGE_EVENT
from schemas.errors import DecodeError
from schemas.periods import to_micros
from schemas.readergen import reader_module_source

READ = compile_record_reader(USAGE_EVENT.schema)
TEXT = st.text(max_size=12)  # any code point the UTF-8 encoder takes, multi-byte included
LONGS = st.integers(-(2**63), 2**63 - 1)


@st.composite
def usage_events(draw: st.DrawFn) -> dict[str, Any]:
    optional = st.one_of(st.none(), TEXT)
    micros = draw(st.integers(0, 253_402_300_799_999_999))  # the datetime range past 1970
    return {
        "event_id": draw(TEXT),
        "occurred_at": datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=micros),
        "provider": draw(TEXT),
        "api": draw(TEXT),
        "model": draw(TEXT),
        "secret_id": draw(TEXT),
        "org_id": draw(TEXT),
        "project_id": draw(optional),
        "grant_id": draw(optional),
        "permission_id": draw(optional),
        "user_id": draw(optional),
        "groups": draw(st.lists(TEXT, max_size=4)),
        "session_id": draw(optional),
        "tags": draw(st.dictionaries(TEXT, TEXT, max_size=4)),
        "input_tokens": draw(LONGS),
        "cache_read_tokens": draw(LONGS),
        "cache_write_tokens": draw(LONGS),
        "cache_write_1h_tokens": draw(LONGS),
        "output_tokens": draw(LONGS),
        "reasoning_tokens": draw(LONGS),
        "usage_source": draw(st.sampled_from(["reported", "estimated", "none"])),
        "estimate_reason": draw(optional),
        "outcome": draw(st.sampled_from(["allowed", "refused", "failed_open", "failed_closed"])),
        "decision": draw(TEXT),
        "decision_budget_id": draw(optional),
        "status_code": draw(st.integers(-(2**31), 2**31 - 1)),
        "stream": draw(st.booleans()),
        "gateway_id": draw(TEXT),
        "request_id": draw(optional),
        "latency_ms": draw(st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1))),
        "units": draw(st.dictionaries(TEXT, LONGS, max_size=4)),
        "service_tier": draw(optional),
        "charge_of": draw(optional),
    }


def _fastavro(data: bytes) -> dict[str, Any]:
    body = io.BytesIO(data)
    body.seek(HEADER_LEN)
    return schemaless_reader(body, parse_schema(USAGE_EVENT.schema), None)  # type: ignore[return-value]  # a record schema reads a dict


def _outcome(decode: Any, data: bytes) -> tuple[str, Any]:
    try:
        return "record", decode(data)
    except DecodeError as exc:
        return "error", (exc.reason, str(exc))


def test_the_usage_event_schema_has_a_generated_reader() -> None:
    assert READ is not None  # else the aggregator would not even import


@settings(max_examples=300, deadline=None)
@given(event=usage_events())
def test_the_generated_reader_reads_what_fastavro_reads(event: dict[str, Any]) -> None:
    assert READ is not None
    data = USAGE_EVENT.encode(event)
    record, end = READ(data, HEADER_LEN)
    assert end == len(data)
    assert record == _fastavro(data) == event
    assert list(record) == [f["name"] for f in USAGE_EVENT.schema["fields"]]  # fastavro's order
    assert read_usage_event(data) == (event, to_micros(event["occurred_at"]))


def test_a_valid_event_never_goes_through_the_codec(monkeypatch: pytest.MonkeyPatch) -> None:
    data = USAGE_EVENT.encode(_sample())
    expected = USAGE_EVENT.decode(data)

    class Refusing:
        header = USAGE_EVENT.header

        def decode(self, _: bytes) -> None:
            raise AssertionError("the fast path fell back to the codec")

    monkeypatch.setattr(hot, "USAGE_EVENT", Refusing())
    assert decode_usage_event(data) == expected


def _sample() -> dict[str, Any]:
    return {
        "event_id": "0f4c1e9e-5d6a-4a55-9a57-0e0f6f3f8a11",
        "occurred_at": datetime(2026, 11, 30, 12, 0, 0, 123456, tzinfo=UTC),
        "provider": "anthropic",
        "api": "anthropic-messages",
        "model": "claude-sonnet-4-5",
        "secret_id": "sk-1",
        "org_id": "acme",
        "user_id": "ada@acme.com",
        "groups": ["eng", "ml"],
        "tags": {"team": "search", "env": "prod"},
        "input_tokens": 1200,
        "output_tokens": 345,
        "cache_read_tokens": 70_000,
        "usage_source": "reported",
        "outcome": "allowed",
        "status_code": 200,
        "stream": True,
        "gateway_id": "gw-1",
        "latency_ms": 1834,
    }


def _varint(z: int) -> bytes:
    out = b""
    while z >= 0x80:
        out += bytes(((z & 0x7F) | 0x80,))
        z >>= 7
    return out + bytes((z,))


def _swap_status_code(data: bytes, replacement: bytes) -> bytes:
    """``data`` with the status_code varint (200 -> 0x90 0x03) replaced by ``replacement``."""
    assert data.count(b"\x90\x03") == 1
    return data.replace(b"\x90\x03", replacement)


GOOD = USAGE_EVENT.encode(_sample())


@pytest.mark.parametrize(
    ("case", "data"),
    [
        ("cut in the header", GOOD[:5]),
        ("cut after the header", GOOD[:HEADER_LEN]),
        ("cut in a string", GOOD[: HEADER_LEN + 10]),
        ("cut at the end", GOOD[:-1]),
        ("trailing byte", GOOD + b"\x00"),
        ("negative string length", GOOD[:HEADER_LEN] + b"\x01" + GOOD[HEADER_LEN + 1 :]),
        ("string past the end", GOOD[:HEADER_LEN] + b"\xfe\x7f" + GOOD[HEADER_LEN + 1 :]),
        ("invalid UTF-8", GOOD[:HEADER_LEN] + b"\x04\xff\xfe" + GOOD[HEADER_LEN + 3 :]),
        ("int beyond 32 bits", _swap_status_code(GOOD, _varint(2 * 2**40))),
        ("long past 64 bits", _swap_status_code(GOOD, b"\xff" * 9 + b"\x7f")),
        ("varint of 11 bytes", _swap_status_code(GOOD, b"\x80" * 10 + b"\x01")),
        ("non-minimal varint", _swap_status_code(GOOD, b"\x90\x83\x80\x00")),
    ],
)
def test_damaged_input_gives_the_codecs_outcome(case: str, data: bytes) -> None:
    assert _outcome(decode_usage_event, data) == _outcome(USAGE_EVENT.decode, data), case


def test_bad_indexes_and_booleans_give_the_codecs_outcome() -> None:
    """Every byte value at every position of a small event: union and enum indexes, booleans,
    counts and lengths each get values the schema never writes."""
    small = USAGE_EVENT.encode({**_sample(), "groups": ["a"], "tags": {"k": "v"}})
    for at in range(HEADER_LEN, len(small)):
        for value in (0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x7F, 0x80, 0xFF):
            data = small[:at] + bytes((value,)) + small[at + 1 :]
            assert _outcome(decode_usage_event, data) == _outcome(USAGE_EVENT.decode, data), (
                at,
                value,
            )


@settings(max_examples=300, deadline=None)
@given(
    event=usage_events(),
    edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=3),
    cut=st.one_of(st.none(), st.integers(0, 10**6)),
    extra=st.binary(max_size=3),
)
def test_randomly_damaged_events_give_the_codecs_outcome(
    event: dict[str, Any], edits: list[tuple[int, int]], cut: int | None, extra: bytes
) -> None:
    data = bytearray(USAGE_EVENT.encode(event))
    for at, value in edits:
        data[HEADER_LEN + at % (len(data) - HEADER_LEN)] = value
    damaged = bytes(data[: HEADER_LEN + cut % len(data)] if cut is not None else data) + extra
    assert _outcome(decode_usage_event, damaged) == _outcome(USAGE_EVENT.decode, damaged)


def test_the_generated_reader_module_is_what_the_schema_generates() -> None:
    """aggregator/counting/usage_reader.py (compiled with the fold) is the schema's reader as
    ``hot.WRITE_READER`` writes it, and it is the one the hot path uses."""
    expected = reader_module_source(USAGE_EVENT, raw_timestamps=True)
    assert hot.READER_MODULE.read_text() == expected, f"stale: run {hot.WRITE_READER}"
    assert USAGE_EVENT.header == usage_reader.HEADER  # decode refuses another at import


@pytest.mark.parametrize(
    "field_type",
    [
        "double",
        "bytes",
        ["null", "string", "long"],
        ["string", "long"],
        {"type": "array", "items": "double"},
        {"type": "map", "values": {"type": "fixed", "name": "F", "size": 2}},
        {"type": "record", "name": "Inner", "fields": [{"name": "x", "type": "long"}]},
    ],
)
def test_a_type_the_generator_does_not_read_gets_no_reader(field_type: Any) -> None:
    """No reader rather than a wrong one: the codec (fastavro) reads such records."""
    schema = {
        "type": "record",
        "name": "R",
        "fields": [{"name": "a", "type": "string"}, {"name": "b", "type": field_type}],
    }
    assert record_reader_source(schema) is None
    assert compile_record_reader(schema) is None
