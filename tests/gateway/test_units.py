"""The gateway's pure parts: routes, keys, sessions, headers."""

from __future__ import annotations

import gc
import socket
from pathlib import Path

import pytest

import ingest.gateway as gateway
from ingest.gateway import KeyStore, SessionTracker, VirtualKey, key_digest, presented_key, resolve
from ingest.gateway.errors import error_body


def test_public_names() -> None:
    assert set(gateway.__all__) == {
        "REALTIME_API",
        "BudgetGate",
        "GateDecision",
        "Gateway",
        "GatewayConfig",
        "GatewayServer",
        "KeyStore",
        "KeysNotReady",
        "KeysTopicFollower",
        "Principal",
        "Route",
        "SessionTracker",
        "Upstream",
        "UsageSink",
        "VirtualKey",
        "KEYED_PREFIX",
        "key_bits",
        "key_digest",
        "key_from_record",
        "key_hmac",
        "key_record",
        "keyed_digest",
        "load_config",
        "parse_config",
        "parse_key_entries",
        "presented_key",
        "record_key",
        "resolve",
        "upstream_headers",
        "weak_key_problem",
    }


@pytest.mark.parametrize(
    ("path", "family", "fmt", "model", "streaming"),
    [
        ("/v1/chat/completions", "openai", "openai-chat", None, None),
        ("/v1/responses", "openai", "openai-responses", None, None),
        ("/v1/messages", "anthropic", "anthropic-messages", None, None),
        ("/v1/messages/count_tokens", "anthropic", None, None, None),
        (
            "/v1beta/models/gemini-2.5-flash:generateContent",
            "gemini",
            "gemini",
            "gemini-2.5-flash",
            False,
        ),
        (
            "/v1/models/gemini-2.5-pro:streamGenerateContent",
            "gemini",
            "gemini",
            "gemini-2.5-pro",
            True,
        ),
        ("/v1beta/models/gemini-2.5-pro:countTokens", "gemini", None, "gemini-2.5-pro", None),
        (
            "/model/amazon.nova-pro-v1:0/converse",
            "bedrock",
            "bedrock-converse",
            "amazon.nova-pro-v1:0",
            False,
        ),
        (
            "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A1%3Ainference-profile%2Fus.x/converse-stream",
            "bedrock",
            "bedrock-converse",
            "arn:aws:bedrock:us-east-1:1:inference-profile/us.x",
            True,
        ),
        (
            "/model/us.anthropic.claude-sonnet-4-5-20250929-v1:0/invoke",
            "bedrock",
            "bedrock-invoke",
            "us.anthropic.claude-sonnet-4-5-20250929-v1:0",
            False,
        ),
        (
            "/model/global.anthropic.claude-opus-4-5-20251101-v1%3A0/invoke-with-response-stream",
            "bedrock",
            "bedrock-invoke",
            "global.anthropic.claude-opus-4-5-20251101-v1:0",
            True,
        ),
    ],
)
def test_routes(
    path: str, family: str, fmt: str | None, model: str | None, streaming: bool | None
) -> None:
    route = resolve(path)
    assert route is not None
    assert (route.family, route.fmt, route.model, route.streaming) == (
        family,
        fmt,
        model,
        streaming,
    )
    assert route.metered == (fmt is not None)


@pytest.mark.parametrize(
    "path",
    [
        "/v1/embeddings",
        "/v1beta/models/x:embedContent",
        "/v1beta/models/:generateContent",
        "/model/a/b/converse",
        "/model/a/b/invoke",
        "/model/x/invoke-stream",
        "/",
    ],
)
def test_unknown_paths_have_no_route(path: str) -> None:
    assert resolve(path) is None


def key(name: str, secret: str = "kvalue-0123456789abcdef", org: str = "acme") -> VirtualKey:
    return VirtualKey(name=name, key=secret, principal={"org_id": org, "secret_id": "sk-1"})


def test_keys_are_found_by_digest_wherever_the_sdk_puts_them() -> None:
    store = KeyStore([key("a")])
    for headers, query in (
        ({"authorization": "Bearer kvalue-0123456789abcdef"}, {}),
        ({"x-api-key": "kvalue-0123456789abcdef"}, {}),
        ({"x-goog-api-key": " kvalue-0123456789abcdef "}, {}),
        ({}, {"key": "kvalue-0123456789abcdef"}),
    ):
        found = store.lookup(presented_key(headers, query))
        assert found is not None and found.name == "a"
    assert (
        store.lookup(presented_key({"authorization": "Basic kvalue-0123456789abcdef"}, {})) is None
    )
    assert store.lookup("kvalue-0123456789abcdeF") is None
    hashed = VirtualKey(
        name="h",
        key_sha256=key_digest("another-key-0123456789"),
        principal={"org_id": "acme", "secret_id": "sk-1"},
    )
    store.replace([hashed])
    assert store.lookup("another-key-0123456789") is hashed
    assert store.lookup("kvalue-0123456789abcdef") is None


