"""The Avro contract: every schema round-trips, headers identify the writer, bad bytes are named."""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from fastavro import parse_schema
from fastavro.schema import fingerprint as avro_fingerprint
from fastavro.schema import to_parsing_canonical_form

from schemas import codec as codec_module
from schemas.avro_schemas import SCHEMA_NAMES, expanded_schemas, fingerprint, history_versions
from schemas.codec import (
    ALERT,
    BUDGET_POLICY,
    BUDGET_RAISE,
    DEAD_LETTER,
    GATEWAY_KEY,
    GENERATION_SWITCH,
    MAGIC,
    PRICE_TABLE,
    PRICED_USAGE,
    USAGE_EVENT,
    VERDICT,
    codec_for,
)
from schemas.errors import DecodeError
from schemas.records import UsageEvent
from schemas.usage import new_usage_event

NOW = datetime(2026, 11, 30, 12, 0, 0, 123456, tzinfo=UTC)


def usage() -> UsageEvent:
    return new_usage_event(
        provider="anthropic",
        api="anthropic-messages",
        model="claude-sonnet-4-5",
        secret_id="sk-1",
        org_id="acme",
        gateway_id="gw-1",
        input_tokens=1200,
        output_tokens=300,
        cache_read_tokens=5000,
        cache_write_tokens=100,
        cache_write_1h_tokens=40,
        reasoning_tokens=120,
        occurred_at=NOW,
        groups=["eng"],
        tags={"team": "search"},
        user_id="alice@example.com",
    )


#: a record of each schema (the records' types differ: each is read as a Mapping)
FIXTURES: dict[str, Mapping[str, Any]] = {
    "UsageEvent": usage(),
    "PricedUsage": {
        "event": usage(),
        "cost_nanos": 123_456_789,
        "price_version": "2026-11-01",
        "price_match": "claude-sonnet-4",
        "unpriced": False,
        "source_partition": 3,
        "source_offset": 42,
        "priced_at": NOW,
        "counts": [
            {
                "counter_key": "12:acme-monthly,4:acme,",
                "budget_id": "acme-monthly",
                "scope_values": ["acme"],
                "window": "month",
                "period": "m:2026-11",
                "bucket": 0,
                "requests": 1,
                "limit_nanos": 500_000_000_000,
                "limit_tokens": None,
                "limit_requests": None,
                "alert_at": [0.8, 1.0],
            }
        ],
    },
    "BudgetPolicy": {
        "budget_id": "acme-monthly",
        "scope": "org",
        "match": {"org_id": "acme"},
        "window": "month",
        "limit_nanos": 500 * 10**9,
        "limit_tokens": None,
        "limit_requests": None,
        "action": "enforce",
        "alert_at": [0.8, 1.0],
        "count_denied": False,
        "rate": {
            "requests_per_second": None,
            "requests_per_minute": 600,
            "tokens_per_second": None,
            "tokens_per_minute": 100_000,
        },
        "timezone": "America/New_York",
        "week_start": "monday",
        "month_start_day": 15,
        "unpriced": "allow_free",
        "applied_at": NOW,
    },
    "PriceTable": {
        "version": "2026-11-01",
        "effective_from": NOW,
        "models": [
            {
                "match": "claude-sonnet-4",
                "input_per_mtok": "3.00",
                "output_per_mtok": "15.00",
                "cache_read_per_mtok": "0.30",
                "cache_write_per_mtok": None,
                "cache_write_1h_per_mtok": None,
                "long_context": {
                    "above_input_tokens": 200000,
                    "input_per_mtok": "6.00",
                    "output_per_mtok": "22.50",
                },
                "unit_prices": {"web_search": "0.01"},
                "service_tiers": {"batch": "0.5"},
                "service_tier_rates": {"batch": {"cache_read_per_mtok": "0.30"}},
            }
        ],
        "fallback": None,
    },
    "Verdict": {
        "counter_key": "12:acme-monthly,4:acme,",
        "budget_id": "acme-monthly",
        "scope": "org",
        "scope_values": ["acme"],
        "period": "m:2026-11",
        "state": "alert",
        "spent_nanos": 400 * 10**9,
        "spent_tokens": 10,
        "spent_requests": 1,
        "limit_nanos": 500 * 10**9,
        "limit_tokens": None,
        "limit_requests": None,
        "action": "enforce",
        "refusal": "budget_exceeded",
        "reset_at": datetime(2026, 12, 1, tzinfo=UTC),
        "as_of": NOW,
        "seq": 7,
        "emitted_at": NOW,
        "burn_nanos": 40 * 10**9,
        "burn_tokens": 10,
        "burn_requests": 1,
        "burn_span_us": 3_600_000_000,
        "exhausts_at": datetime(2026, 11, 30, 20, tzinfo=UTC),
        # a calendar window carries no buckets (Verdict v3: a rolling window's)
        "bucket_ages": [],
        "bucket_nanos": [],
        "bucket_tokens": [],
        "bucket_requests": [],
    },
    "Alert": {
        "alert_id": "12:acme-monthly,4:acme,|m:2026-11|0.8",
        "kind": "threshold",
        "counter_key": "12:acme-monthly,4:acme,",
        "budget_id": "acme-monthly",
        "period": "m:2026-11",
        "threshold": 0.8,
        "state": "alert",
        "spent_nanos": 400 * 10**9,
        "spent_tokens": 0,
        "spent_requests": 0,
        "limit_nanos": 500 * 10**9,
        "limit_tokens": None,
        "limit_requests": None,
        "model": None,
        "as_of": NOW,
        "exhausts_at": None,
    },
    "DeadLetter": {
        "reason": "bad_magic",
        "detail": "not an Avro single-object message",
        "stage": "aggregator",
        "source_topic": "usage.raw",
        "source_partition": 0,
        "source_offset": 9,
        "key": b"acme",
        "value": b"\x00garbage",
        "failed_at": NOW,
    },
    "VirtualKey": {
        "name": "acme-search-ana",
        "org_id": "acme",
        "secret_id": "sk-acme-openai",
        "project_id": "search",
        "grant_id": None,
        "user_id": "ana@acme.io",
        "groups": ["search", "eng"],
        "tags": {"team": "search"},
        "applied_at": NOW,
    },
    "GenerationSwitch": {
        "generation": "g2",
        "previous": "",
        "previous_retired": False,
        "switched_at": NOW,
    },
    "BudgetRaise": {
        "raise_id": "r-0123456789ab",
        "budget_id": "acme-monthly",
        "scope_values": ["acme"],
        "mode": "by",
        "raise_nanos": 100 * 10**9,
        "raise_tokens": None,
        "raise_requests": 500,
        "starts_at": NOW,
        "until": NOW,
        "reason": "launch week",
        "created_by": "ops",
        "revoked_at": None,
    },
    "JobApproval": {
        "job_key": "job-0123456789abcdef0123456789abcdef",
        "kind": "approve",
        "at": NOW,
        "by": "ops",
        "org_id": "acme",
        "identity": "alice@example.com",
        "session_id": "acme/job-7",
        "budget_id": "per-job",
        "reason": "release build",
        "raise_id": "r-0123456789ab",
    },
}


