"""Golden captures: each read whole, byte by byte, gzipped, and split anywhere."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.taps import EstimatorConfig
from tests.ingest.taps.taps_support import (
    GOLDEN,
    case_id,
    expected,
    gzipped,
    response_bytes,
    run,
    split,
)

CASES = pytest.mark.parametrize("case", GOLDEN, ids=[case_id(c) for c in GOLDEN])


@CASES
def test_whole(case: dict[str, Any]) -> None:
    assert run(case, [response_bytes(case)]).as_dict() == expected(case)


@CASES
def test_one_byte_at_a_time(case: dict[str, Any]) -> None:
    """Every boundary at once: in the middle of UTF-8, CRLF, frames, numbers."""
    data = response_bytes(case)
    chunks = [data[i : i + 1] for i in range(len(data))]
    assert run(case, chunks).as_dict() == expected(case)


@CASES
def test_gzip_body(case: dict[str, Any]) -> None:
    data = gzipped(response_bytes(case))
    chunks = [data[i : i + 37] for i in range(0, len(data), 37)]
    assert run(case, chunks, content_encoding="gzip").as_dict() == expected(case)


@CASES
def test_detects_the_framing_without_a_content_type(case: dict[str, Any]) -> None:
    """No content type: the request's stream flag or the first bytes decide."""
    assert run(case, [response_bytes(case)], content_type=None).as_dict() == expected(case)


@CASES
def test_every_single_split_point(case: dict[str, Any]) -> None:
    """Two chunks, cut at each possible offset (sampled every few bytes on the
    larger captures to keep the suite fast; the byte-by-byte test covers all)."""
    data = response_bytes(case)
    want = expected(case)
    step = max(1, len(data) // 200)
    for point in range(1, len(data), step):
        assert run(case, split(data, [point])).as_dict() == want, point


@CASES
@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_split_anywhere_same_result(case: dict[str, Any], data: st.DataObject) -> None:
    raw = response_bytes(case)
    points = data.draw(st.lists(st.integers(0, len(raw)), max_size=12), label="cuts")
    gz = data.draw(st.booleans(), label="gzip")
    if gz:
        raw = gzipped(raw)
        points = [p % (len(raw) + 1) for p in points]
    result = run(case, split(raw, points), content_encoding="gzip" if gz else None)
    assert result.as_dict() == expected(case)


@CASES
def test_payload_bytes_mode_reads_the_same_usage(case: dict[str, Any]) -> None:
    """The cheaper estimate mode changes estimates only, never reported usage."""
    result = run(
        case, [response_bytes(case)], estimator=EstimatorConfig(delta_text="payload_bytes")
    )
    want = expected(case)
    if want["usage_source"] == "estimated":
        assert result.usage_source == "estimated"
        assert result.estimate_reason == want["estimate_reason"]
        assert result.output_tokens >= want["output_tokens"]
        assert result.input_tokens == want["input_tokens"]
    else:
        assert result.as_dict() == want


@CASES
def test_large_event_and_body_paths_read_the_same(case: dict[str, Any]) -> None:
    """With a tiny whole-parse limit every event and body goes through the
    incremental path scanner instead of json.loads: same usage."""
    from ingest.taps import open_tap
    from tests.ingest.taps.taps_support import request_bytes

    raw = response_bytes(case)
    tap = open_tap(
        case["format"],
        request_bytes(case),
        content_type=case.get("content_type"),
        status=case.get("status"),
        model=case.get("model"),
        response_headers=case.get("response_headers"),
    )
    tap.limit = 16
    if tap._sse is not None:
        tap._sse.limit = 16
    if tap._body is not None:
        tap._body.limit = 16
    for i in range(0, len(raw), 5):
        tap.feed(raw[i : i + 5])
    result = tap.finish(cut=case.get("cut"))
    want = expected(case)
    if want["usage_source"] == "estimated":
        # large events count their bytes as text: estimates only grow
        assert result.usage_source == "estimated"
        assert result.estimate_reason == want["estimate_reason"]
        assert result.output_tokens >= want["output_tokens"]
    else:
        assert result.as_dict() == want
