"""Writes a record's generated body reader as a module, for mypyc to compile:
``python -m schemas.readergen UsageEvent aggregator/usage_reader.py --raw-timestamps``."""

from __future__ import annotations

import argparse
from pathlib import Path

from schemas.codec import codec_for, reader_module_source


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
