"""The JSON Schema of the HTTP ingest's body (schemas/usage_json_schema.py): shipped as
generated, and agreeing with the server's own validator (``usage_event_from_json``) over a
table of bodies, as a JSON Schema validator in Java (networknt's, fetched by
``tests/schemas/java/pom.xml``) reads it. What JSON Schema cannot say is listed: the server
alone refuses those."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from schemas.avro_schemas import expanded_schemas
from schemas.errors import InvalidRecord
from schemas.usage import JSON_REQUIRED_FIELDS, usage_event_from_json
from schemas.usage_json_schema import (
    SHIPPED_FILE,
    schema_text,
    shipped_schema_bytes,
    usage_ingest_body_schema,
)
from tests.schemas.kit import run_java

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"

MINIMAL: dict[str, Any] = {
    "event_id": "evt-1",
    "occurred_at": "2026-03-01T12:00:00Z",
    "provider": "openai",
    "api": "openai-chat",
    "model": "gpt-4.1",
    "secret_id": "sec-1",
    "org_id": "acme",
    "gateway_id": "gw-go-1",
    "input_tokens": 100,
    "output_tokens": 20,
}
FULL: dict[str, Any] = {
    **MINIMAL,
    "occurred_at": 1_772_366_400_000_000,
    "project_id": "p",
    "grant_id": None,
    "permission_id": "perm",
    "user_id": "Alice@Example.com",
    "groups": ["eng"],
    "session_id": "job-7",
    "tags": {"team": "search"},
    "cache_read_tokens": 5,
    "cache_write_tokens": 4,
    "cache_write_1h_tokens": 1,
    "reasoning_tokens": 3,
    "usage_source": "estimated",
    "estimate_reason": "stream_cut",
    "outcome": "refused",
    "decision": "budget_exceeded",
    "decision_budget_id": "acme-monthly",
    "status_code": 402,
    "stream": True,
    "request_id": "req-1",
    "latency_ms": 840,
    "units": {"web_search": 2},
    "service_tier": "flex",
    "charge_of": "evt-0",
}

#: (what, the event, valid): every case both validators must judge alike
CASES: list[tuple[str, dict[str, Any], bool]] = [
    ("minimal", MINIMAL, True),
    ("every field", FULL, True),
    ("an offset time", {**MINIMAL, "occurred_at": "2026-03-01T13:00:00+01:00"}, True),
    ("not a time", {**MINIMAL, "occurred_at": "yesterday"}, False),
    ("a time before 2000", {**MINIMAL, "occurred_at": 0}, False),
    ("a float time", {**MINIMAL, "occurred_at": 1.5}, False),
    ("negative tokens", {**MINIMAL, "input_tokens": -1}, False),
    ("tokens as text", {**MINIMAL, "output_tokens": "12"}, False),
    ("tokens as a float", {**MINIMAL, "cache_read_tokens": 1.5}, False),
    ("tokens as a boolean", {**MINIMAL, "output_tokens": True}, False),
    ("tokens past the bound", {**MINIMAL, "output_tokens": 10**9}, False),
    ("a blank org", {**MINIMAL, "org_id": "   "}, False),
    ("an empty model", {**MINIMAL, "model": ""}, False),
    ("an id too long", {**MINIMAL, "secret_id": "s" * 513}, False),
    ("an optional id too long", {**MINIMAL, "user_id": "u" * 513}, False),
    ("an optional id as a number", {**MINIMAL, "project_id": 7}, False),
    ("an unknown field", {**MINIMAL, "org": "acme"}, False),
    ("an unknown outcome", {**MINIMAL, "outcome": "maybe"}, False),
    ("an unknown usage source", {**MINIMAL, "usage_source": "guessed"}, False),
    ("status 600", {**MINIMAL, "status_code": 600}, False),
    ("status 99", {**MINIMAL, "status_code": 99}, False),
    ("groups of numbers", {**MINIMAL, "groups": [1]}, False),
    ("tags of numbers", {**MINIMAL, "tags": {"a": 1}}, False),
    ("a unit name in capitals", {**MINIMAL, "units": {"WebSearch": 1}}, False),
    ("a negative unit count", {**MINIMAL, "units": {"web_search": -1}}, False),
    ("a service tier with a blank", {**MINIMAL, "service_tier": "very fast"}, False),
    ("an empty charge_of", {**MINIMAL, "charge_of": ""}, False),
    *(
        (f"no {name}", {k: v for k, v in MINIMAL.items() if k != name}, False)
        for name in JSON_REQUIRED_FIELDS
    ),
]
#: what JSON Schema cannot express: the server refuses these, the schema's validator not
SERVER_ONLY: list[tuple[str, dict[str, Any]]] = [
    (
        "a 1-hour part above its whole",
        {**MINIMAL, "cache_write_tokens": 1, "cache_write_1h_tokens": 2},
    ),
    ("reasoning above output", {**MINIMAL, "output_tokens": 1, "reasoning_tokens": 2}),
    ("an event_id with a control character", {**MINIMAL, "event_id": "evt\u0007"}),
]


def python_accepts(event: dict[str, Any]) -> bool:
    try:
        usage_event_from_json(event)
    except InvalidRecord:
        return False
    return True


def java_verdicts(bodies: list[Any]) -> list[str]:
    """The Java validator's ``ok`` / ``invalid ...`` for each body, in one JVM."""
    schema = SCHEMAS / SHIPPED_FILE
    out = run_java(
        "ValidateJson.java", [str(schema)], "".join(json.dumps(b) + "\n" for b in bodies)
    )
    lines = out.splitlines()
    assert len(lines) == len(bodies), out
    return lines


def test_the_shipped_file_is_the_schema_as_generated() -> None:
    assert (SCHEMAS / SHIPPED_FILE).read_text(encoding="utf-8") == schema_text(), (
        "rewrite it with `python -m schemas.usage_json_schema`"
    )
    assert shipped_schema_bytes() == schema_text().encode()


def test_the_schema_names_every_field_of_usage_event_and_only_those() -> None:
    event = usage_ingest_body_schema()["$defs"]["UsageEvent"]
    fields = [f["name"] for f in expanded_schemas()["UsageEvent"]["fields"]]
    assert list(event["properties"]) == fields
    assert event["required"] == list(JSON_REQUIRED_FIELDS)
    assert event["additionalProperties"] is False
    optional = [name for name in fields if name not in JSON_REQUIRED_FIELDS]
    assert all("default" in event["properties"][name] for name in optional)


def test_the_schema_and_the_server_judge_every_case_alike() -> None:
    verdicts = java_verdicts([[event] for _, event, _ in CASES] + [[MINIMAL, FULL], {}])
    wrong = []
    for (what, event, valid), verdict in zip(CASES, verdicts, strict=False):
        if python_accepts(event) != valid:
            wrong.append(f"{what}: the server says {not valid}")
        if (verdict == "ok") != valid:
            wrong.append(f"{what}: the schema says {verdict}")
    assert not wrong, "\n".join(wrong)
    assert verdicts[len(CASES)] == "ok"  # a body of several events
    assert verdicts[-1].startswith("invalid")  # an object where the array goes


def test_what_the_schema_cannot_say_the_server_refuses() -> None:
    verdicts = java_verdicts([[event] for _, event in SERVER_ONLY])
    for (what, event), verdict in zip(SERVER_ONLY, verdicts, strict=True):
        assert verdict == "ok", what
        assert not python_accepts(event), what
