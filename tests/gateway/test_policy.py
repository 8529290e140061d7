"""Seed 001's policy engine through the gateway (issue 37): a Rego policy answering
``approval`` holds a job over its ceiling (429 approval_required, one request per job on
budget.approvals), `spendbus approvals approve` lets it go on (a raise of its session
counter), `deny` keeps it refused; ``deny`` and ``allow`` policies; a policy that fails
at evaluation follows fail_mode; a bad policy file stops `gateway run` with its reason;
`spendbus jobs` names jobs by opaque key only and `approvals list` correlates them.
Real broker, real enforcer and gateway, the CLI as an operator runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiokafka import AIOKafkaConsumer

from schemas.budgets import Budget
from schemas.codec import JOB_APPROVAL, VERDICT
from schemas.ids import counter_key
from schemas.jobs import job_key, job_key_secret
from schemas.periods import parse_window
from schemas.topics import Topics
from spendbus.fake_upstream import FakeUpstream, FakeUpstreamConfig
from spendbus.stack.compacted import publish
from tests.gateway.kit import (
    KEY_SECRET,
    eventually,
    gateway_config,
    gateway_stack,
    request_for,
)

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PER_JOB = Budget(
    budget_id="per-job", scope="session", window=parse_window("total"), limit_requests=1
)
APPROVAL_POLICY = """package spendbus

default decision := "allow"

decision := "approval" if { input.job_over_budget }
"""
DENY_POLICY = """package spendbus

default decision := "allow"

decision := "deny" if { input.model == "gpt-4o" }
"""
#: two rules answering at once: a conflict rego reports at evaluation, never at load
CONFLICT_POLICY = """package spendbus

default decision := "allow"

decision := "deny" if { input.session_id == "acme/clash" }