@pytest.mark.parametrize("name", SCHEMA_NAMES)
def test_every_schema_round_trips(name: str) -> None:
    c = codec_for(name)
    data = c.encode(FIXTURES[name])
    assert data[:2] == MAGIC
    assert c.decode(data) == FIXTURES[name]


@pytest.mark.parametrize("name", SCHEMA_NAMES)
def test_header_is_the_crc64_fingerprint_of_the_canonical_form(name: str) -> None:
    schema = expanded_schemas()[name]
    expected = bytes.fromhex(avro_fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))
    assert codec_for(name).header == MAGIC + expected


def test_fingerprint_matches_the_avro_spec_test_vector() -> None:
    # The Avro spec's CRC-64-AVRO of the schema "int" is 0x7275d51a3f395c8f, little-endian on the wire.
    assert fingerprint("int") == (0x7275D51A3F395C8F).to_bytes(8, "little")  # type: ignore[arg-type]  # the spec's vector is the bare schema "int"


def test_fingerprints_are_distinct() -> None:
    assert len({codec_for(n).header for n in SCHEMA_NAMES}) == len(SCHEMA_NAMES)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "bad_magic"),
        (b"garbage bytes that are not avro", "bad_magic"),
        (MAGIC + b"\x00" * 8 + b"\x02", "unknown_fingerprint"),
        (USAGE_EVENT.header + b"\x02", "malformed"),  # truncated body
        (VERDICT.encode(FIXTURES["Verdict"]), "wrong_schema"),
    ],
)
def test_undecodable_bytes_name_their_reason(data: bytes, reason: str) -> None:
    with pytest.raises(DecodeError) as info:
        USAGE_EVENT.decode(data)
    assert info.value.reason == reason


def test_trailing_bytes_are_malformed() -> None:
    with pytest.raises(DecodeError) as info:
        USAGE_EVENT.decode(USAGE_EVENT.encode(FIXTURES["UsageEvent"]) + b"\x00")
    assert info.value.reason == "malformed"


