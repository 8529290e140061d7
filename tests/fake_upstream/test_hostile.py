"""The fake's hostile answers (issue 32, hostile.py): each shape really reports less than
was billed to a reader that keeps one value of a repeated key or the latest report, the
stats still count what was billed, and the taps read back what was billed, at the model
requested."""

from __future__ import annotations

import base64
import json
import random

import aiohttp
import pytest

from ingest.taps.repeats import has_repeats, loads_keeping_repeats
from spendbus.fake_upstream import FakeExchange, FakeUpstream, FakeUpstreamConfig, synthesize
from spendbus.fake_upstream.eventstream import decode_message
from spendbus.fake_upstream.formats import EVENT_STREAMS
from spendbus.fake_upstream.hostile import CHEAPER, SHAPES
from spendbus.fake_upstream.usage import FakeUsage
from tests.fake_upstream.kit import EVERY, MODELS, STREAM, tap_read, usage_of

SHAPE = pytest.mark.parametrize("shape", SHAPES)
#: the formats whose taps read the model an answer names (Bedrock's is the URL's)
NAMES_A_MODEL = ("anthropic-messages", "openai-chat", "openai-responses", "gemini")
USAGE = FakeUsage(1200, 300, cache_read_tokens=500, cache_write_tokens=200, reasoning_tokens=40)


def documents(exchange: FakeExchange) -> list[bytes]:
    """Every JSON document of the answer, as written: the body, each SSE event's data,
    each event-stream payload and the Anthropic event a Bedrock ``chunk`` carries."""
    if not exchange.stream:
        return [exchange.body]
    if exchange.fmt in EVENT_STREAMS:
        out = []
        for frame in exchange.chunks:
            _, payload = decode_message(frame)
            out.append(payload)
            if exchange.fmt == "bedrock-invoke":
                outer = json.loads(payload)
                out.append(base64.b64decode(outer["bytes"]))
        return out
    if exchange.fmt == "gemini" and exchange.content_type.startswith("application/json"):
        return [exchange.body]
    out = []
    for chunk in exchange.chunks:
        for line in chunk.decode().splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append(line[len("data: ") :].encode())
    return out


def repeats_a_key(exchange: FakeExchange) -> bool:
    return any(has_repeats(loads_keeping_repeats(doc)[0]) for doc in documents(exchange))


def answer(fmt: str, stream: bool, shape: str | None, seed: int = 3) -> FakeExchange:
    return synthesize(
        fmt,
        model=MODELS[fmt],
        usage=USAGE,
        stream=stream,
        rng=random.Random(seed),
        hostile_shape=shape,
    )


@EVERY
@STREAM
@SHAPE
def test_each_shape_hides_usage_from_a_naive_reader(fmt: str, stream: bool, shape: str) -> None:
    plain = answer(fmt, stream, None)
    hostile = answer(fmt, stream, shape)
    assert hostile.usage == plain.usage and hostile.reported  # billed as usual
    if shape == "cheaper-model":
        named = CHEAPER.get(fmt)
        if named is None:  # Bedrock Converse names no model
            assert hostile.body == plain.body
        else:
            assert named.encode() in b"".join(documents(hostile))
            assert not repeats_a_key(hostile)
    elif shape == "zero-after" and stream:
        assert len(hostile.chunks) == len(plain.chunks) + 1
        assert not repeats_a_key(hostile)
    else:
        assert repeats_a_key(hostile) and not repeats_a_key(plain)


@EVERY
@STREAM
@SHAPE
def test_the_taps_charge_what_was_billed_at_the_model_requested(
    fmt: str, stream: bool, shape: str
) -> None:
    """Reported: exactly what was billed. A repeated count whose zero reading is not a
    usage at all (a prompt below its cached part, an output below its reasoning) is
    ``invalid_usage``: estimated, never below any valid reading, so never below the bill."""
    for seed in range(4):
        exchange = answer(fmt, stream, shape, seed)
        result = tap_read(exchange)
        charged = usage_of(result).as_dict()
        billed = exchange.usage.as_dict()
        assert all(charged[k] >= billed[k] for k in billed), (shape, result)
        if result.usage_source != "reported":
            assert shape == "repeat-count"
            assert result.estimate_reason is not None
            assert result.estimate_reason.startswith("invalid_usage"), result
        else:
            assert usage_of(result) == exchange.usage, shape
        assert result.model == exchange.model
        noted = shape == "cheaper-model" and fmt in NAMES_A_MODEL
        assert (result.model_note is not None) == noted


def test_the_gemini_json_array_keeps_its_repeated_keys() -> None:
    for shape in ("repeat-usage", "repeat-escaped"):
        exchange = synthesize(
            "gemini",
            model=MODELS["gemini"],
            usage=USAGE,
            stream=True,
            rng=random.Random(1),
            gemini_sse=False,
            hostile_shape=shape,
        )
        assert repeats_a_key(exchange)
        assert usage_of(tap_read(exchange)) == exchange.usage


def test_an_unknown_shape_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown hostile shape"):
        answer("openai-chat", True, "free-lunch")


async def test_the_server_answers_in_the_shape_the_header_names() -> None:
    request = {
        "model": "gpt-4o",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with (
        FakeUpstream(FakeUpstreamConfig(port=0, seed=3)) as upstream,
        aiohttp.ClientSession() as client,
    ):
        bodies = {}
        for shape in ("zero-after", "free-lunch", None):
            headers = {"x-fake-hostile": shape} if shape else {}
            async with client.post(
                upstream.url + "/v1/chat/completions", json=request, headers=headers
            ) as response:
                assert response.status == 200
                bodies[shape] = await response.read()
        async with client.get(upstream.url + "/stats") as response:
            usage = (await response.json())["usage"]
    usage_chunks = {
        shape: sum(
            json.loads(line[len("data: ") :]).get("usage") is not None
            for line in body.decode().splitlines()
            if line.startswith("data: {")
        )
        for shape, body in bodies.items()
    }
    assert usage_chunks == {"zero-after": 2, "free-lunch": 1, None: 1}  # unknown: ignored
    assert bodies["free-lunch"] == bodies[None]
    assert usage["output_tokens"] > 0  # billed each time, the hostile answer too
