"""The partition of a `usage.raw` record, as docs/contract.md gives it to producers in other
languages: the publisher's rule (`partition_index`), Apache Kafka's Java producer (its
default partitioner, run from the broker's own jars) and the guide's table of keys agree
(issue 38)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from ingest.publisher.sender import partition_index
from schemas.ids import canonical_id
from spendbus.stack.broker_jars import ensure_broker_jars

ROOT = Path(__file__).resolve().parents[3]
GUIDE = ROOT / "docs" / "contract.md"
#: partition counts the guide's table gives
COUNTS = (4, 12)


def guide_rows() -> list[tuple[str, str, int, int]]:
    """(org_id as sent, key as shown, partition of 4, of 12) of the guide's table."""
    row = re.compile(r"^\| `([^`]+)` \| `([^`]+)` \| (\d+) \| (\d+) \|$", re.MULTILINE)
    return [(a, b, int(c), int(d)) for a, b, c, d in row.findall(GUIDE.read_text("utf-8"))]


def key_of(org_id: str) -> bytes:
    return canonical_id(org_id, "org_id").encode("utf-8")


def java_partitions(keys: list[bytes]) -> list[list[int]]:
    """The Java producer's partition of each key among each of COUNTS, in one JVM."""
    java = shutil.which("java")
    assert java is not None, "Java 17 is needed to run Kafka's Java partitioner"
    program = Path(__file__).resolve().parent / "PartitionOf.java"
    command = [java, "-cp", f"{ensure_broker_jars()}/*", str(program), *map(str, COUNTS)]
    done = subprocess.run(
        command,
        input="".join(k.hex() + "\n" for k in keys),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    lines = [line.split("\t") for line in done.stdout.splitlines()]
    assert [bytes.fromhex(line[0]) for line in lines] == keys
    return [[int(p) for p in line[1:]] for line in lines]


def test_the_guides_table_is_the_publishers_rule_and_the_java_producers() -> None:
    rows = guide_rows()
    assert len(rows) >= 5, "the table of keys was not found in docs/contract.md"
    keys = [key_of(org_id) for org_id, *_ in rows]
    for (org_id, shown, *partitions), key in zip(rows, keys, strict=True):
        assert shown in (key.decode(), " ".join(f"{b:02x}" for b in key)), org_id
        assert [partition_index(key, n) for n in COUNTS] == partitions, org_id
    assert java_partitions(keys) == [[p4, p12] for *_, p4, p12 in rows]


def test_the_java_producer_agrees_over_many_keys() -> None:
    """Beyond the table: ids of every length, non-ASCII and case kept."""
    keys = [key_of(f"org-{i}-{'é' * (i % 5)}{'X' * (i % 7)}") for i in range(300)]
    expected = [[partition_index(key, n) for n in COUNTS] for key in keys]
    assert java_partitions(keys) == expected
    assert len({p[1] for p in expected}) == COUNTS[1]  # the keys reach every partition
