"""The JSON Schema (draft 2020-12) of the HTTP ingest's body: a JSON array of UsageEvents
in their JSON form (``POST /v1/usage``; ``schemas.usage.usage_event_from_json``).

Built from the contract, never by hand: the fields, their types and descriptions from
the UsageEvent Avro schema, the required fields and defaults from the JSON form
(``JSON_REQUIRED_FIELDS``, ``new_usage_event``), the bounds from the constants the
validator checks. A field of UsageEvent this module has no rule for is an error, so a
new field gets its JSON form decided here. What JSON Schema cannot say (a part within
its whole: ``cache_write_1h_tokens`` <= ``cache_write_tokens``, ``reasoning_tokens`` <=
``output_tokens``; a printable ``event_id``) is in the descriptions, and the server
checks it.

The schema ships as ``json/usage_ingest_body.schema.json`` (``python -m
schemas.usage_json_schema`` writes it; a test holds it current), and ``spendbus ingest
serve`` answers it at ``GET /v1/usage/schema``.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Final

from schemas.avro_schemas import expanded_schemas
from schemas.billed_units import MAX_UNITS_PER_EVENT, SERVICE_TIER_NAME, UNIT_NAME
from schemas.errors import ContractError
from schemas.ids import MAX_ID_LENGTH
from schemas.periods import to_micros
from schemas.usage import (
    JSON_REQUIRED_FIELDS,
    MAX_OCCURRED_AT,
    MAX_STATUS_CODE,
    MAX_TOKENS_PER_EVENT,
    MIN_OCCURRED_AT,
    MIN_STATUS_CODE,
    OPTIONAL_IDS,
    REQUIRED_IDS,
    TOKEN_FIELDS,
    new_usage_event,
    usage_event_to_json,
)

#: the shipped file, from the package's root
SHIPPED_FILE: Final = Path("json") / "usage_ingest_body.schema.json"

_NON_BLANK: Final = r"\S"  # somewhere in the text: an id of blanks only is none
_PARTS: Final = {
    "cache_write_1h_tokens": "cache_write_tokens",
    "reasoning_tokens": "output_tokens",
}


def _anchored(pattern: str) -> str:
    # Python fullmatches these; JSON Schema's "pattern" searches
    return f"^{pattern}$"


def _property(name: str, avro_type: Any) -> dict[str, Any]:
    """The JSON form of one UsageEvent field, by its name and Avro type."""
    if name == "occurred_at":
        return {
            "oneOf": [
                {"type": "string", "format": "date-time"},
                {
                    "type": "integer",
                    "minimum": to_micros(MIN_OCCURRED_AT),
                    "maximum": to_micros(MAX_OCCURRED_AT) - 1,
                },
            ],
        }
    if name in REQUIRED_IDS and avro_type == "string":
        return {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_ID_LENGTH,
            "pattern": _NON_BLANK,
        }
    if name in OPTIONAL_IDS and avro_type == ["null", "string"]:
        return {"type": ["string", "null"], "maxLength": MAX_ID_LENGTH}
    if name in TOKEN_FIELDS and avro_type == "long":
        return {"type": "integer", "minimum": 0, "maximum": MAX_TOKENS_PER_EVENT}
    if name == "status_code" and avro_type == "int":
        return {"type": "integer", "minimum": MIN_STATUS_CODE, "maximum": MAX_STATUS_CODE}
    if name == "units" and avro_type == {"type": "map", "values": "long"}:
        return {
            "type": "object",
            "propertyNames": {"pattern": _anchored(UNIT_NAME.pattern)},
            "additionalProperties": {
                "type": "integer",
                "minimum": 0,
                "maximum": MAX_UNITS_PER_EVENT,
            },
        }
    if name == "service_tier" and avro_type == ["null", "string"]:
        return {"type": ["string", "null"], "pattern": _anchored(SERVICE_TIER_NAME.pattern)}
    if name == "charge_of" and avro_type == ["null", "string"]:
        return {"type": ["string", "null"], "minLength": 1, "maxLength": MAX_ID_LENGTH}
    if isinstance(avro_type, dict) and avro_type.get("type") == "enum":
        return {"enum": list(avro_type["symbols"])}
    if avro_type == {"type": "array", "items": "string"}:
        return {"type": "array", "items": {"type": "string"}}
    if avro_type == {"type": "map", "values": "string"}:
        return {"type": "object", "additionalProperties": {"type": "string"}}
    # free text and numbers the validator does not bound
    plain: dict[str, dict[str, Any]] = {
        "string": {"type": "string"},
        "boolean": {"type": "boolean"},
        json.dumps(["null", "string"]): {"type": ["string", "null"]},
        json.dumps(["null", "int"]): {"type": ["integer", "null"]},
    }
    key = avro_type if isinstance(avro_type, str) else json.dumps(avro_type)
    if key in plain:
        return dict(plain[key])
    raise ContractError(
        f"UsageEvent.{name}: no JSON form for Avro type {json.dumps(avro_type)}; "
        "give it one in schemas/usage_json_schema.py"
    )


def _defaults() -> dict[str, object]:
    """Each optional field's value when the JSON form leaves it out."""
    given = {name: "x" for name in REQUIRED_IDS}
    sample = new_usage_event(
        **given, input_tokens=0, output_tokens=0, occurred_at=datetime(2026, 1, 1, tzinfo=UTC)
    )
    out = usage_event_to_json(sample)
    return {name: value for name, value in out.items() if name not in JSON_REQUIRED_FIELDS}


@cache
def usage_ingest_body_schema() -> dict[str, Any]:
    """The JSON Schema of ``POST /v1/usage``'s body."""
    avro = expanded_schemas()["UsageEvent"]
    defaults = _defaults()
    properties: dict[str, Any] = {}
    for field in avro["fields"]:
        name = field["name"]
        prop: dict[str, Any] = {}
        text = field.get("doc", "")
        if name in _PARTS:
            text = f"{text} At most {_PARTS[name]} (checked by the server).".strip()
        if name == "event_id":
            text += " Printable text (checked by the server)."
        if name == "occurred_at":
            text += " An RFC 3339 time with its offset (Z for UTC), or integer microseconds."
        if text:
            prop["description"] = text
        prop |= _property(name, field["type"])
        if name in defaults:
            prop["default"] = defaults[name]
        properties[name] = prop
    missing = set(JSON_REQUIRED_FIELDS) - set(properties)
    if missing:
        raise ContractError(f"JSON_REQUIRED_FIELDS names no UsageEvent field: {sorted(missing)}")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "spendbus HTTP ingest body (POST /v1/usage)",
        "description": (
            "A JSON array of UsageEvents in their JSON form, published all or nothing. "
            "Generated from schemas/avro/UsageEvent.avsc and schemas/usage.py."
        ),
        "type": "array",
        "items": {"$ref": "#/$defs/UsageEvent"},
        "$defs": {
            "UsageEvent": {
                "type": "object",
                "properties": properties,
                "required": list(JSON_REQUIRED_FIELDS),
                "additionalProperties": False,
            }
        },
    }


def schema_text() -> str:
    """The shipped file's text."""
    return json.dumps(usage_ingest_body_schema(), indent=2, ensure_ascii=False) + "\n"


def shipped_schema_bytes() -> bytes:
    """The shipped file's bytes, as the package holds them (what ``ingest serve`` answers)."""
    return (resources.files("schemas") / SHIPPED_FILE.as_posix()).read_bytes()


if __name__ == "__main__":
    # into the checkout this module runs from
    target = Path(__file__).resolve().parent / SHIPPED_FILE
    target.write_text(schema_text(), encoding="utf-8")
    print(target, file=sys.stderr)
