"""The generated Avro body writer of a record: a fraction of the CPU of fastavro's generic
writer (bench/records/history_ingest.md), byte-identical (a property test compares the two).

It takes only the value types it knows exactly; any other value raises, and the codec hands
the record to fastavro, which encodes it or raises its own error.

Avro binary (https://avro.apache.org/docs/1.11.1/specification/#binary-encoding): a record is
its fields in order; long/int are zig-zag varints; a string is its UTF-8 length then the bytes;
a [null, T] union is the branch index then the value; an enum is the symbol's index; an array
or map is one block (count, items) then a 0 count, or just 0 when empty (as fastavro writes them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

from schemas.codegen import GeneratedSource

#: a generated writer: the record's Avro body, or an exception for fastavro to decide
BodyWriter = Callable[[Mapping[str, object]], bytes]

_SMALL_LIMIT: Final = 8192


#: varint of z for 0 <= z < 2**14, and 14-bit groups of a longer varint (both bytes continued);
#: about 1 MiB, built once at import
_VARINT14: Final = tuple(
    [bytes((z,)) for z in range(0x80)]
    + [bytes(((z & 0x7F) | 0x80, z >> 7)) for z in range(0x80, 1 << 14)]
)
_GROUP14: Final = tuple([bytes(((z & 0x7F) | 0x80, (z >> 7) | 0x80)) for z in range(1 << 14)])
#: varint of the zig-zag of n (2n), for 0 <= n < _SMALL_LIMIT: lengths and most counts
_SMALL: Final = _VARINT14[::2]
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_INT32: Final = (-(2**31), 2**31 - 1)
_INT64: Final = (-(2**63), 2**63 - 1)


class _NotSpecialised(Exception):
    """A value the generated writer does not take: fastavro decides instead."""


def _varint(n: int, low: int, high: int) -> bytes:
    """Zig-zag varint of ``n``, which must lie in [low, high] (else fastavro decides)."""
    if not low <= n <= high:
        raise _NotSpecialised
    z = (n << 1) ^ (n >> 63)
    out = b""
    while z >= 0x4000:  # 14 bits at a time: a timestamp takes 4 steps, not 8
        out += _GROUP14[z & 0x3FFF]
        z >>= 14
    return out + _VARINT14[z]


def _long(n: int) -> bytes:
    return _SMALL[n] if 0 <= n < _SMALL_LIMIT else _varint(n, *_INT64)


def _int(n: int) -> bytes:
    return _SMALL[n] if 0 <= n < _SMALL_LIMIT else _varint(n, *_INT32)


def _emit_string(src: GeneratedSource, depth: int, var: str) -> None:
    encoded, size = src.name("b"), src.name("n")
    src.emit(depth, f"if type({var}) is not str: raise _NotSpecialised")
    # strict UTF-8: a lone surrogate raises, and fastavro names the error
    src.emit(depth, f"{encoded} = {var}.encode()")
    src.emit(
        depth,
        f"put(_SMALL[{size}] if ({size} := len({encoded})) < {_SMALL_LIMIT} else _long({size}))",
    )
    src.emit(depth, f"put({encoded})")


def _emit(src: GeneratedSource, depth: int, var: str, schema: Any) -> None:
    """Lines writing ``var`` of type ``schema``; raises _NotSpecialised for a type not covered."""
    if (
        isinstance(schema, dict)
        and schema.get("type") == "long"
        and (schema.get("logicalType") == "timestamp-micros")
    ):
        delta = src.name("d")
        src.emit(depth, f"if type({var}) is datetime and {var}.tzinfo is not None:")
        # fastavro's own arithmetic, so every aware datetime gives the same micros
        src.emit(depth + 1, f"{delta} = {var} - _EPOCH")
        src.emit(
            depth + 1,
            f"{var} = ({delta}.days * 86400 + {delta}.seconds) * 1000000 + {delta}.microseconds",
        )
        src.emit(depth, f"elif type({var}) is not int: raise _NotSpecialised")
        src.emit(depth, f"put(_long({var}))")
    elif isinstance(schema, dict) and "logicalType" in schema:
        raise _NotSpecialised
    elif schema in ("long", "int") or (
        isinstance(schema, dict) and schema["type"] in ("long", "int")
    ):
        kind = schema if isinstance(schema, str) else schema["type"]
        src.emit(depth, f"if type({var}) is not int: raise _NotSpecialised")
        src.emit(depth, f"put(_SMALL[{var}] if 0 <= {var} < {_SMALL_LIMIT} else _{kind}({var}))")
    elif schema == "string" or (isinstance(schema, dict) and schema["type"] == "string"):
        _emit_string(src, depth, var)
    elif schema == "boolean":
        src.emit(depth, f"if {var} is True: put(b'\\x01')")
        src.emit(depth, f"elif {var} is False: put(b'\\x00')")
        src.emit(depth, "else: raise _NotSpecialised")
    elif isinstance(schema, list):
        if len(schema) != 2 or "null" not in schema or any(isinstance(b, list) for b in schema):
            raise _NotSpecialised
        null_at = schema.index("null")
        src.emit(depth, f"if {var} is None: put({_SMALL[null_at]!r})")
        src.emit(depth, "else:")
        src.emit(depth + 1, f"put({_SMALL[1 - null_at]!r})")
        _emit(src, depth + 1, var, schema[1 - null_at])
    elif isinstance(schema, dict) and schema["type"] == "enum":
        table = src.constant({s: _SMALL[i] for i, s in enumerate(schema["symbols"])})
        index = src.name("i")
        src.emit(depth, f"{index} = {table}.get({var}) if type({var}) is str else None")
        src.emit(depth, f"if {index} is None: raise _NotSpecialised")
        src.emit(depth, f"put({index})")
    elif isinstance(schema, dict) and schema["type"] in ("array", "map"):
        is_map = schema["type"] == "map"
        src.emit(
            depth, f"if type({var}) is not {'dict' if is_map else 'list'}: raise _NotSpecialised"
        )
        src.emit(depth, f"if {var}:")
        src.emit(depth + 1, f"put(_long(len({var})))")
        item = src.name("v")
        if is_map:
            key = src.name("m")
            src.emit(depth + 1, f"for {key}, {item} in {var}.items():")
            _emit_string(src, depth + 2, key)
            _emit(src, depth + 2, item, schema["values"])
        else:
            src.emit(depth + 1, f"for {item} in {var}:")
            _emit(src, depth + 2, item, schema["items"])
        src.emit(depth, "put(b'\\x00')")
    else:  # records, fixed, bytes, floats...: fastavro's generic writer
        raise _NotSpecialised


def compile_record_writer(schema: dict[str, Any]) -> BodyWriter | None:
    """A function writing the Avro body of a record of ``schema`` (parsed, flat), or None when
    the schema uses a type it does not specialise.

    It accepts only exact value types (``str``, ``int``, ``bool``, ``list``, ``dict``, aware
    ``datetime``); anything else raises, and the caller hands the record to fastavro. A
    missing field takes its default, as fastavro does; a missing field without one raises.
    """
    src = GeneratedSource()
    # module-level names bound as defaults: locals are the cheapest lookups
    src.emit(0, "def write(record, _SMALL=_SMALL, _long=_long, _int=_int, str=str, int=int):")
    src.emit(1, "if type(record) is not dict: raise _NotSpecialised")
    src.emit(1, "out = []")
    src.emit(1, "put = out.append")
    try:
        for spec in schema["fields"]:
            var = src.name("f")
            name = spec["name"]
            if "default" in spec:
                default = src.constant(spec["default"])
                src.emit(1, f"{var} = record.get({name!r}, {default})")
            else:
                src.emit(1, f"{var} = record[{name!r}]")  # KeyError: fastavro decides
            _emit(src, 1, var, spec["type"])
    except _NotSpecialised:
        return None
    src.emit(1, "return b''.join(out)")
    writer: BodyWriter = src.define(
        "write",
        f"<avro writer {schema.get('name')}>",
        {
            "_NotSpecialised": _NotSpecialised,
            "_SMALL": _SMALL,
            "_long": _long,
            "_int": _int,
            "_EPOCH": _EPOCH,
            "datetime": datetime,
        },
    )
    return writer
