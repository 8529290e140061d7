"""Every schema file spendbus ships parses alone in a second Avro implementation.

A producer in another language loads one ``.avsc`` at a time: Avro Java's
``Schema.Parser`` (the implementation issue 38's Java producer met) reads each file of
``schemas/avro/standalone/`` and ``schemas/avro/history/`` on its own, in one JVM, and
its CRC-64-AVRO of the Parsing Canonical Form must be the fingerprint the Python codec
writes. Avro Java is fetched from Maven Central once (``tests/schemas/java/pom.xml``) into
the spendbus cache (``SPENDBUS_CACHE_DIR``, as the broker's jars are; tests/schemas/kit.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from schemas.avro_schemas import (
    SCHEMA_NAMES,
    defining_files,
    fingerprint,
    history_versions,
)
from schemas.avscgen import STANDALONE_DIR, standalone_text
from schemas.codec import codec_for
from tests.schemas.kit import run_java

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "schemas"


def parse_alone_in_java(files: list[Path]) -> dict[Path, tuple[str, str]]:
    """Each file's (``ok``, fingerprint hex) or (``error``, message), from one JVM."""
    out = run_java("ParseAlone.java", [str(f) for f in files])
    results = {}
    for line in out.splitlines():
        path, status, detail = line.split("\t", 2)
        results[Path(path)] = (status, detail)
    assert set(results) == set(files), f"ParseAlone answered for other files:\n{out}"
    return results


def shipped_schema_files() -> list[Path]:
    """The files another language reads: the standalone set and every released version."""
    standalone = sorted((SCHEMAS / STANDALONE_DIR).glob("*.avsc"))
    return standalone + sorted((SCHEMAS / "avro" / "history").glob("*/v*.avsc"))


def test_the_standalone_set_is_the_expanded_schemas_as_generated() -> None:
    """`python -m schemas.avscgen` wrote it: one file per current schema, nothing else."""
    folder = SCHEMAS / STANDALONE_DIR
    assert sorted(p.stem for p in folder.glob("*.avsc")) == sorted(SCHEMA_NAMES)
    stale = [n for n in SCHEMA_NAMES if (folder / f"{n}.avsc").read_text() != standalone_text(n)]
    assert not stale, f"rewrite with `python -m schemas.avscgen`: {stale} are not current"


def test_every_shipped_schema_parses_alone_in_avro_java_with_pythons_fingerprint() -> None:
    files = shipped_schema_files()
    assert len(files) > len(SCHEMA_NAMES)
    results = parse_alone_in_java(files)
    failed = {p: detail for p, (status, detail) in results.items() if status != "ok"}
    assert not failed, f"Avro Java cannot parse these alone: {failed}"
    for path, (_, java_fingerprint) in results.items():
        schema = json.loads(path.read_text())
        assert java_fingerprint == fingerprint(schema).hex(), path
    # the standalone files are what the codec writes today, and history holds every release
    for name in SCHEMA_NAMES:
        current = results[SCHEMAS / STANDALONE_DIR / f"{name}.avsc"][1]
        assert current == codec_for(name).header[2:].hex(), name
        released = {fingerprint(v).hex() for v in history_versions(name)}
        assert current in released, name


def test_the_checker_reports_a_file_that_does_not_stand_alone() -> None:
    """The sources share named types: Verdict.avsc alone names a type it does not define."""
    source = SCHEMAS / "avro" / "Verdict.avsc"
    status, detail = parse_alone_in_java([source])[source]
    assert status == "error"
    assert "Undefined schema: spendbus.BudgetAction" in detail


def test_the_readme_maps_every_named_type_to_the_file_that_defines_it() -> None:
    text = (SCHEMAS / "README.md").read_text(encoding="utf-8")
    section = text.split("## Named types", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| `([\w.]+)` \| `avro/(\w+\.avsc)` \|", section, re.MULTILINE))
    assert rows == defining_files()
