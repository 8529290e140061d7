"""`spendbus price --batch FILE.jsonl`: one JSON call a line, read and checked.

A line is an object with the fields of one `spendbus price` call: ``model`` (required),
the token counts ``input_tokens``, ``output_tokens``, ``cache_read_tokens``,
``cache_write_tokens``, ``cache_write_1h_tokens`` (integers >= 0, default 0), ``units``
(an object of unit name to count), ``service_tier`` and ``at`` (an RFC 3339 time, else
the command's ``--at``). Anything else is refused by name, so a misspelt field is an
error rather than a call priced without it. :class:`BadLine` names the field; the
command writes it as that line's result and goes on with the next.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

from schemas.usage import PRICED_TOKEN_FIELDS

_FIELDS: Final = frozenset({"model", "units", "service_tier", "at", *PRICED_TOKEN_FIELDS})


class BadLine(ValueError):
    """A line that is not one priceable call; the message starts with the field at fault."""


@dataclass(frozen=True)
class PriceCall:
    """One call to price, as a line gives it."""

    model: str
    tokens: dict[str, int]
    units: dict[str, int]
    service_tier: str | None
    at: str | None


def _count(value: Any, field: str) -> int:
    # JSON's true is not a count, though Python's bool is an int
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadLine(f"{field}: must be an integer >= 0, got {json.dumps(value)}")
    return value


def _optional_text(line: dict[str, Any], field: str) -> str | None:
    value = line.get(field)
    if value is not None and not isinstance(value, str):
        raise BadLine(f"{field}: must be a string, got {json.dumps(value)}")
    return value


def read_call(text: str) -> PriceCall:
    """The call one line of a batch gives; :class:`BadLine` naming the field if none."""
    try:
        line = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadLine(f"not JSON: {exc.msg} at column {exc.colno}") from None
    if not isinstance(line, dict):
        raise BadLine(f"must be a JSON object, got {type(line).__name__}")
    unknown = sorted(set(line) - _FIELDS)
    if unknown:
        raise BadLine(f"{unknown[0]}: not a field of a call (fields: {', '.join(sorted(_FIELDS))})")
    model = line.get("model")
    if not isinstance(model, str) or not model.strip():
        raise BadLine(f"model: must be a non-empty string, got {json.dumps(model)}")
    units = line.get("units", {})
    if not isinstance(units, dict):
        raise BadLine(f"units: must be an object of unit name to count, got {json.dumps(units)}")
    return PriceCall(
        model=model,
        tokens={name: _count(line.get(name, 0), name) for name in PRICED_TOKEN_FIELDS},
        units={name: _count(count, f"units.{name}") for name, count in units.items()},
        service_tier=_optional_text(line, "service_tier"),
        at=_optional_text(line, "at"),
    )


__all__ = ["BadLine", "PriceCall", "read_call"]