def test_sessions_slide_per_key_and_headers_are_scoped_by_org() -> None:
    now = [1_000_000.0]
    tracker = SessionTracker(idle_ttl_s=60, clock=lambda: now[0])
    a, b = key("a"), key("b", "other-0123456789abcdef", org="globex")
    first = tracker.session_id(a, None)
    assert first is not None and first.startswith("auto:a:")
    now[0] += 59
    assert tracker.session_id(a, None) == first  # still active: the window slides
    now[0] += 59
    assert tracker.session_id(a, None) == first
    assert tracker.session_id(b, None) != first
    now[0] += 61
    assert tracker.session_id(a, None) != first  # idle past the TTL: a new session
    assert tracker.session_id(a, "job-1") == "acme/job-1"
    assert tracker.session_id(b, "job-1") == "globex/job-1"  # another tenant, another counter
    with pytest.raises(ValueError, match="longer"):
        tracker.session_id(a, "x" * 600)
    with pytest.raises(ValueError, match="unprintable"):
        tracker.session_id(a, "job\x00")


def test_the_tracker_forgets_the_least_recently_used_keys() -> None:
    tracker = SessionTracker(idle_ttl_s=60, max_tracked=2)
    keys = [key(f"k{i}", f"secret-{i}-0123456789abcdef") for i in range(3)]
    ids = [tracker.session_id(k, None) for k in keys]
    assert len(set(ids)) == 3
    assert len(tracker._open) == 2


def test_own_errors_use_each_providers_shape() -> None:
    body, headers = error_body("anthropic", 401, "no")
    assert body == {"type": "error", "error": {"type": "authentication_error", "message": "no"}}
    body, _ = error_body("openai", 401, "no")
    assert body["error"]["code"] == "invalid_api_key"
    body, _ = error_body("gemini", 403, "no")
    assert body["error"]["status"] == "PERMISSION_DENIED"
    body, headers = error_body("bedrock", 502, "no")
    assert headers == [("x-amzn-ErrorType", "ServiceUnavailableException")]


def test_without_automatic_sessions_only_the_header_names_one() -> None:
    tracker = SessionTracker(idle_ttl_s=60, auto=False)
    assert tracker.session_id(key("a"), None) is None
    assert tracker.session_id(key("a"), "job-7") == "acme/job-7"


def test_a_secret_for_several_apis_goes_to_the_upstream_of_each() -> None:
    from ingest.gateway import parse_config

    config = parse_config(
        {
            "upstreams": {
                "oa": {"api": "openai", "base_url": "http://o"},
                "an": {"api": "anthropic", "base_url": "http://a"},
            },
            "secrets": {"sk-router": {"upstream": ["oa", "an"], "api_key": "k"}},
        }
    )
    assert config.secrets["sk-router"].upstream_names == ("oa", "an")
    from schemas.errors import ConfigError

    with pytest.raises(ConfigError, match=r"field 'secrets\.sk-router\.upstream': two upstreams"):
        parse_config(
            {
                "upstreams": {
                    "oa": {"api": "openai", "base_url": "http://o"},
                    "oa2": {"api": "openai", "base_url": "http://o2"},
                },
                "secrets": {"sk-router": {"upstream": ["oa", "oa2"], "api_key": "k"}},
            },
            "g.yaml",
        )


async def test_the_server_freezes_the_heap_it_starts_with_and_thaws_it_when_it_stops(
    tmp_path: Path,
) -> None:
    """A full collection walked the gateway's whole long-lived heap (imports, config, the
    enforcer's state: 56-87 ms of CPU, the loop held meanwhile); frozen at start, it walks
    only what was made since. Stopped, the server gives that heap back to the collector."""
    from enforcer import Enforcer, EnforcerConfig
    from ingest.gateway import Gateway, GatewayServer, parse_config
    from ingest.publisher import PublisherConfig, UsagePublisher
    from tests.gateway.kit import gateway_config

    config = parse_config(gateway_config("http://127.0.0.1:9"), "test")
    gate = Enforcer(EnforcerConfig(bootstrap="127.0.0.1:9", gateway_id="test-gateway"))
    sink = UsagePublisher(PublisherConfig(bootstrap="127.0.0.1:9", spool_dir=tmp_path / "spool"))
    gc.unfreeze()
    before = gc.get_freeze_count()
    long_lived = [object()]  # a container made before the start: tracked by the collector
    gw = Gateway(config, gate, sink, credentials=config.credentials({}))
    async with GatewayServer(gw) as server:
        assert server.url.startswith("http://127.0.0.1:")
        assert gc.get_freeze_count() > before + 1000
        gc.collect()  # a full collection leaves the frozen heap alone
        assert gc.get_freeze_count() > before + 1000
        assert not any(o is long_lived for o in gc.get_objects())  # frozen, not walked
    assert gc.get_freeze_count() == 0
    assert any(o is long_lived for o in gc.get_objects())
    # a server that cannot listen leaves nothing frozen behind
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError):
            await GatewayServer(gw, port=port).start()
    assert gc.get_freeze_count() == 0
