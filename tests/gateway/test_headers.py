"""Headers cross the gateway by allowlist (issue 21): the operator's account ids and the
provider's cookies never reach a client, a client's account-picking or unknown headers
never reach the provider, and what the SDKs read and send passes (real broker and
enforcer, the fake providers only)."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from ingest.gateway import parse_config, upstream_headers
from schemas.errors import ConfigError
from schemas.topics import Topics
from spendbus.fake_upstream import FORMATS
from tests.gateway.kit import gateway_config, gateway_stack, request_for
from tests.gateway.test_proxy import auth

#: what the fake providers answer about the operator's account and edge (as real ones do)
NEVER_RELAYED = (
    "set-cookie",
    "openai-organization",
    "openai-project",
    "anthropic-organization-id",
    "cf-ray",
    "x-content-type-options",
)
#: what the SDKs read, by format (request ids, rate limits)
RELAYED = {
    "openai-chat": ("x-request-id", "x-ratelimit-remaining-requests", "openai-processing-ms"),
    "openai-responses": ("x-request-id", "x-ratelimit-limit-requests", "openai-version"),
    "anthropic-messages": ("request-id", "anthropic-ratelimit-requests-remaining"),
    "bedrock-invoke": ("x-amzn-requestid",),
    "bedrock-converse": ("x-amzn-requestid",),
    "gemini": (),
}
CLIENT_HEADERS = {
    # account-picking, credentials of another kind, and what no provider needs
    "openai-organization": "org-attacker",
    "openai-project": "proj_attacker",
    "x-goog-user-project": "attacker-billing",
    "anthropic-workspace-id": "wrkspc_attacker",
    "cookie": "session=stolen",
    "x-forwarded-for": "10.0.0.1",
    "x-internal-debug": "1",
    "x-spend-session": "job-1",
    # what the SDKs send
    "user-agent": "OpenAI/Python 2.8.1",
    "x-stainless-lang": "python",
    "x-stainless-retry-count": "0",
    "idempotency-key": "stainless-python-retry-1",
    "openai-beta": "assistants=v2",
    "anthropic-beta": "prompt-caching-2024-07-31",
}
NEVER_FORWARDED = (
    "openai-organization",
    "openai-project",
    "x-goog-user-project",
    "anthropic-workspace-id",
    "cookie",
    "x-forwarded-for",
    "x-internal-debug",
    "x-spend-session",
)
FORWARDED = {
    "openai-chat": ("user-agent", "x-stainless-lang", "idempotency-key", "openai-beta"),
    "openai-responses": ("x-stainless-retry-count", "openai-beta"),
    "anthropic-messages": ("x-stainless-lang", "anthropic-beta", "anthropic-version"),
    "gemini": ("user-agent", "content-type"),
    "bedrock-invoke": ("content-type",),
    "bedrock-converse": ("content-type",),
}


@pytest.mark.integration
async def test_headers_cross_the_gateway_by_allowlist_both_ways(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    async with (
        gateway_stack(kafka_bootstrap, topics, tmp_path) as stack,
        aiohttp.ClientSession() as session,
    ):
        for fmt in FORMATS:
            for stream in (False, True):
                path, body, key = request_for(fmt, stream)
                headers = {**CLIENT_HEADERS, **auth(fmt, key)}
                async with session.post(stack.upstream.url + path, json=body) as direct:
                    # the fake providers do send what must not reach a client
                    if fmt.startswith(("openai", "anthropic")):
                        assert "set-cookie" in direct.headers
                    await direct.read()
                async with session.post(stack.url + path, json=body, headers=headers) as resp:
                    assert resp.status == 200, await resp.text()
                    await resp.read()
                    got = {n.lower() for n in resp.headers}
                _, seen = stack.upstream.request_headers[-1]
                where = f"{fmt} stream={stream}"
                for name in NEVER_RELAYED:
                    assert name not in got, f"{where}: {name} reached the client"
                for name in (*RELAYED[fmt], "content-type"):
                    assert name in got, f"{where}: {name} did not reach the client"
                for name in NEVER_FORWARDED:
                    assert name not in seen, f"{where}: {name} reached the provider"
                for name in FORWARDED[fmt]:
                    assert name in seen, f"{where}: {name} did not reach the provider"
                # the client's credential never; the gateway's own instead
                assert key not in str(sorted(seen))


@pytest.mark.integration
async def test_the_sdks_still_read_request_ids_and_retry_after_through_the_gateway(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """A provider's 429 keeps what the SDKs' retries read (retry-after, x-should-retry);
    the request id the SDK exposes is the provider's."""
    import anthropic
    import openai

    async with gateway_stack(kafka_bootstrap, topics, tmp_path) as stack:
        _, _, openai_key = request_for("openai-chat", False)
        client = openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=openai_key, max_retries=0)
        raw = await client.chat.completions.with_raw_response.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
        )
        assert raw.request_id is not None and raw.request_id.startswith("req_")
        assert raw.headers.get("x-ratelimit-remaining-requests") == "9999"
        assert "openai-organization" not in raw.headers
        _, _, anthropic_key = request_for("anthropic-messages", False)
        claude = anthropic.AsyncAnthropic(base_url=stack.url, api_key=anthropic_key, max_retries=0)
        with pytest.raises(anthropic.RateLimitError) as limited:
            await claude.messages.create(
                model="claude-sonnet-4-5",
                max_tokens=64,
                messages=[{"role": "user", "content": "hi"}],
                extra_headers={"x-fake-status": "429"},
            )
        assert limited.value.response.headers.get("content-type", "").startswith("application/json")
        assert "anthropic-organization-id" not in limited.value.response.headers
        assert "set-cookie" not in limited.value.response.headers


def test_the_allowlist_is_per_provider_and_credentials_are_the_gateways() -> None:
    client = {**CLIENT_HEADERS, "authorization": "Bearer vk-client", "x-api-key": "vk-client"}
    openai_side = upstream_headers(client, "openai", "sk-operator")
    assert openai_side["Authorization"] == "Bearer sk-operator"
    assert "x-api-key" not in openai_side and "anthropic-beta" not in openai_side
    anthropic_side = upstream_headers(client, "anthropic", "sk-operator")
    assert anthropic_side["x-api-key"] == "sk-operator" and "authorization" not in anthropic_side
    assert "openai-beta" not in anthropic_side and anthropic_side["anthropic-beta"]
    gemini_side = upstream_headers(client, "gemini", "sk-operator")
    assert set(map(str.lower, gemini_side)) == {
        "user-agent",
        "idempotency-key",
        "x-goog-api-key",
        "accept-encoding",
    }
    # a config may forward more, never a credential, a cookie or an account header
    also = upstream_headers({"x-title": "my app"}, "openai", "sk", ("x-title",))
    assert also["x-title"] == "my app"
    for bad in ("cookie", "openai-project", "x-", "authorization"):
        with pytest.raises(ConfigError, match="never forwarded"):
            parse_config(
                gateway_config("http://127.0.0.1:9", forward_request_headers=[bad]), "test"
            )
