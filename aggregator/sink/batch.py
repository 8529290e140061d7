"""The sink's work per record of a batch, each rule walked once over the batch.

Reading each record's store-row header, the fence check, an insert's fence tops and
token, and the Avro bodies: little a record, but on the GIL the counting stage in the
same process needs (issue 19). The rules are clickhouse.py's (its module docstring).
Compiled with mypyc these loops measured no faster (they are dict, tuple and bytes
operations on Python objects), so this module stays interpreted.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Final

from schemas.topics import STORE_ROW, STORE_ROW_HEADER

#: (source partition, YYYYMM) -> the highest source offset stored
FenceKey = tuple[int, int]
#: a record to store: its fence key, its source offset, its row (a tuple, or the Avro
#: message the engine decodes) and its store-row header (the bytes its token is made of)
Item = tuple[FenceKey, int, Any, bytes]

_STORE_ROW_SIZE: Final = STORE_ROW.size


def avro_items(messages: Sequence[Any], body_prefix: bytes) -> list[Item | None]:
    """Per Kafka record, its item when the engine can store it from its bytes (a current
    PricedUsage body with a valid store-row header), else None (it is decoded instead)."""
    out: list[Item | None] = []
    for message in messages:
        value = message.value
        item: Item | None = None
        if value is not None and value.startswith(body_prefix):
            for name, data in message.headers:
                if name == STORE_ROW_HEADER:
                    item = _item(value, data)
                    break
        out.append(item)
    return out


def _item(value: bytes, header: bytes) -> Item | None:
    # schemas.topics.parse_store_row, inlined: a call per record costs more than the check
    if len(header) != _STORE_ROW_SIZE:
        return None
    partition, offset, month = STORE_ROW.unpack(header)
    if partition < 0 or offset < 0 or not 100_001 <= month <= 999_912:
        return None
    return ((partition, month), offset, value, header)


def fresh(
    items: Sequence[Item], kinds: Sequence[bool] | None, fences: dict[FenceKey, int]
) -> tuple[list[Item], list[bool] | None]:
    """Items above their fence, first occurrence of each (partition, offset) only, with
    their kinds."""
    seen: set[tuple[int, int]] = set()
    out: list[Item] = []
    out_kinds: list[bool] | None = None if kinds is None else []
    for n, item in enumerate(items):
        key, offset = item[0], item[1]
        position = (key[0], offset)
        if offset <= fences.get(key, -1) or position in seen:
            continue
        seen.add(position)
        out.append(item)
        if kinds is not None and out_kinds is not None:
            out_kinds.append(kinds[n])
    return out, out_kinds


def tops_token_rows(
    items: Sequence[Item], table: str
) -> tuple[dict[FenceKey, int], str, list[Any]]:
    """An insert's fence tops, its deduplication token (from its positions, in order) and
    its rows."""
    tops: dict[FenceKey, int] = {}
    positions: list[bytes] = []
    rows: list[Any] = []
    for key, offset, row, position in items:
        if offset > tops.get(key, -1):
            tops[key] = offset
        positions.append(position)
        rows.append(row)
    digest = hashlib.sha256(table.encode())
    digest.update(b"".join(positions))
    return tops, f"spendbus-{digest.hexdigest()}", rows


def bodies(messages: Sequence[bytes], header_len: int) -> tuple[list[bytes], int]:
    """The Avro bodies of single-object encoded ``messages`` and their total size."""
    out: list[bytes] = []
    size = 0
    for message in messages:
        # a slice copies one small body: cheaper than joining memoryviews instead
        body = message[header_len:]
        size += len(body)
        out.append(body)
    return out, size


def runs(items: list[Item], kinds: list[bool] | None, step: int) -> list[tuple[list[Item], bool]]:
    """The items in order as INSERTs: runs of one kind (Avro or tuples), at most ``step``
    rows each."""
    out: list[tuple[list[Item], bool]] = []
    start = 0
    while start < len(items):
        avro = kinds[start] if kinds is not None else False
        end = start + 1
        limit = min(len(items), start + step)
        while end < limit and (kinds[end] if kinds is not None else False) == avro:
            end += 1
        out.append((items[start:end], avro))
        start = end
    return out
