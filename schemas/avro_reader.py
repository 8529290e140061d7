"""The generated Avro body reader of a record, the mirror of the generated writer, for the
hot path of the aggregator (one UsageEvent per record).

It reads only what is plainly valid: varints of at most 10 bytes below 2**64, lengths
and counts >= 0 within the data, union and enum indexes in range, booleans 0 or 1, strict
UTF-8. Anything else raises, and the caller decodes the message with the codec (fastavro),
whose result or DecodeError then stands: the generated reader never decides an error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from schemas.codegen import GeneratedSource

#: a generated reader: (message, offset of the body) -> (record, offset past it), or an exception
BodyReader = Callable[[bytes, int], tuple[dict[str, Any], int]]


class _NotPlain(Exception):
    """Input the generated reader does not take: the codec decides."""


def _emit_read_long(src: GeneratedSource, depth: int, var: str) -> None:
    byte = src.name("b")
    src.emit(depth, f"{byte} = data[pos]")
    src.emit(depth, f"if {byte} < 0x80:")
    src.emit(depth + 1, f"{var} = ({byte} >> 1) ^ -({byte} & 1)")
    src.emit(depth + 1, "pos += 1")
    src.emit(depth, "else:")
    src.emit(depth + 1, f"{var}, pos = _read_varint(data, pos)")


def _emit_read_count(src: GeneratedSource, depth: int, var: str) -> None:
    """A length or block count: never negative here (fastavro decides about a negative one)."""
    byte = src.name("b")
    src.emit(depth, f"{byte} = data[pos]")
    src.emit(depth, f"if {byte} < 0x80 and not {byte} & 1:")  # 0..63: one byte, even
    src.emit(depth + 1, f"{var} = {byte} >> 1")
    src.emit(depth + 1, "pos += 1")
    src.emit(depth, "else:")
    src.emit(depth + 1, f"{var}, pos = _read_varint(data, pos)")
    src.emit(depth + 1, f"if {var} < 0: raise NotPlain")


def _emit_read_string(src: GeneratedSource, depth: int, var: str) -> None:
    size, end = src.name("n"), src.name("e")
    _emit_read_count(src, depth, size)
    src.emit(depth, f"{end} = pos + {size}")
    src.emit(depth, f"if {end} > size: raise NotPlain")
    src.emit(depth, f"{var} = data[pos:{end}].decode()")  # strict UTF-8
    src.emit(depth, f"pos = {end}")


def _python_type(schema: Any, raw_timestamps: bool) -> str:
    """The annotation of a value of ``schema`` as the generated reader returns it."""
    if isinstance(schema, dict) and schema.get("logicalType") == "timestamp-micros":
        return "int" if raw_timestamps else "datetime"
    if isinstance(schema, list):
        if len(schema) != 2 or "null" not in schema:
            raise _NotPlain
        other = schema[1 - schema.index("null")]
        return f"{_python_type(other, raw_timestamps)} | None"
    kind = schema["type"] if isinstance(schema, dict) else schema
    if kind == "array":
        return f"list[{_python_type(schema['items'], raw_timestamps)}]"
    if kind == "map":
        return f"dict[str, {_python_type(schema['values'], raw_timestamps)}]"
    if kind not in _PYTHON_TYPES:  # records, fixed, bytes, floats...: not specialised
        raise _NotPlain
    return _PYTHON_TYPES[kind]


_PYTHON_TYPES: Final = {
    "long": "int",
    "int": "int",
    "string": "str",
    "boolean": "bool",
    "enum": "str",
}


def _emit_read(
    src: GeneratedSource, depth: int, var: str, schema: Any, raw_timestamps: bool
) -> None:
    """Lines reading ``var`` of type ``schema``; raises _NotPlain for a type not covered."""
    if isinstance(schema, dict) and schema.get("logicalType") == "timestamp-micros":
        if schema.get("type") != "long":
            raise _NotPlain
        if raw_timestamps:
            _emit_read_long(src, depth, var)
        else:  # fastavro's own conversion (an OverflowError: the codec decides)
            micros = src.name("t")
            _emit_read_long(src, depth, micros)
            src.emit(depth, f"{var} = _EPOCH + timedelta(microseconds={micros})")
    elif isinstance(schema, dict) and "logicalType" in schema:
        raise _NotPlain
    elif schema in ("long", "int") or (
        isinstance(schema, dict) and schema["type"] in ("long", "int")
    ):
        _emit_read_long(src, depth, var)
    elif schema == "string" or (isinstance(schema, dict) and schema["type"] == "string"):
        _emit_read_string(src, depth, var)
    elif schema == "boolean":
        byte = src.name("b")
        src.emit(depth, f"{byte} = data[pos]")
        src.emit(depth, "pos += 1")
        src.emit(depth, f"if {byte} == 1: {var} = True")
        src.emit(depth, f"elif {byte} == 0: {var} = False")
        src.emit(depth, "else: raise NotPlain")
    elif isinstance(schema, list):
        if len(schema) != 2 or "null" not in schema or any(isinstance(b, list) for b in schema):
            raise _NotPlain
        null_at = schema.index("null")
        byte, value = src.name("b"), src.name("u")
        src.emit(depth, f"{byte} = data[pos]")
        src.emit(depth, "pos += 1")
        src.emit(depth, f"if {byte} == {2 * null_at}: {var} = None")
        src.emit(depth, f"elif {byte} == {2 * (1 - null_at)}:")
        # the branch reads into a variable of the branch's own type (typed for mypyc)
        other = schema[1 - null_at]
        src.emit(depth + 1, f"{value}: {_python_type(other, raw_timestamps)}")
        _emit_read(src, depth + 1, value, other, raw_timestamps)
        src.emit(depth + 1, f"{var} = {value}")
        src.emit(depth, "else: raise NotPlain")
    elif isinstance(schema, dict) and schema["type"] == "enum":
        symbols = src.constant(tuple(schema["symbols"]))
        index = src.name("i")
        _emit_read_long(src, depth, index)
        src.emit(depth, f"if not 0 <= {index} < {len(schema['symbols'])}: raise NotPlain")
        src.emit(depth, f"{var} = {symbols}[{index}]")
    elif isinstance(schema, dict) and schema["type"] in ("array", "map"):
        is_map = schema["type"] == "map"
        count, item = src.name("c"), src.name("v")
        item_schema = schema["values" if is_map else "items"]
        src.emit(depth, f"{var} = {{}}" if is_map else f"{var} = []")
        src.emit(depth, "while True:")
        _emit_read_count(src, depth + 1, count)
        src.emit(depth + 1, f"if not {count}: break")
        src.emit(depth + 1, f"for _ in range({count}):")
        src.emit(depth + 2, f"{item}: {_python_type(item_schema, raw_timestamps)}")
        if is_map:
            key = src.name("m")
            _emit_read_string(src, depth + 2, key)
            _emit_read(src, depth + 2, item, item_schema, raw_timestamps)
            src.emit(depth + 2, f"{var}[{key}] = {item}")
        else:
            _emit_read(src, depth + 2, item, item_schema, raw_timestamps)
            src.emit(depth + 2, f"{var}.append({item})")
    else:  # records, fixed, bytes, floats...: fastavro's generic reader
        raise _NotPlain


#: what every generated reader module starts with: its imports, its error, the varint
#: reader (a copy of _read_varint, so a compiled module calls it natively)
_READER_PRELUDE: Final = '''
from datetime import UTC, datetime, timedelta
from typing import Any, Final


class NotPlain(Exception):
    """Input this reader does not take: the codec decides."""


_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """The zig-zag decoded long at ``pos`` (a multi-byte varint) and the offset past it."""
    z = 0
    shift = 0
    while True:
        b = data[pos]  # IndexError past the end: the codec decides
        pos += 1
        z |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
        if shift > 63:
            raise NotPlain
    if z >= 1 << 64:
        raise NotPlain
    return (z >> 1) ^ -(z & 1), pos
'''


def record_reader_source(
    schema: dict[str, Any], *, raw_timestamps: bool = False, docstring: str = ""
) -> str | None:
    """The Python module (typed: mypyc compiles it) whose ``read(data, pos)`` reads the
    Avro body of a record of ``schema`` (parsed, flat) written with that same schema;
    None when the schema uses a type it does not specialise.

    ``read`` returns the record (the dict fastavro's ``schemaless_reader`` returns) and
    the offset past the body; on any input it does not plainly take it raises, and the
    caller decodes with the codec instead. ``raw_timestamps``: leave ``timestamp-micros``
    fields as integer microseconds (for a caller that wants them so).
    """
    src = GeneratedSource()
    src.emit(0, "def read(data: bytes, pos: int) -> tuple[dict[str, Any], int]:")
    src.emit(1, "size = len(data)")
    names = []
    try:
        for spec in schema["fields"]:
            var = src.name("f")
            names.append((spec["name"], var))
            src.emit(1, f"{var}: {_python_type(spec['type'], raw_timestamps)}")
            _emit_read(src, 1, var, spec["type"], raw_timestamps)
    except _NotPlain:
        return None
    src.emit(1, "return {" + ", ".join(f"{name!r}: {var}" for name, var in names) + "}, pos")
    constants = [f"{name}: Final = {value!r}" for name, value in src.constants.items()]
    head = f'"""{docstring}"""\n' if docstring else ""
    return "\n".join([head + _READER_PRELUDE, *constants, "", "", *src.lines, ""])


def compile_record_reader(
    schema: dict[str, Any], *, raw_timestamps: bool = False
) -> BodyReader | None:
    """``read`` of :func:`record_reader_source`, compiled here (None: no such reader)."""
    source = record_reader_source(schema, raw_timestamps=raw_timestamps)
    if source is None:
        return None
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<avro reader {schema.get('name')}>", "exec"), namespace)
    reader: BodyReader = namespace["read"]
    return reader