decision := "approval" if { input.session_id == "acme/clash" }
"""
IDENTITY = "acme-openai@example.com"


def spendbus(bootstrap: str, topics: Topics, home: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "spendbus", *args],
        env={
            **os.environ,
            "KAFKA_BOOTSTRAP": bootstrap,
            "SPENDBUS_TOPIC_PREFIX": topics.prefix,
            "SPENDBUS_HOME": str(home),
            "SPENDBUS_KEY_SECRET": KEY_SECRET.decode(),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


async def approval_steps(bootstrap: str, topics: Topics, count: int) -> list[dict[str, Any]]:
    """The first ``count`` records on budget.approvals (waits up to 20 s for them)."""
    consumer = AIOKafkaConsumer(
        topics.budget_approvals,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_id=None,
    )
    await consumer.start()
    out: list[dict[str, Any]] = []
    try:
        for _ in range(40):
            for messages in (await consumer.getmany(timeout_ms=500)).values():
                out.extend(dict(JOB_APPROVAL.decode(m.value)) for m in messages)
            if len(out) >= count:
                break
    finally:
        await consumer.stop()
    return out


def policy(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.rego"
    path.write_text(text)
    return path


async def test_approval_holds_the_job_once_until_an_operator_decides(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    home = tmp_path / "cli"
    enforcer = {"policy_file": policy(tmp_path, APPROVAL_POLICY), "approval_retry_after_s": 90}
    async with (
        gateway_stack(
            kafka_bootstrap, topics, tmp_path, budgets=(PER_JOB,), enforcer=enforcer
        ) as stack,
        aiohttp.ClientSession() as session,
    ):
        path, body, key = request_for("openai-chat", False)

        async def call(job: str) -> tuple[int, dict[str, Any], Mapping[str, str]]:
            headers = {"Authorization": f"Bearer {key}", "X-Spend-Session": job}
            async with session.post(stack.url + path, json=body, headers=headers) as resp:
                return resp.status, await resp.json(), resp.headers

        secret = job_key_secret(KEY_SECRET)
        job_a = job_key(secret, "acme", IDENTITY, "acme/job-a")
        job_b = job_key(secret, "acme", IDENTITY, "acme/job-b")
        assert (await call("job-a"))[0] == 200
        for _ in range(3):  # held: the same answer, one request on the topic
            status, refusal, headers = await call("job-a")
            assert status == 429 and refusal["error"] == "approval_required", refusal
            assert refusal["job"] == job_a and refusal["budget_id"] == "per-job"
            assert headers["Retry-After"] == "90"
        assert (await call("job-b"))[0] == 200
        assert (await call("job-b"))[1]["error"] == "approval_required"
        assert (await stack.upstream_stats())["requests"] == 2  # the held ones never went
        steps = await approval_steps(kafka_bootstrap, topics, 2)
        assert sorted((s["job_key"], s["kind"]) for s in steps) == sorted(
            [(job_a, "request"), (job_b, "request")]
        )
        asked = next(s for s in steps if s["job_key"] == job_a)
        assert (asked["org_id"], asked["identity"], asked["session_id"]) == (
            "acme",
            IDENTITY,
            "acme/job-a",
        )
        assert asked["by"] == "test-gateway" and asked["budget_id"] == "per-job"

        out = spendbus(kafka_bootstrap, topics, home, "approvals", "approve", job_a)
        assert out.startswith(f"approved {job_a}: per-job +1 requests"), out
        spendbus(kafka_bootstrap, topics, home, "approvals", "deny", job_b, "--reason", "no")
        await eventually(lambda: stack.enforcer.state.approvals.standing(job_b) == "denied")
        await eventually(lambda: stack.enforcer.state.approvals.standing(job_a) == "approved")
        await eventually(lambda: bool(stack.enforcer.state.raises.by_id))
        assert (await call("job-a"))[0] == 200  # approved: its raise lets it go on
        status, refusal, headers = await call("job-b")
        assert status == 403 and refusal["error"] == "approval_denied", refusal
        assert "Retry-After" not in headers
        # the raised ceiling spent again: a new round, asked once more
        assert (await call("job-a"))[1]["error"] == "approval_required"
        assert len(await approval_steps(kafka_bootstrap, topics, 5)) == 5  # 3 asked, 2 decided

        listed = json.loads(spendbus(kafka_bootstrap, topics, home, "approvals", "list", "--json"))
        by_job = {row["job"]: row for row in listed}
        assert by_job[job_a]["standing"] == "pending"
        assert [s["kind"] for s in by_job[job_a]["steps"]] == ["request", "approve", "request"]
        assert by_job[job_b]["standing"] == "denied"
        decided = by_job[job_b]["steps"][-1]
        assert decided["kind"] == "deny" and decided["reason"] == "no" and decided["by"]
        # the audit correlates a key to its tenant, identity and session
        assert (by_job[job_a]["org_id"], by_job[job_a]["identity"]) == ("acme", IDENTITY)
        assert by_job[job_a]["session_id"] == "acme/job-a"

        # jobs: by opaque key only, with the count against the ceiling
        verdict = {
            "counter_key": counter_key("per-job", ["acme", IDENTITY, "acme/job-a"]),
            "budget_id": "per-job",
            "scope": "session",
            "scope_values": ["acme", IDENTITY, "acme/job-a"],
            "period": "total",
            "state": "exceeded",
            "spent_nanos": 0,
            "spent_tokens": 0,
            "spent_requests": 2,
            "limit_nanos": None,
            "limit_tokens": None,
            "limit_requests": 1,
            "action": "enforce",
            "refusal": "job_budget_exceeded",
            "reset_at": None,
            "as_of": asked["at"],
            "seq": 1,
            "emitted_at": asked["at"],
        }
        await publish(
            kafka_bootstrap,
            topics.budget_verdicts,
            [(verdict["counter_key"].encode(), VERDICT.encode(verdict))],
        )
        text = spendbus(kafka_bootstrap, topics, home, "jobs", "--json")
        assert "acme" not in text and "job-a" not in text.replace(job_a, "")
        assert IDENTITY not in text
        jobs = json.loads(text)
        assert [(j["job"], j["spent_requests"], j["limit_requests"]) for j in jobs] == [
            (job_a, 2, 1)
        ]
        # an operator's correlation of the same key: what approvals list says of it
        audited = json.loads(spendbus(kafka_bootstrap, topics, home, "jobs", "--json", "--audit"))
        assert [(j["job"], j["org_id"], j["identity"], j["session_id"]) for j in audited] == [
            (job_a, "acme", IDENTITY, "acme/job-a")
        ]


async def test_deny_allow_and_failing_policies(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    path, body, key = request_for("openai-chat", False)
    for text, fail_mode, session_id, expected in (
        (DENY_POLICY, "open", "any", (403, "policy_denied")),
        (APPROVAL_POLICY, "open", "any", (200, None)),  # under its ceiling: allowed
        (CONFLICT_POLICY, "open", "clash", (200, None)),  # fails: open keeps the decision
        (CONFLICT_POLICY, "closed", "clash", (503, "failed_closed")),
    ):
        enforcer = {"policy_file": policy(tmp_path, text), "fail_mode": fail_mode}
        async with (
            gateway_stack(
                kafka_bootstrap, topics, tmp_path, budgets=(PER_JOB,), enforcer=enforcer
            ) as stack,
            aiohttp.ClientSession() as session,
        ):
            headers = {"Authorization": f"Bearer {key}", "X-Spend-Session": session_id}
            async with session.post(stack.url + path, json=body, headers=headers) as resp:
                answer = await resp.json()
                got = (resp.status, answer.get("error") if resp.status != 200 else None)
            assert got == expected, (text, answer)
            if fail_mode == "closed":
                assert answer["reason"] == "policy_error"
            assert stack.enforcer.policy is not None
            assert stack.enforcer.policy.answers.total() == 1


async def test_a_bad_policy_file_stops_the_gateway_with_its_reason(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    async with FakeUpstream(FakeUpstreamConfig(port=0)) as upstream:
        for text, reason in (
            ("package spendbus\ndecision := \n", "not valid Rego"),
            ('package spendbus\ndecision := "maybe"\n', "expected one of allow, deny, approval"),
            ("package elsewhere\ndefault decision := 1\n", "undefined"),
        ):
            data = gateway_config(
                upstream.url,
                kafka={"bootstrap": kafka_bootstrap, "topic_prefix": topics.prefix},
                publisher={"spool_dir": str(tmp_path / "spool")},
                listen={"host": "127.0.0.1", "port": 0},
                enforcer={"policy_file": str(policy(tmp_path, text))},
            )
            config = tmp_path / "gateway.yaml"
            config.write_text(yaml.safe_dump(data))
            done = subprocess.run(
                [sys.executable, "-m", "spendbus", "gateway", "run", "--config", str(config)],
                env={**os.environ, "SPENDBUS_HOME": str(tmp_path / "home")},
                capture_output=True,
                text=True,
                timeout=120,
                cwd=ROOT,
            )
            assert done.returncode == 1, done.stderr
            assert "policy.rego" in done.stderr and reason in done.stderr, done.stderr
            assert "Traceback" not in done.stderr
