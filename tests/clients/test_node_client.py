"""The TypeScript client (clients/node/) against the Python side it must equal (issue 38).

- the shared table: clients/node/test/cases.json is what the Python enforcer and codec
  answer today (regenerated here and compared), and the client's node:test suite holds
  every decision, refusal body, encoding and partition to it;
- on the real broker, worker and engine: events published from Node by the client are
  counted exactly (ClickHouse and the verdicts, the same nanos as the Python price book
  gives, a re-sent event counted once, none dead-lettered), and check() of a Node follower
  answers what a Python enforcer following the same topics answers;
- a generation switch: the Node follower loads the new generation's verdicts and moves to
  them, as docs/contract.md says a follower must.

The client is built (``npm ci``, ``tsc``) once per session into clients/node/node_modules
and dist (``make node-client`` does the same); without ``node`` the tests skip, saying so.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from enforcer import Enforcer, EnforcerConfig
from schemas.budgets import budgets_from_yaml
from schemas.codec import BUDGET_POLICY, GENERATION_SWITCH, VERDICT
from schemas.periods import from_micros, to_micros
from schemas.records import UsageEvent
from schemas.topics import CONTROL_KEY, Topics
from spendbus.stack.compacted import publish
from spendbus.stack.topics import ensure_topics
from tests.clients.node_cases import CASES_PATH, COUNTER_FIELDS, table_text
from tests.enforcer.kit import verdict
from tests.pipeline_kit import Pipeline

CLIENT = CASES_PATH.parents[1]
DRIVE = CLIENT / "dist" / "tools" / "drive.js"
#: what differs between two runs only by the second they ran in
TIMED = ("retry_after",)


@pytest.fixture(scope="session")
def node_client() -> Path:
    """clients/node installed (``npm ci``, when its lock changed) and built (``tsc``)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are not installed: the TypeScript client cannot be built")
    installed = CLIENT / "node_modules" / ".package-lock.json"
    lock = CLIENT / "package-lock.json"
    if not installed.exists() or installed.stat().st_mtime < lock.stat().st_mtime:
        run([npm, "ci", "--no-audit", "--no-fund"], timeout=600)
    run([npm, "run", "build"], timeout=300)
    return CLIENT