def test_codec_constants_are_the_named_codecs() -> None:
    assert [
        c.name
        for c in (
            USAGE_EVENT,
            PRICED_USAGE,
            BUDGET_POLICY,
            PRICE_TABLE,
            VERDICT,
            ALERT,
            DEAD_LETTER,
            GATEWAY_KEY,
            GENERATION_SWITCH,
            BUDGET_RAISE,
        )
    ] == [
        "UsageEvent",
        "PricedUsage",
        "BudgetPolicy",
        "PriceTable",
        "Verdict",
        "Alert",
        "DeadLetter",
        "VirtualKey",
        "GenerationSwitch",
        "BudgetRaise",
    ]


# --- schema evolution -----------------------------------------------------------------


@pytest.mark.parametrize("name", SCHEMA_NAMES)
def test_current_schema_is_the_latest_released_version(name: str) -> None:
    """A schema change must add a history file (avro/history/<Name>/v<N+1>.avsc): see schemas/README.md."""
    versions = history_versions(name)
    assert versions, f"no released version of {name}"
    assert versions[-1] == expanded_schemas()[name], (
        f"schemas/avro/{name}.avsc changed without a new history version; "
        "run `make schema-release` after checking compatibility"
    )


def _sample(schema: dict[str, Any]) -> Mapping[str, Any]:
    """A record for ``schema`` with every field present (defaults, or a typed placeholder)."""
    return FIXTURES[schema["name"]]


@pytest.mark.parametrize("name", SCHEMA_NAMES)
def test_each_version_is_backward_compatible_with_the_previous(name: str) -> None:
    """Every newer version reads what every older version wrote (Avro schema resolution)."""
    from io import BytesIO

    from fastavro import schemaless_reader, schemaless_writer

    versions = history_versions(name)
    for older, newer in itertools.pairwise(versions):
        added = {f["name"] for f in newer["fields"]} - {f["name"] for f in older["fields"]}
        for field in newer["fields"]:
            if field["name"] in added:
                assert "default" in field, f"{name}: new field {field['name']!r} needs a default"
        buf = BytesIO()
        record = {f["name"]: FIXTURES[name].get(f["name"]) for f in older["fields"]}
        schemaless_writer(buf, parse_schema(older), record)
        buf.seek(0)
        schemaless_reader(buf, parse_schema(older), parse_schema(newer))
    # and the codec itself decodes every shipped version's header
    for old in versions:
        fp = fingerprint(old)
        assert fp == codec_for(name).header[2:] or fp in codec_for(name).writers


def test_an_older_writer_version_decodes_through_the_codec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Simulate a v1 producer after a compatible v2 (a new optional field) ships."""
    v1 = json.loads(
        (resources.files("schemas") / "avro" / "history" / "UsageEvent" / "v1.avsc").read_text()
    )
    v2 = json.loads(json.dumps(v1))
    v2["fields"].append({"name": "region", "type": ["null", "string"], "default": None})
    from io import BytesIO

    from fastavro import schemaless_writer

    buf = BytesIO()
    buf.write(MAGIC + fingerprint(v1))
    schemaless_writer(buf, parse_schema(v1), FIXTURES["UsageEvent"])
    # v2 adds a field no record type names: its records are read as plain mappings
    new_codec: codec_module.Codec[Mapping[str, Any]] = codec_module.Codec(
        name="UsageEvent",
        schema=v2,
        parsed=parse_schema(v2),
        header=MAGIC + fingerprint(v2),
        writers={fingerprint(v1): parse_schema(v1)},
    )
    decoded = new_codec.decode(buf.getvalue())
    assert decoded["region"] is None
    assert decoded["event_id"] == FIXTURES["UsageEvent"]["event_id"]


def test_priced_usage_from_raw_bytes_equals_encoding_the_event_again() -> None:
    from schemas.codec import priced_usage_from_raw

    raw = USAGE_EVENT.encode(FIXTURES["UsageEvent"])
    tail = {k: v for k, v in FIXTURES["PricedUsage"].items() if k != "event"}
    fast = priced_usage_from_raw(raw, tail)
    assert fast == PRICED_USAGE.encode({"event": USAGE_EVENT.decode(raw), **tail})
    assert PRICED_USAGE.decode(fast)["event"] == FIXTURES["UsageEvent"]
    # bytes of another writer schema are not reused
    assert priced_usage_from_raw(b"\xc3\x01" + b"\x00" * 8 + raw[10:], tail) is None
