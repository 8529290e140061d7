"""Helpers of the tap tests: captures, golden cases, feeding in chunks."""

from __future__ import annotations

import base64
import gzip
import itertools
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ingest.taps import EstimatorConfig, TapResult, open_tap
from ingest.taps.eventstream import encode_message

CAPTURES = Path(__file__).parent / "captures"
GOLDEN: list[dict[str, Any]] = json.loads((CAPTURES / "golden.json").read_text())

ZERO = {
    "input_tokens": 0,
    "cache_read_tokens": 0,
    "cache_write_tokens": 0,
    "cache_write_1h_tokens": 0,
    "output_tokens": 0,
    "reasoning_tokens": 0,
    "usage_source": "reported",
}


def capture(path: str) -> bytes:
    return (CAPTURES / path).read_bytes()


def encode_events(path: str) -> list[bytes]:
    """Bedrock captures are kept readable: a JSON list of messages to encode. An item with
    ``chunk`` (InvokeModelWithResponseStream) is written as Bedrock sends it: the payload
    ``{"bytes": <base64 of the Anthropic event's JSON>, "p": <padding>}``."""
    spec = json.loads(capture(path))
    return [encode_message(item["headers"], json.dumps(_payload(item)).encode()) for item in spec]


def _payload(item: dict[str, Any]) -> Any:
    if "chunk" not in item:
        return item["payload"]
    event = json.dumps(item["chunk"], separators=(",", ":")).encode()
    return {"bytes": base64.b64encode(event).decode(), "p": item["p"]}


def corrupt(frame: bytes) -> bytes:
    """Flip one payload byte: the message CRC no longer matches."""
    broken = bytearray(frame)
    broken[-6] ^= 0x01
    return bytes(broken)


def response_bytes(case: dict[str, Any]) -> bytes:
    path = case["response"]
    if path.endswith(".events.json"):
        frames = encode_events(path)
        if "corrupt_frame" in case:
            index = case["corrupt_frame"]
            frames[index] = corrupt(frames[index])
        if "frames_limit" in case:
            frames = frames[: case["frames_limit"]]
        return b"".join(frames)
    raw = capture(path)
    marker = case.get("truncate_before")
    if marker:
        raw = raw[: raw.index(marker.encode())]
    return raw


def request_bytes(case: dict[str, Any]) -> bytes | None:
    return capture(case["request"]) if case.get("request") else None


def expected(case: dict[str, Any]) -> dict[str, Any]:
    return {**ZERO, **case["expect"]}


def run(
    case: dict[str, Any],
    chunks: Iterable[bytes],
    *,
    content_encoding: str | None = None,
    estimator: EstimatorConfig | None = None,
    content_type: str | None = "from-case",
) -> TapResult:
    tap = open_tap(
        case["format"],
        request_bytes(case),
        content_type=case.get("content_type") if content_type == "from-case" else content_type,
        content_encoding=content_encoding,
        status=case.get("status"),
        model=case.get("model"),
        estimator=estimator or EstimatorConfig(),
        response_headers=case.get("response_headers"),
    )
    for chunk in chunks:
        tap.feed(chunk)
    return tap.finish(cut=case.get("cut"))


def split(data: bytes, points: Sequence[int]) -> list[bytes]:
    """``data`` cut at the given offsets (any order, duplicates allowed)."""
    bounds = [0, *sorted({p for p in points if 0 < p < len(data)}), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def gzipped(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def case_id(case: dict[str, Any]) -> str:
    name: str = case["name"]
    return name.split(":")[0].replace(" ", "-") + "-" + str(GOLDEN.index(case))
