"""A client minting a new ``X-Spend-Session`` per request (issue 21): past the key's
``max_sessions_per_key`` new ids a day the gateway refuses the request before the provider
(429, reason ``too_many_sessions``), and its refusal event names no session, so the
aggregator makes no counter of it (real broker and enforcer, the fake providers)."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from schemas.budgets import Budget
from schemas.periods import parse_window
from schemas.topics import Topics
from tests.gateway.kit import BROKE, gateway_stack, request_for

pytestmark = pytest.mark.integration

PER_JOB = Budget(
    budget_id="per-job",
    scope="session",
    window=parse_window("total"),
    limit_requests=50,
)


async def test_new_session_ids_past_the_bound_are_refused_and_make_no_counter(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    async with gateway_stack(
        kafka_bootstrap,
        topics,
        tmp_path,
        budgets=(BROKE, PER_JOB),
        enforcer={"max_sessions_per_key": 2},
    ) as stack:
        path, body, key = request_for("openai-chat", False)
        async with aiohttp.ClientSession() as session:

            async def call(job: str) -> tuple[int, str]:
                headers = {"Authorization": f"Bearer {key}", "X-Spend-Session": job}
                async with session.post(stack.url + path, json=body, headers=headers) as resp:
                    return resp.status, await resp.text()

            assert [(await call(f"job-{i}"))[0] for i in range(2)] == [200, 200]
            status, text = await call("job-minted")
            assert status == 429 and "too_many_sessions" in text, text
            assert (await call("job-0"))[0] == 200  # a session it opened goes on
        assert (await stack.upstream_stats())["requests"] == 3  # the refused one never went
        events = await stack.events(4)
        assert sorted(str(e["session_id"]) for e in events) == [
            "None",
            "acme/job-0",
            "acme/job-0",
            "acme/job-1",
        ]
        refused = [e for e in events if e["outcome"] == "refused"]
        assert len(refused) == 1 and refused[0]["decision"] == "job_budget_exceeded"
        assert refused[0]["decision_budget_id"] == "per-job"


async def test_the_sliding_idle_ttl_opens_a_new_job_through_the_gateway(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """Seed 001's fallback: requests without X-Spend-Session share an automatic session
    while the key is never idle longer than ``sessions.idle_ttl_s`` (each request slides
    the window), so the per-job ceiling holds across them; idle past it, the next request
    is a new job under a fresh ceiling. The gateway's own tracker reads a clock of the
    test's; everything else is real (broker, enforcer, publisher)."""
    one_request = Budget(
        budget_id="per-job", scope="session", window=parse_window("total"), limit_requests=1
    )
    async with gateway_stack(
        kafka_bootstrap,
        topics,
        tmp_path,
        budgets=(BROKE, one_request),
        gateway={"sessions": {"idle_ttl_s": 60}},
    ) as stack:
        now = [1_800_000_000.0]
        stack.gateway.sessions.clock = lambda: now[0]
        path, body, key = request_for("openai-chat", False)
        async with aiohttp.ClientSession() as session:

            async def call(at: float) -> int:
                now[0] = at
                headers = {"Authorization": f"Bearer {key}"}
                async with session.post(stack.url + path, json=body, headers=headers) as resp:
                    await resp.read()
                    return resp.status

            start = now[0]
            assert await call(start) == 200
            assert await call(start + 50) == 429  # the same job: its ceiling is spent
            assert await call(start + 50 + 59) == 429  # 109 s from its start, 59 s idle
            assert await call(start + 50 + 59 + 61) == 200  # idle past the TTL: a new job
        events = await stack.events(4)
        sessions = [str(e["session_id"]) for e in events]
        assert sessions[0] == sessions[1] == sessions[2] != sessions[3], sessions
        assert all(s.startswith("auto:acme-openai:") for s in sessions)
        assert [e["outcome"] for e in events] == ["allowed", "refused", "refused", "allowed"]
