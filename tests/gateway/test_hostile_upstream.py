"""An upstream that reports less than it billed (issue 32, item 6), through the real gateway
and a real broker: for every format, streamed and whole, each hostile shape of the fake
provider (``x-fake-hostile``: a usage given twice, the second zero, its key escaped, a
count given twice, a zero report after the real one, a cheaper model named) is charged on
usage.raw at least what the provider billed, at the model requested."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from schemas.topics import Topics
from spendbus.fake_upstream import FORMATS, FakeUpstreamConfig
from spendbus.fake_upstream.hostile import SHAPES
from tests.gateway.kit import gateway_stack, request_for

pytestmark = pytest.mark.integration

#: the token counts of an event and of the fake's billed usage, by the same names
FIELDS = (
    "input_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "cache_write_1h_tokens",
    "output_tokens",
    "reasoning_tokens",
)


def auth(fmt: str, key: str) -> dict[str, str]:
    """Where each provider's SDK puts its key."""
    if fmt == "anthropic-messages":
        return {"x-api-key": key, "anthropic-version": "2023-06-01"}
    if fmt == "gemini":
        return {"x-goog-api-key": key}
    return {"Authorization": f"Bearer {key}"}


def requested_model(path: str, body: dict[str, Any]) -> str:
    """The model a request names: the URL's (Gemini, Bedrock), else the body's."""
    if path.startswith("/v1beta/models/"):
        return path.removeprefix("/v1beta/models/").split(":")[0]
    if path.startswith("/model/"):
        return path.removeprefix("/model/").rsplit("/", 1)[0]
    model: str = body["model"]
    return model


async def test_every_hostile_shape_is_charged_what_was_billed_at_the_model_requested(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    async with gateway_stack(
        kafka_bootstrap,
        topics,
        tmp_path,
        upstream=FakeUpstreamConfig(port=0, seed=11, cache_ratio=0.5),
    ) as stack:
        calls: list[tuple[str, bool, str, str, dict[str, int]]] = []
        async with aiohttp.ClientSession() as session:
            for fmt in FORMATS:
                for stream in (False, True):
                    for shape in SHAPES:
                        path, body, key = request_for(fmt, stream)
                        before = stack.upstream.stats.total.usage.copy()
                        headers = {**auth(fmt, key), "x-fake-hostile": shape}
                        async with session.post(
                            stack.url + path, json=body, headers=headers
                        ) as resp:
                            assert resp.status == 200, await resp.text()
                            await resp.read()
                        after = stack.upstream.stats.total.usage
                        billed = {name: after[name] - before[name] for name in FIELDS}
                        assert billed["output_tokens"] > 0
                        calls.append((fmt, stream, shape, requested_model(path, body), billed))
        events = await stack.events(len(calls))
    assert len(events) == len(calls)
    estimated = []
    for event, (fmt, stream, shape, model, billed) in zip(events, calls, strict=True):
        where = (fmt, stream, shape)
        assert (event["api"], event["stream"]) == (fmt, stream), where
        assert event["status_code"] == 200 and event["outcome"] == "allowed"
        assert event["model"] == model, where  # never the cheaper model the answer named
        assert all(event[name] >= billed[name] for name in FIELDS), (where, event, billed)
        if event["usage_source"] == "reported":
            assert {name: event[name] for name in FIELDS} == billed, where
        else:  # a zero count beside its parts is no usage at all: estimated, never below
            assert shape == "repeat-count", (where, event)
            assert event["estimate_reason"].startswith("invalid_usage"), event
            estimated.append(where)
    # the shapes every format reads exactly as billed: all but a count whose zero reading
    # is inconsistent (OpenAI, Gemini: a prompt below its cached part)
    assert {shape for _, _, shape in estimated} <= {"repeat-count"}