def run(argv: list[str], *, timeout: float) -> str:
    done = subprocess.run(
        argv, cwd=CLIENT, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{' '.join(argv)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_shared_table_is_what_python_answers_today() -> None:
    """Regenerated from the Python enforcer and codec, the table is the committed one."""
    assert CASES_PATH.read_text(encoding="utf-8") == table_text(), (
        "clients/node/test/cases.json is stale: `python -m tests.clients.node_cases`"
    )


def test_the_node_suite_holds_the_client_to_the_table(node_client: Path) -> None:
    out = run(["node", "--test", "dist/test/"], timeout=120)
    table = json.loads(CASES_PATH.read_text(encoding="utf-8"))
    counts = dict(re.findall(r"^# (tests|pass|fail|skipped|cancelled) (\d+)$", out, re.MULTILINE))
    # every check case ran (one test each) beside the client's own tests, and all passed
    assert int(counts["tests"]) > len(table["checks"]), out
    assert counts["pass"] == counts["tests"] and counts["skipped"] == "0", out


def drive(*args: str, timeout: float = 120) -> list[dict[str, Any]]:
    out = run(["node", str(DRIVE), *args], timeout=timeout)
    return [json.loads(line) for line in out.splitlines()]


def python_event(published: dict[str, Any]) -> UsageEvent:
    event = dict(published)
    event["occurred_at"] = from_micros(event["occurred_at"])
    return event  # type: ignore[return-value]  # the fields the client published, checked by the codec


def comparable(answer: dict[str, Any]) -> dict[str, Any]:
    """A decision without what depends on the second it was made in."""
    out = {k: v for k, v in answer.items() if k not in TIMED}
    out["headers"] = [h for h in answer["headers"] if h[0] != "Retry-After"]
    out["counters"] = [{k: c[k] for k in COUNTER_FIELDS} for c in answer["counters"]]
    return out


async def python_decisions(pipeline: Pipeline, requests: list[dict[str, Any]]) -> list[Any]:
    config = EnforcerConfig(bootstrap=pipeline.bootstrap, topic_prefix=pipeline.topics.prefix)
    async with Enforcer(config) as enforcer:
        await enforcer.wait_ready(60)
        assert enforcer.state.ready
        return [comparable(enforcer.peek(enforcer.context(**r)).to_json()) for r in requests]


@pytest.mark.integration
def test_events_published_from_node_are_counted_exactly(
    node_client: Path, pipeline: Pipeline, tmp_path: Path
) -> None:
    now_us = to_micros(datetime.now(UTC))
    fields = []
    for n in range(24):
        org = ("acme", "globex", " Initech ", "école-42")[n % 4]
        fields.append(
            {
                "provider": "anthropic",
                "api": "anthropic-messages",
                "model": ("claude-sonnet-4-5", "gpt-4o-mini")[n % 2],
                # sk-big spends past its $0.10 per-secret budget; the others stay under
                "secret_id": "sk-big" if n < 8 else f"sk-{n % 3}",
                "org_id": org,
                "gateway_id": "node",
                "input_tokens": 1_000 + 37 * n,
                "output_tokens": 9_000 if n < 8 else 11 * n,
                "cache_read_tokens": 500 * (n % 3),
                "occurred_at": now_us - 1_000 * n,
            }
        )
    spec = tmp_path / "events.json"
    spec.write_text(json.dumps({"events": fields, "resend": 5}))
    (answer,) = drive("publish", pipeline.bootstrap, pipeline.topics.prefix, str(spec))
    events = [python_event(e) for e in answer["published"]]
    assert len({e["event_id"] for e in events}) == len(events)

    expected = sum(pipeline.prices.price_event(e).cost_nanos for e in events)
    rows = pipeline.sql_until(
        "SELECT count(), sum(cost_nanos) FROM usage_events",
        lambda rows: int(rows[0][0]) >= len(events),
    )
    assert (int(rows[0][0]), int(rows[0][1])) == (len(events), expected)
    stats = pipeline.stats_until(lambda s: s.get("duplicates") == 5)
    assert (stats["duplicates"], stats["dead_letters"]) == (5, 0)
    per_secret: dict[tuple[str, str], int] = {}
    for e in events:
        key = (e["org_id"].strip(), e["secret_id"])
        per_secret[key] = per_secret.get(key, 0) + pipeline.prices.price_event(e).cost_nanos
    assert pipeline.verdict_spend_until(per_secret) == per_secret

    # the same verdicts, followed from Node and from Python, decide alike
    requests: list[dict[str, Any]] = [
        {"org_id": "acme", "secret_id": "sk-big", "input_tokens": 10, "max_output_tokens": 10},
        {"org_id": " Initech ", "secret_id": "sk-big", "model": "gpt-4o-mini"},
        {
            "org_id": "globex",
            "secret_id": "sk-1",
            "model": "claude-sonnet-4-5",
            "input_tokens": 10,
            "max_output_tokens": 10,
        },
    ]
    assert per_secret[("acme", "sk-big")] >= 100_000_000  # exhausted; sk-1 has room left
    (requests_file := tmp_path / "requests.json").write_text(json.dumps(requests))
    (followed,) = drive("check", pipeline.bootstrap, pipeline.topics.prefix, str(requests_file))
    in_python = asyncio.run(python_decisions(pipeline, requests))
    in_node = followed["decisions"]
    assert [d["decision"] for d in in_python] == ["budget_exceeded"] * 2 + ["allowed"]
    for request, node, python in zip(requests, in_node, in_python, strict=True):
        assert comparable(node) == python, request


TOKENS_YAML = [{"id": "org-tokens", "scope": "org", "window": "month", "limit_tokens": 10_000}]


@pytest.mark.integration
def test_the_node_follower_moves_to_a_new_generation(
    node_client: Path, kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """Generation ``""`` says 100 tokens spent; after a cutover to ``g2`` (whose verdicts
    were built by a replay: here written as its aggregator would) the org is exhausted."""
    (budget,) = budgets_from_yaml(TOKENS_YAML)
    now = datetime.now(UTC)
    g2 = topics.of_generation("g2")
    asyncio.run(ensure_topics(kafka_bootstrap, g2, partitions=4))

    def write(topic: str, records: list[tuple[bytes, bytes]]) -> None:
        asyncio.run(publish(kafka_bootstrap, topic, records))

    def verdict_record(spent: int, seq: int) -> tuple[bytes, bytes]:
        v = verdict(budget, ["acme"], spent_tokens=spent, seq=seq, at=now)
        return v["counter_key"].encode(), VERDICT.encode(v)

    write(topics.budget_policies, [(b"org-tokens", BUDGET_POLICY.encode(budget.to_record(now)))])
    write(topics.budget_verdicts, [verdict_record(100, 5)])
    write(g2.budget_verdicts, [verdict_record(10_000, 7)])
    requests = [
        {"org_id": "acme", "secret_id": "sk-1", "input_tokens": 10, "max_output_tokens": 10}
    ]
    (requests_file := tmp_path / "requests.json").write_text(json.dumps(requests))
    with subprocess.Popen(
        ["node", str(DRIVE), "check", kafka_bootstrap, topics.prefix, str(requests_file), "g2"],
        cwd=CLIENT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as follower:
        try:
            assert follower.stdout is not None
            before = json.loads(follower.stdout.readline() or "{}")
            assert before.get("generation") == "", follower.stderr and follower.stderr.read()
            assert before["decisions"][0]["decision"] == "allowed"
            switch = {
                "generation": "g2",
                "previous": "",
                "previous_retired": False,
                "switched_at": now + timedelta(seconds=1),
            }
            write(topics.generations, [(CONTROL_KEY, GENERATION_SWITCH.encode(switch))])
            after = json.loads(follower.stdout.readline() or "{}")
            assert follower.wait(timeout=60) == 0
        finally:
            if follower.poll() is None:
                follower.kill()
    assert after["generation"] == "g2"
    (decision,) = after["decisions"]
    assert decision["decision"] == "budget_exceeded" and decision["body"]["spent_tokens"] == 10_000
