"""The fuzz suite, hostile upstream (issue 32, item 6): the gateway (``spendbus gateway run``)
in front of a provider (``spendbus fake-upstream``) that answers each call in a random
hostile shape (``x-fake-hostile``: a usage given twice, the second zero, its key escaped,
a count given twice, a zero report after the real one, a cheaper model named; or honestly),
for random formats, models, prompts, output sizes, streamed or whole. Every 2xx is charged
on usage.raw, once, at least what the provider billed for it in every token class, and at
the model requested, never the cheaper one the answer named."""

from __future__ import annotations

import asyncio
import http.client
import json
import secrets
import string
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.topics import Topics
from spendbus.fake_upstream import FORMATS
from spendbus.fake_upstream.hostile import SHAPES
from spendbus.stack.broker_probe import free_ports
from tests.fuzz.kit import EXAMPLES, FUZZ, GUARD_S, command, gateway_config_file, usage_events

pytestmark = [pytest.mark.integration, pytest.mark.fuzz, pytest.mark.timeout(GUARD_S)]

#: the token counts of an event and of the fake's billed usage, by the same names
FIELDS = (
    "input_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "cache_write_1h_tokens",
    "output_tokens",
    "reasoning_tokens",
)
#: models a client may ask for, per format (the URL's for Gemini and Bedrock)
MODELS: dict[str, list[str]] = {
    "anthropic-messages": ["claude-sonnet-4-5", "claude-opus-4-5", "claude-opus-4-1-20250805"],
    "openai-chat": ["gpt-4o", "gpt-4.1", "o3"],
    "openai-responses": ["gpt-5", "gpt-4.1", "o4-mini"],
    "gemini": ["gemini-2.5-pro", "gemini-2.5-flash"],
    "bedrock-converse": ["anthropic.claude-sonnet-4-5-20250929-v1:0", "amazon.nova-pro-v1:0"],
    "bedrock-invoke": ["anthropic.claude-sonnet-4-5-20250929-v1:0"],
}
API_OF = {
    "anthropic-messages": "anthropic",
    "openai-chat": "openai",
    "openai-responses": "openai",
    "gemini": "gemini",
    "bedrock-converse": "bedrock",
    "bedrock-invoke": "bedrock",
}


@dataclass(frozen=True)
class Call:
    fmt: str
    stream: bool
    shape: str | None
    model: str
    path: str
    body: bytes
    output_tokens: int


@st.composite
def calls(draw: st.DrawFn) -> Call:
    fmt = draw(st.sampled_from(FORMATS))
    stream = draw(st.booleans())
    model = draw(st.sampled_from(MODELS[fmt]))
    shape = draw(st.sampled_from([*SHAPES, None]))
    prompt = draw(st.text(alphabet=string.ascii_letters + " .,", min_size=1, max_size=3000))
    messages = [{"role": "user", "content": prompt}]
    body: dict[str, Any]
    if fmt in ("anthropic-messages", "bedrock-invoke"):
        body = {"max_tokens": 4096, "messages": messages}
        if fmt == "anthropic-messages":
            body |= {"model": model, "stream": stream}
            path = "/v1/messages"
        else:
            body["anthropic_version"] = "bedrock-2023-05-31"
            action = "invoke-with-response-stream" if stream else "invoke"
            path = f"/model/{model}/{action}"
    elif fmt == "openai-chat":
        body = {"model": model, "messages": messages, "stream": stream}
        if stream and draw(st.booleans()):  # else the gateway asks for the usage itself
            body["stream_options"] = {"include_usage": True}
        path = "/v1/chat/completions"
    elif fmt == "openai-responses":
        body = {"model": model, "input": prompt, "stream": stream}
        path = "/v1/responses"
    elif fmt == "gemini":
        body = {"contents": [{"role": "user", "parts": [{"text": prompt}]}]}
        action = "generateContent"
        if stream:
            action = "streamGenerateContent" + ("?alt=sse" if draw(st.booleans()) else "")
        path = f"/v1beta/models/{model}:{action}"
    else:
        body = {"messages": [{"role": "user", "content": [{"text": prompt}]}]}
        path = f"/model/{model}/converse{'-stream' if stream else ''}"
    output = draw(st.integers(1, 3000))
    return Call(fmt, stream, shape, model, path, json.dumps(body).encode(), output)


