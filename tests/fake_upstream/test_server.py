"""The fake providers over real localhost HTTP, read by the usage taps like a proxy would."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from ingest.taps import TapResult, open_tap
from spendbus.commands.fake_upstream import fake_upstream
from spendbus.fake_upstream import FORMATS, FakeUpstream, FakeUpstreamConfig

ROOT = Path(__file__).resolve().parents[2]
BEDROCK_MODEL = "anthropic.claude-sonnet-4-5-20250929-v1:0"
PROMPT = "Summarise the retention policy of usage.raw for the finance team. " * 20


def route(fmt: str, stream: bool, *, gemini_sse: bool = True) -> tuple[str, dict[str, Any]]:
    """The path and a realistic body of a request of ``fmt``."""
    if fmt == "anthropic-messages":
        body: dict[str, Any] = {
            "model": "claude-sonnet-4-5",
            "max_tokens": 1024,
            "messages": [{"role": "user", "content": PROMPT}],
        }
        if stream:
            body["stream"] = True
        return "/v1/messages", body
    if fmt == "openai-chat":
        body = {"model": "gpt-4o", "messages": [{"role": "user", "content": PROMPT}]}
        if stream:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        return "/v1/chat/completions", body
    if fmt == "openai-responses":
        body = {"model": "gpt-5", "input": PROMPT, "max_output_tokens": 2048}
        if stream:
            body["stream"] = True
        return "/v1/responses", body
    if fmt == "gemini":
        body = {"contents": [{"role": "user", "parts": [{"text": PROMPT}]}]}
        action = "streamGenerateContent" if stream else "generateContent"
        query = "?alt=sse" if stream and gemini_sse else ""
        return f"/v1beta/models/gemini-2.5-flash:{action}{query}", body
    if fmt == "bedrock-invoke":
        body = {
            "anthropic_version": "bedrock-2023-05-31",
            "max_tokens": 1024,
            "messages": [{"role": "user", "content": PROMPT}],
        }
        action = "invoke-with-response-stream" if stream else "invoke"
        return f"/model/{BEDROCK_MODEL}/{action}", body
    body = {
        "messages": [{"role": "user", "content": [{"text": PROMPT}]}],
        "inferenceConfig": {"maxTokens": 1024},
    }
    return f"/model/{BEDROCK_MODEL}/converse{'-stream' if stream else ''}", body


URL_MODELS = {
    "gemini": "gemini-2.5-flash",
    "bedrock-converse": BEDROCK_MODEL,
    "bedrock-invoke": BEDROCK_MODEL,
}


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    result: TapResult
    cut: bool


async def ask(
    session: aiohttp.ClientSession,
    base: str,
    fmt: str,
    stream: bool,
    *,
    headers: dict[str, str] | None = None,
    gemini_sse: bool = True,
    body: bytes | None = None,
) -> Answer:
    """POST one request and read the answer through a tap, as a proxy does."""
    path, request = route(fmt, stream, gemini_sse=gemini_sse)
    raw = json.dumps(request).encode() if body is None else body
    async with session.post(base + path, data=raw, headers=headers or {}) as response:
        tap = open_tap(
            fmt,
            raw,
            content_type=response.headers.get("Content-Type"),
            content_encoding=response.headers.get("Content-Encoding"),
            status=response.status,
            model=URL_MODELS.get(fmt),
        )
        received = bytearray()
        cut = False
        try:
            async for chunk in response.content.iter_any():
                tap.feed(chunk)
                received += chunk
        except aiohttp.ClientPayloadError:
            cut = True
        result = tap.finish(cut="upstream_cut" if cut else None)
        return Answer(response.status, dict(response.headers), bytes(received), result, cut)


def tokens(result: TapResult) -> dict[str, int]:
    return {
        name: getattr(result, name)
        for name in (
            "input_tokens",
            "output_tokens",
            "cache_read_tokens",
            "cache_write_tokens",
            "cache_write_1h_tokens",
            "reasoning_tokens",
        )
    }


async def stats(session: aiohttp.ClientSession, base: str) -> dict[str, Any]:
    async with session.get(base + "/stats") as response:
        assert response.status == 200
        body: dict[str, Any] = await response.json()
        return body


def session() -> aiohttp.ClientSession:
    # The raw bytes, as a proxy forwards them (gzip left for the tap to decode).
    return aiohttp.ClientSession(auto_decompress=False)


CASES = [(fmt, stream) for fmt in FORMATS for stream in (True, False)]
EVERY_ROUTE = pytest.mark.parametrize(
    ("fmt", "stream"), CASES, ids=[f"{f}-{'stream' if s else 'body'}" for f, s in CASES]
)


# -- every route ---------------------------------------------------------------------------------


@EVERY_ROUTE
async def test_every_route_answers_in_its_wire_format(fmt: str, stream: bool) -> None:
    config = FakeUpstreamConfig(port=0, cache_ratio=0.5, seed=7)
    async with FakeUpstream(config) as upstream, session() as client:
        answer = await ask(client, upstream.url, fmt, stream)
        assert answer.status == 200 and not answer.cut
        kind = answer.headers["Content-Type"]
        if stream:
            bedrock = fmt.startswith("bedrock-")
            want = "vnd.amazon.eventstream" if bedrock else "text/event-stream"
            assert want in kind
            assert "Content-Length" not in answer.headers
        else:
            assert kind.startswith("application/json")
            assert int(answer.headers["Content-Length"]) == len(answer.body)
        result = answer.result
        assert result.usage_source == "reported", result
        assert result.model == URL_MODELS.get(fmt, route(fmt, stream)[1].get("model"))
        seen = await stats(client, upstream.url)
        assert seen["requests"] == 1 and seen["statuses"] == {"200": 1}
        assert seen["bytes_out"] == len(answer.body)
        [per_route] = seen["routes"].values()
        assert per_route["usage"] == tokens(result)  # the ground truth is what the tap read
        assert sum(per_route["usage_unreported"].values()) == 0
        # Input is about the request's bytes / 4.
        size = len(json.dumps(route(fmt, stream)[1]))
        prompt = result.input_tokens + result.cache_read_tokens + result.cache_write_tokens
        assert prompt == -(-size // 4)


async def test_gemini_stream_without_alt_sse_is_a_json_array() -> None:
    async with FakeUpstream(FakeUpstreamConfig(port=0)) as upstream, session() as client:
        answer = await ask(client, upstream.url, "gemini", True, gemini_sse=False)
        assert answer.status == 200 and answer.headers["Content-Type"].startswith(
            "application/json"
        )
        assert isinstance(json.loads(answer.body), list)
        assert answer.result.usage_source == "reported"


async def test_bedrock_model_ids_may_be_url_encoded() -> None:
    async with FakeUpstream(FakeUpstreamConfig(port=0)) as upstream, session() as client:
        _, request = route("bedrock-converse", False)
        path = f"/model/{BEDROCK_MODEL.replace(':', '%3A')}/converse"
        async with client.post(upstream.url + path, json=request) as response:
            assert response.status == 200
            assert "usage" in await response.json()


# -- determinism -----------------------------------------------------------------------------------


async def test_usage_is_deterministic_from_the_seed_and_the_request() -> None:
    async def bodies(seed: int) -> list[bytes]:
        config = FakeUpstreamConfig(port=0, seed=seed, cache_ratio=0.5)
        async with FakeUpstream(config) as upstream, session() as client:
            out = []
            for fmt, stream in CASES:
                out.append((await ask(client, upstream.url, fmt, stream)).body)
            out.append((await ask(client, upstream.url, "openai-chat", False)).body)
            return out

    first, again, other = await bodies(1), await bodies(1), await bodies(2)
    assert first == again
    assert first[-1] == first[CASES.index(("openai-chat", False))]  # same request, same answer
    assert all(a != b for a, b in zip(first, other, strict=True))


# -- faults ------------------------------------------------------------------------------------------


@EVERY_ROUTE
async def test_error_statuses_in_each_providers_format(fmt: str, stream: bool) -> None:
    config = FakeUpstreamConfig(port=0, error_rate=1.0, error_statuses=(429, 500, 503))
    async with FakeUpstream(config) as upstream, session() as client:
        seen_statuses = set()
        for _ in range(6):
            answer = await ask(client, upstream.url, fmt, stream)
            seen_statuses.add(answer.status)
            assert answer.status in (429, 500, 503)
            assert answer.headers["Content-Type"].startswith("application/json")
            body = json.loads(answer.body)
            if fmt.startswith("bedrock-"):
                assert "message" in body and "x-amzn-ErrorType" in answer.headers
            elif fmt == "anthropic-messages":
                assert body["type"] == "error"
            else:
                assert "error" in body
            if answer.status == 429:
                assert "retry-after" in {k.lower() for k in answer.headers}
            assert answer.result.usage_source == "none"
            assert (answer.result.upstream_error or "").startswith(f"HTTP {answer.status}")
        assert len(seen_statuses) > 1
        seen = await stats(client, upstream.url)
        assert seen["errors"] == 6 and sum(seen["usage"].values()) == 0


@EVERY_ROUTE
async def test_cut_responses_drop_the_connection_before_the_usage(fmt: str, stream: bool) -> None:
    config = FakeUpstreamConfig(port=0, cut_rate=1.0)
    async with FakeUpstream(config) as upstream, session() as client:
        answer = await ask(client, upstream.url, fmt, stream)
        assert answer.status == 200 and answer.cut
        assert answer.result.usage_source == "estimated"
        assert answer.result.estimate_reason == "upstream_cut"
        seen = await stats(client, upstream.url)
        assert seen["cuts"] == 1
        assert sum(seen["usage"].values()) == 0 and seen["usage_unreported"]["output_tokens"] > 0


@pytest.mark.parametrize("fmt", FORMATS)
async def test_stream_errors_after_the_200(fmt: str) -> None:
    config = FakeUpstreamConfig(port=0, stream_error_rate=1.0, output_tokens=(200, 400))
    async with FakeUpstream(config) as upstream, session() as client:
        answer = await ask(client, upstream.url, fmt, True)
        assert answer.status == 200 and not answer.cut
        assert answer.result.usage_source == "estimated"
        assert answer.result.upstream_error
        assert (await stats(client, upstream.url))["stream_errors"] == 1


@pytest.mark.parametrize("fmt", FORMATS)
async def test_gzip_when_the_client_accepts_it(fmt: str) -> None:
    async with FakeUpstream(FakeUpstreamConfig(port=0, gzip=True)) as upstream, session() as client:
        for stream in (True, False):
            answer = await ask(client, upstream.url, fmt, stream)
            assert answer.headers["Content-Encoding"] == "gzip"
            assert answer.body[:2] == b"\x1f\x8b"
            assert answer.result.usage_source == "reported"
        plain = await ask(client, upstream.url, fmt, True, headers={"Accept-Encoding": "identity"})
        assert "Content-Encoding" not in plain.headers


async def test_cache_ratio() -> None:
    config = FakeUpstreamConfig(port=0, cache_ratio=1.0)
    async with FakeUpstream(config) as upstream, session() as client:
        for fmt in FORMATS:
            result = (await ask(client, upstream.url, fmt, True)).result
            assert result.cache_read_tokens > result.input_tokens, (fmt, result)
    config = FakeUpstreamConfig(port=0, cache_ratio=0.0)
    async with FakeUpstream(config) as upstream, session() as client:
        for fmt in FORMATS:
            result = (await ask(client, upstream.url, fmt, True)).result
            assert result.cache_read_tokens == result.cache_write_tokens == 0


async def test_chat_stream_without_include_usage_is_unreported() -> None:
    async with FakeUpstream(FakeUpstreamConfig(port=0)) as upstream, session() as client:
        request = {
            "model": "gpt-4o",
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
        }
        raw = json.dumps(request).encode()
        answer = await ask(client, upstream.url, "openai-chat", True, body=raw)
        assert answer.result.usage_source == "estimated"
        seen = (await stats(client, upstream.url))["routes"]["/v1/chat/completions"]
        assert sum(seen["usage"].values()) == 0 and seen["usage_unreported"]["output_tokens"] > 0


async def test_requests_can_force_faults_with_headers() -> None:
    async with FakeUpstream(FakeUpstreamConfig(port=0)) as upstream, session() as client:
        base = upstream.url
        answer = await ask(
            client, base, "anthropic-messages", True, headers={"x-fake-status": "529"}
        )
        assert answer.status == 529
        assert json.loads(answer.body)["error"]["type"] == "overloaded_error"
        answer = await ask(client, base, "openai-chat", True, headers={"x-fake-output-tokens": "7"})
        assert answer.result.output_tokens == 7
        answer = await ask(client, base, "gemini", True, headers={"x-fake-cut-after": "1"})
        assert answer.cut and answer.result.usage_source == "estimated"
        answer = await ask(
            client, base, "bedrock-converse", True, headers={"x-fake-error-after": "2"}
        )
        assert answer.result.upstream_error and answer.result.usage_source == "estimated"
    config = FakeUpstreamConfig(port=0, honor_headers=False)
    async with FakeUpstream(config) as upstream, session() as client:
        answer = await ask(
            client, upstream.url, "openai-chat", False, headers={"x-fake-status": "500"}
        )
        assert answer.status == 200


async def test_latencies() -> None:
    config = FakeUpstreamConfig(port=0, latency_ms=150, chunk_latency_ms=20, output_tokens=(10, 10))
    async with FakeUpstream(config) as upstream, session() as client:
        path, request = route("openai-chat", True)
        started = time.monotonic()
        async with client.post(upstream.url + path, json=request) as response:
            arrivals = []
            async for _ in response.content.iter_any():
                arrivals.append(time.monotonic())
        # Chat streams ~1 token per chunk: 10 tokens are more than 5 chunks.
        assert arrivals[0] - started >= 0.15
        assert arrivals[-1] - started >= 0.15 + 5 * 0.02
        started = time.monotonic()
        answer = await ask(client, upstream.url, "openai-chat", False)
        assert time.monotonic() - started >= 0.15 + 0.02  # waits as its stream would have
        assert answer.result.usage_source == "reported"


async def test_client_disconnects_are_counted() -> None:
    config = FakeUpstreamConfig(port=0, chunk_latency_ms=30, output_tokens=(300, 300))
    async with FakeUpstream(config) as upstream, session() as client:
        path, request = route("openai-chat", True)
        async with client.post(upstream.url + path, json=request) as response:
            await response.content.readany()
            response.close()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            seen = await stats(client, upstream.url)
            if seen["client_disconnects"]:
                break
            await asyncio.sleep(0.05)
        assert seen["client_disconnects"] == 1
        assert seen["usage_unreported"]["output_tokens"] == 300


async def test_bad_requests_and_the_stats_endpoints() -> None:
    async with FakeUpstream(FakeUpstreamConfig(port=0)) as upstream, session() as client:
        base = upstream.url
        for fmt in FORMATS:
            answer = await ask(client, base, fmt, False, body=b"{not json")
            assert answer.status == 400 and answer.result.usage_source == "none"
        async with client.post(base + "/v1beta/models/gemini-2.5-flash:countTokens", json={}) as r:
            assert r.status == 404 and (await r.json())["error"]["status"] == "NOT_FOUND"
        async with client.get(base + "/healthz") as r:
            assert r.status == 200 and await r.text() == "ok"
        seen = await stats(client, base)
        assert seen["requests"] == 6 and seen["statuses"] == {"400": 6}
        assert seen["bytes_in"] == 6 * len(b"{not json")
        assert set(seen["routes"]) == {
            "/v1/messages",
            "/v1/chat/completions",
            "/v1/responses",
            "/v1beta/models/{model}:generateContent",
            "/model/{modelId}/converse",
            "/model/{modelId}/invoke",
        }
        async with client.delete(base + "/stats") as r:
            assert (await r.json())["requests"] == 0
        assert (await stats(client, base))["requests"] == 0


# -- config and command ---------------------------------------------------------------------------


def test_config_is_validated_and_frozen() -> None:
    for bad in (
        {"error_rate": 1.5},
        {"cut_rate": -0.1},
        {"output_tokens": (10, 5)},
        {"error_statuses": (200,)},
        {"port": 70_000},
        {"surprise": 1},
    ):
        with pytest.raises(ValidationError):
            FakeUpstreamConfig(**bad)
    config = FakeUpstreamConfig()
    assert config.host == "127.0.0.1"
    with pytest.raises(ValidationError):
        config.seed = 3  # type: ignore[misc]  # frozen: the assignment is what is refused


def test_command_rejects_bad_options() -> None:
    runner = CliRunner()
    result = runner.invoke(fake_upstream, ["--help"])
    assert result.exit_code == 0 and "--cut-rate" in result.output
    result = runner.invoke(fake_upstream, ["--error-rate", "2"])
    assert result.exit_code == 2 and "error_rate" in result.output


def test_command_serves_until_ctrl_c() -> None:
    code = (
        "import sys; from spendbus.commands.fake_upstream import fake_upstream; "
        "fake_upstream(sys.argv[1:])"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code, "--port", "0", "--seed", "3"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("fake upstream listening on http://127.0.0.1:"), line
        url = line.split()[-1]

        async def probe() -> int:
            async with session() as client, client.get(url + "/healthz") as r:
                return r.status

        assert asyncio.run(probe()) == 200
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=10)
        assert process.returncode == 0, err
        assert "fake upstream stopped" in err
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
