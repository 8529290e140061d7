"""The gateway's access log (issue 37, item 4: seed 003's budget note on the request log
line): off by default; turned on, one line per request with method, path, status,
latency, the decision and the budget that decided, and never a key, a credential, the
query or the request's bytes. Through the real gateway and the fake providers."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from ingest.gateway.access_log import ACCESS_LOG, access_line
from schemas.topics import Topics
from tests.gateway.kit import (
    BROKE,
    CREDENTIALS,
    KEY_OF,
    KEYS,
    PROMPT,
    exhausted_verdict,
    gateway_stack,
    request_for,
)

pytestmark = pytest.mark.integration


def access_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == ACCESS_LOG.name]


def fields_of(line: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in line.split(" "))


async def test_one_line_per_request_with_the_budget_that_decided_and_no_secret(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # every logger, so a secret anywhere would be seen
    verdict = exhausted_verdict(BROKE, ["broke"])
    async with (
        gateway_stack(
            kafka_bootstrap,
            topics,
            tmp_path,
            verdicts=[verdict],
            gateway={"access_log": True},
        ) as stack,
        aiohttp.ClientSession() as session,
    ):
        path, body, key = request_for("openai-chat", False)
        async with session.post(
            stack.url + path, json=body, headers={"Authorization": f"Bearer {key}"}
        ) as resp:
            assert resp.status == 200
            await resp.read()
        broke = {"Authorization": f"Bearer {KEY_OF['sk-openai-broke']}"}
        async with session.post(stack.url + path, json=body, headers=broke) as resp:
            assert resp.status == 402
            await resp.read()
        # Gemini's key in the query string: the one place aiohttp's own log would show it
        path, body, key = request_for("gemini", False)
        async with session.post(f"{stack.url}{path}?key={key}&alt=json", json=body) as resp:
            assert resp.status == 200
            await resp.read()
        wrong = {"Authorization": "Bearer vk-not-a-known-key-0123456789"}
        async with session.post(stack.url + "/v1/chat/completions", json=body, headers=wrong) as r:
            assert r.status == 401
        await stack.events(3)

    lines = access_lines(caplog)
    assert len(lines) == 4, lines
    seen = [fields_of(line) for line in lines]
    assert [(f["method"], f["path"], f["status"]) for f in seen] == [
        ("POST", "/v1/chat/completions", "200"),
        ("POST", "/v1/chat/completions", "402"),
        ("POST", "/v1beta/models/gemini-2.5-flash:generateContent", "200"),
        ("POST", "/v1/chat/completions", "401"),
    ]
    assert [(f["decision"], f["budget"]) for f in seen] == [
        ("allowed", "-"),
        ("budget_exceeded", BROKE.budget_id),
        ("allowed", "-"),
        ("-", "-"),  # refused before the gate: no decision to note
    ]
    assert all(float(f["latency_ms"]) >= 0 for f in seen)
    everything = caplog.text + "\n".join(lines)
    for secret in [*KEYS, *CREDENTIALS.values(), "vk-not-a-known-key-0123456789"]:
        assert secret not in everything, secret
    assert PROMPT.split(".")[0] not in everything  # no request bytes either
    assert "key=" not in "\n".join(lines)


async def test_the_access_log_is_off_by_default(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with gateway_stack(kafka_bootstrap, topics, tmp_path) as stack:
        assert stack.gateway.config.access_log is False
        path, body, key = request_for("openai-chat", False)
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                stack.url + path, json=body, headers={"Authorization": f"Bearer {key}"}
            ) as resp,
        ):
            assert resp.status == 200
            await resp.read()
    assert access_lines(caplog) == []


class Decided:
    """A decision as the gate gives it (only what the line reads of one)."""

    def __init__(self, decision: str, budget_id: str | None) -> None:
        self.fields = {"outcome": "refused", "decision": decision, "decision_budget_id": budget_id}

    def usage_fields(self) -> dict[str, Any]:
        return self.fields


def test_a_value_that_could_forge_a_line_is_quoted_and_a_pasted_key_redacted() -> None:
    decision: Any = Decided("budget_exceeded", "team a\nmethod=GET status=200")
    line = access_line(
        "POST", "/v1/sb-0123456789abcdefXYZ/x?key=sb-0123456789abcdefXYZ", 402, 1.25, decision
    )
    assert "\n" not in line
    assert line == (
        'method=POST path="/v1/[redacted]/x" status=402 latency_ms=1.2 '
        'decision=budget_exceeded budget="team a\\nmethod=GET status=200"'
    )
    long = access_line("GET", "/" + "a" * 1000, None, 0.0, None)
    assert long == f"method=GET path=/{'a' * 255}... status=- latency_ms=0.0 decision=- budget=-"
