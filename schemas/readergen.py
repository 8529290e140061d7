"""Writes a record's generated body reader as a module, for mypyc to compile:
``python -m schemas.readergen UsageEvent aggregator/counting/usage_reader.py --raw-timestamps``."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path

from schemas.avro_reader import record_reader_source
from schemas.codec import Codec, codec_for


def reader_module_source(
    codec: Codec[Mapping[str, object]], *, raw_timestamps: bool = False
) -> str:
    """A module of :func:`record_reader_source` for ``codec``'s current schema, with the
    message header it reads (``HEADER``), so its user can tell it is not stale."""
    source = record_reader_source(
        codec.schema,
        raw_timestamps=raw_timestamps,
        docstring=(
            f"The {codec.name} body reader, generated from its schema by "
            f"``python -m schemas.readergen``: do not edit.\n\n"
            f"Timestamps are {'integer microseconds' if raw_timestamps else 'datetimes'}."
        ),
    )
    if source is None:
        raise ValueError(f"the {codec.name} schema has a type the reader generator does not read")
    return (
        f"{source}\n\n#: the message header (writer schema) this reader reads\n"
        f"HEADER: Final = {codec.header!r}\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("record", help="the record's schema name, e.g. UsageEvent")
    parser.add_argument("path", type=Path, help="the module to write")
    parser.add_argument("--raw-timestamps", action="store_true", help="timestamps as micros")
    args = parser.parse_args()
    source = reader_module_source(codec_for(args.record), raw_timestamps=args.raw_timestamps)
    args.path.write_text(source)
    print(f"wrote {args.path}")


if __name__ == "__main__":
    main()
