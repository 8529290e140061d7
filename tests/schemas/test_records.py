"""schemas/records.py is what the schemas generate, and each of its TypedDicts names exactly
the fields the codec decodes, nested records included."""

from __future__ import annotations

import typing
from datetime import UTC, datetime
from typing import Any

import pytest

from schemas import codec, records
from schemas.avro_schemas import expanded_schemas
from schemas.recordgen import RECORDS_MODULE, WRITE_RECORDS, records_module_source

#: each typed codec and the TypedDict its decode returns
TYPED = [
    (codec.PRICED_USAGE, records.PricedUsage),
    (codec.BUDGET_POLICY, records.BudgetPolicy),
    (codec.PRICE_TABLE, records.PriceTable),
    (codec.VERDICT, records.Verdict),
    (codec.ALERT, records.Alert),
    (codec.DEAD_LETTER, records.DeadLetter),
    (codec.GENERATION_SWITCH, records.GenerationSwitch),
    (codec.BUDGET_RAISE, records.BudgetRaise),
    (codec.JOB_APPROVAL, records.JobApproval),
    # decoded as plain dicts (see schemas/codec.py), of this shape all the same
    (codec.USAGE_EVENT, records.UsageEvent),
    (codec.GATEWAY_KEY, records.VirtualKey),
]


def test_the_records_module_is_what_the_schemas_generate() -> None:
    assert RECORDS_MODULE.read_text() == records_module_source(), f"stale: run {WRITE_RECORDS}"


def _sample(avro: Any, named: dict[str, Any]) -> Any:
    """A value of ``avro``: every nullable record and every array holds one, so that the
    nested records are decoded too."""
    if isinstance(avro, str):
        if avro in named:
            return _sample(named[avro], named)
        return {
            "string": "x",
            "long": 1,
            "int": 1,
            "double": 0.5,
            "float": 0.5,
            "boolean": True,
            "bytes": b"x",
            "null": None,
        }[avro]
    if isinstance(avro, list):
        branches = [b for b in avro if b != "null"]
        return _sample(branches[0], named)
    kind = avro["type"]
    if avro.get("logicalType") == "timestamp-micros":
        return datetime(2026, 12, 7, tzinfo=UTC)
    if kind == "array":
        return [_sample(avro["items"], named)]
    if kind == "map":
        return {"k": _sample(avro["values"], named)}
    if kind == "enum":
        named[avro["name"]] = named[f"spendbus.{avro['name']}"] = avro
        return avro["symbols"][0]
    if kind == "record":
        named[avro["name"]] = named[f"spendbus.{avro['name']}"] = avro
        return {f["name"]: _sample(f["type"], named) for f in avro["fields"]}
    return _sample(kind, named)


def _assert_same_keys(value: Any, hint: Any, where: str) -> None:
    if typing.is_typeddict(hint):
        assert isinstance(value, dict), where
        assert set(value) == set(hint.__required_keys__), where
        assert not hint.__optional_keys__, where
        for name, field_hint in typing.get_type_hints(hint).items():
            _assert_same_keys(value[name], field_hint, f"{where}.{name}")
        return
    for arg in typing.get_args(hint):  # list[X], dict[str, X], X | None
        if typing.is_typeddict(arg):
            items = value if isinstance(value, list) else [value]
            for item in items:
                if item is not None:
                    _assert_same_keys(item, arg, where)


@pytest.mark.parametrize(("typed", "record_type"), TYPED, ids=lambda v: getattr(v, "name", ""))
def test_a_decoded_record_has_exactly_its_typeddicts_keys(
    typed: codec.Codec[Any], record_type: Any
) -> None:
    assert record_type.__name__ == typed.name
    decoded = typed.decode(typed.encode(_sample(typed.schema, {})))
    _assert_same_keys(decoded, record_type, typed.name)


def test_every_current_schema_has_a_typeddict() -> None:
    assert {c.name for c, _ in TYPED} == set(expanded_schemas())
