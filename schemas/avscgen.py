"""Writes ``avro/standalone/<Name>.avsc``: every current schema expanded to stand alone.

The sources in ``avro/*.avsc`` share named types (``Verdict.avsc`` uses the
``BudgetAction`` that ``BudgetPolicy.avsc`` defines), so a library that parses one file
at a time (Avro Java's ``Schema.Parser``, ``avsc`` on Node) cannot read them alone. The
standalone set is what other languages load; it is written from ``expanded_schemas``,
never by hand, and ``tests/schemas/test_standalone_schemas.py`` holds it current.

``python -m schemas.avscgen`` rewrites the set in this checkout.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Final

from schemas.avro_schemas import SCHEMA_NAMES, expanded_schemas

#: the standalone set's folder, from the package's root
STANDALONE_DIR: Final = Path("avro") / "standalone"


def standalone_text(name: str) -> str:
    """The text of ``avro/standalone/<name>.avsc``: the current schema, expanded."""
    return json.dumps(expanded_schemas()[name], indent=2) + "\n"


def write_standalone(folder: Path) -> list[Path]:
    """Write every current schema's standalone file into ``folder``; the files written."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name in SCHEMA_NAMES:
        path = folder / f"{name}.avsc"
        path.write_text(standalone_text(name), encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":
    # beside the sources they are expanded from, in the checkout this module runs from
    for path in write_standalone(Path(__file__).resolve().parent / STANDALONE_DIR):
        print(path, file=sys.stderr)