def billed_usage(upstream: str) -> dict[str, int]:
    """What the provider billed so far, in all (its /stats)."""
    with urllib.request.urlopen(f"{upstream}/stats", timeout=10) as answer:
        usage: dict[str, int] = json.loads(answer.read())["usage"]
    return usage


def post(port: int, call: Call, key: str) -> int:
    """POST ``call`` to the gateway and read its whole answer; its status."""
    headers = {"Content-Type": "application/json", "x-fake-output-tokens": str(call.output_tokens)}
    if call.shape is not None:
        headers["x-fake-hostile"] = call.shape
    if call.fmt == "anthropic-messages":
        headers |= {"x-api-key": key, "anthropic-version": "2023-06-01"}
    elif call.fmt == "gemini":
        headers["x-goog-api-key"] = key
    else:
        headers["Authorization"] = f"Bearer {key}"
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("POST", call.path, body=call.body, headers=headers)
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def test_a_hostile_upstream_never_lowers_the_charge_nor_its_model(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    gateway_port, upstream_port = free_ports(2)
    upstream = f"http://127.0.0.1:{upstream_port}"
    apis = sorted(set(API_OF.values()))
    keys = {api: "sb-" + secrets.token_urlsafe(32) for api in apis}
    config_file = gateway_config_file(
        tmp_path,
        gateway_id="fuzz-hostile",
        port=gateway_port,
        bootstrap=kafka_bootstrap,
        topic_prefix=topics.prefix,
        upstream=upstream,
        keys=keys,
        # the fake provider's headers: the shape of each answer, its size
        forward_request_headers=["x-fake-"],
    )
    env = {"SPENDBUS_HOME": str(tmp_path / "home")}
    sent: list[tuple[Call, dict[str, int]]] = []
    with (
        command(
            ["fake-upstream", "--port", str(upstream_port), "--seed", "32"],
            env,
            f"{upstream}/healthz",
            tmp_path / "upstream.log",
        ),
        command(
            ["gateway", "run", "--config", str(config_file)],
            env,
            f"http://127.0.0.1:{gateway_port}/healthz",
            tmp_path / "gateway.log",
        ),
    ):

        @FUZZ
        @given(calls())
        def one(call: Call) -> None:
            before = billed_usage(upstream)
            status = post(gateway_port, call, keys[API_OF[call.fmt]])
            assert status == 200, (status, call)
            after = billed_usage(upstream)
            sent.append((call, {name: after[name] - before[name] for name in FIELDS}))

        one()
    assert len(sent) >= EXAMPLES
    events = [
        e
        for e in asyncio.run(usage_events(kafka_bootstrap, topics.usage_raw))
        if e["outcome"] != "refused" and e["charge_of"] is None
    ]
    events.sort(key=lambda e: e["occurred_at"])
    assert len(events) == len(sent)  # every call charged once
    for event, (call, billed) in zip(events, sent, strict=True):
        where = (call.fmt, call.stream, call.shape, call.model)
        assert (event["api"], event["status_code"]) == (call.fmt, 200), where
        assert event["model"] == call.model, (where, event["model"])
        short = {name: (event[name], billed[name]) for name in FIELDS if event[name] < billed[name]}
        assert not short, (where, short, event)
        if event["usage_source"] != "reported":  # a count whose zero reading is no usage
            assert call.shape == "repeat-count", (where, event)
            assert event["estimate_reason"].startswith("invalid_usage"), (where, event)
