"""The public surface of ingest.taps and its promises."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import ingest.taps
from ingest.taps import FORMATS, EstimatorConfig, TapResult, open_tap
from ingest.taps.request import RequestInfo
from ingest.taps.usage import Usage


def test_public_names() -> None:
    assert sorted(ingest.taps.__all__) == sorted(
        [
            "FORMATS",
            "ContentDecoder",
            "ContentDecodingError",
            "EstimatorConfig",
            "RealtimeTap",
            "RequestInfo",
            "Tap",
            "TapResult",
            "Usage",
            "UsageSource",
            "inspect_response",
            "json_loads",
            "open_realtime_tap",
            "open_tap",
            "read_request",
            "supported_encodings",
        ]
    )
    assert FORMATS == (
        "anthropic-messages",
        "openai-chat",
        "openai-responses",
        "gemini",
        "bedrock-converse",
        "bedrock-invoke",
    )


def test_unknown_format_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unknown tap format"):
        open_tap("cohere", None)


def test_result_is_frozen_and_validated() -> None:
    result = TapResult("m", input_tokens=1, output_tokens=2, usage_source="reported")
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.input_tokens = 5  # type: ignore[misc]  # frozen: the assignment is what is refused
    with pytest.raises(ValueError):
        TapResult("m", input_tokens=-1)
    with pytest.raises(ValueError):
        TapResult("m", usage_source="estimated")  # no reason
    with pytest.raises(ValueError):
        TapResult("m", output_tokens=1, reasoning_tokens=2)
    with pytest.raises(ValueError):
        TapResult("m", cache_write_tokens=1, cache_write_1h_tokens=2)
    assert "estimate_reason" not in result.as_dict()
    assert result.total_tokens == 3


@pytest.mark.parametrize(
    ("cls", "kwargs"),
    [
        (Usage, {"input_tokens": 3, "output_tokens": 2, "reasoning_tokens": 1}),
        (TapResult, {"model": "m", "output_tokens": 2, "usage_source": "reported"}),
        (RequestInfo, {"size": 10, "max_output_tokens": 5, "server_state": ("a file by id",)}),
    ],
)
def test_value_classes_keep_their_dataclass_behaviour(cls: Any, kwargs: dict[str, Any]) -> None:
    """They write their own compiled ``__init__`` (usage.py): still frozen dataclasses with
    defaults, equality, hashing, ``repr`` and ``replace``."""
    value = cls(**kwargs)
    for name, given in kwargs.items():
        assert getattr(value, name) == given
    assert value == cls(**kwargs) and hash(value) == hash(cls(**kwargs))
    assert repr(value).startswith(cls.__name__ + "(")
    first = dataclasses.fields(cls)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, first, getattr(value, first))
    changed = dataclasses.replace(value, **{first: getattr(value, first)})
    assert changed == value and changed is not value
    assert cls(**{**kwargs}) != dataclasses.replace(value, **_other(cls))


def _other(cls: Any) -> dict[str, Any]:
    others: dict[Any, dict[str, Any]] = {
        Usage: {"input_tokens": 4},
        TapResult: {"model": "n"},
        RequestInfo: {"size": 11},
    }
    return others[cls]


def test_usage_names_the_first_invalid_count() -> None:
    with pytest.raises(ValueError, match="cache_read_tokens must be an int >= 0"):
        Usage(input_tokens=1, cache_read_tokens=-1, output_tokens=-1)
    with pytest.raises((TypeError, ValueError)):  # TypeError at the compiled signature
        Usage(output_tokens="3")  # type: ignore[arg-type]  # a str is what is refused
    with pytest.raises(ValueError, match="reasoning_tokens exceeds output_tokens"):
        Usage(output_tokens=1, reasoning_tokens=2)


def test_finish_is_idempotent_and_feed_after_finish_is_ignored() -> None:
    tap = open_tap("openai-chat", {"model": "m"}, streaming=True)
    first = tap.finish()
    tap.feed(b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}\n\n')
    assert tap.finish() is first


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_empty_2xx_response_is_never_free(fmt: str) -> None:
    for streaming in (True, False, None):
        result = open_tap(fmt, {"model": "m", "max_tokens": 10}, streaming=streaming).finish()
        assert result.usage_source == "estimated"
        assert result.estimate_reason == "no_usage: the response body is empty"
        assert result.total_tokens > 0


def test_feed_accepts_memoryview_and_bytearray() -> None:
    tap = open_tap("openai-chat", None, streaming=True)
    tap.feed(memoryview(b'data: {"choices":[],"usage":{"prompt_tokens":3,'))
    tap.feed(bytearray(b'"completion_tokens":4}}\n\ndata: [DONE]\n\n'))
    result = tap.finish()
    assert (result.input_tokens, result.output_tokens) == (3, 4)


def test_unknown_cut_reason_is_kept_short() -> None:
    result = open_tap("gemini", None, streaming=True).finish(cut="socket reset " * 20)
    assert result.estimate_reason is not None and len(result.estimate_reason) <= 60


def test_non_2xx_with_a_streaming_content_type_is_read_as_an_error_body() -> None:
    tap = open_tap("anthropic-messages", None, status=400, content_type="text/event-stream")
    tap.feed(b'{"type":"error","error":{"type":"invalid_request_error","message":"bad"}}')
    result = tap.finish()
    assert result.usage_source == "none"
    assert result.upstream_error == "HTTP 400: invalid_request_error: bad"


def test_non_2xx_with_an_unreadable_body() -> None:
    tap = open_tap("openai-chat", None, status=502)
    tap.feed(b"<html>Bad Gateway</html>")
    result = tap.finish()
    assert (result.usage_source, result.upstream_error) == ("none", "HTTP 502")


def test_estimator_is_a_frozen_value() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        EstimatorConfig().output_cap = 1  # type: ignore[misc]  # frozen: the assignment is what is refused
