"""Self-service spend (issue 23): ``GET /v1/spend`` on the gateway answers the calling
virtual key's own counters from the enforcer's memory, equal to what ``spendbus usage``
prints for the same principal; the sidecar answers the same route. Real broker."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from enforcer import Enforcer, EnforcerConfig
from enforcer.sidecar import create_app
from schemas.budgets import Budget
from schemas.periods import parse_window, with_calendar
from schemas.topics import Topics
from tests.gateway.kit import BROKE, KEY_OF, eventually, exhausted_verdict, gateway_stack

pytestmark = pytest.mark.integration

PER_SECRET = Budget(
    budget_id="secret-daily-ny",
    scope="secret",
    window=with_calendar(parse_window("day"), "America/New_York"),
    limit_nanos=2_000_000_000,
)
PER_PROJECT = Budget(
    budget_id="project-tokens",
    scope="project",
    window=parse_window("week"),
    limit_tokens=1_000_000,
)


def half_spent(budget: Budget, scope_values: list[str]) -> dict[str, Any]:
    """Half the USD limit spent, a quarter of it over the last half hour (Verdict v2's
    burn: at that rate the rest lasts an hour)."""
    verdict = exhausted_verdict(budget, scope_values)
    verdict.update(
        state="ok",
        spent_nanos=(budget.limit_nanos or 0) // 2,
        spent_tokens=123_456,
        burn_nanos=(budget.limit_nanos or 0) // 4,
        burn_tokens=0,
        burn_requests=0,
        burn_span_us=1_800_000_000,
        exhausts_at=None,
    )
    return verdict


def iso(at: datetime) -> str:
    """As usage and /v1/spend write times (enforcer.response.iso_us)."""
    from enforcer.response import iso_us
    from schemas.periods import to_micros

    shown = iso_us(to_micros(at))
    assert shown is not None
    return shown


def usage_cli(bootstrap: str, topics: Topics, home: Path, *ids: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "spendbus", "usage", *ids, "--json"],
        env={
            **os.environ,
            "KAFKA_BOOTSTRAP": bootstrap,
            "SPENDBUS_TOPIC_PREFIX": topics.prefix,
            "SPENDBUS_HOME": str(home),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]  # json.loads answers Any


async def test_v1_spend_is_the_callers_counters_as_spendbus_usage_shows_them(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    verdicts = [
        exhausted_verdict(BROKE, ["broke"]),
        half_spent(PER_SECRET, ["broke", "sk-openai-broke"]),
        half_spent(PER_PROJECT, ["broke", "proj-1"]),
        half_spent(PER_SECRET, ["acme", "sk-openai"]),
    ]
    async with (
        gateway_stack(
            kafka_bootstrap,
            topics,
            tmp_path,
            budgets=[BROKE, PER_SECRET, PER_PROJECT],
            verdicts=verdicts,
        ) as stack,
        aiohttp.ClientSession() as session,
    ):
        await eventually(lambda: len(stack.enforcer.state.verdicts) == len(verdicts))
        auth = {"Authorization": f"Bearer {KEY_OF['sk-openai-broke']}"}
        async with session.get(stack.url + "/v1/spend", headers=auth) as resp:
            assert resp.status == 200
            answer = await resp.json()
        assert answer["ready"] is True and answer["stale"] is False
        counters = answer["counters"]
        by_budget = {c["budget_id"]: c for c in counters}
        assert {b: (c["scope_values"], c["state"]) for b, c in by_budget.items()} == {
            "broke-monthly": (["broke"], "exceeded"),
            "secret-daily-ny": (["broke", "sk-openai-broke"], "ok"),
            "project-tokens": (["broke", "proj-1"], "ok"),
        }
        secret = by_budget["secret-daily-ny"]
        assert (secret["spent_nanos"], secret["limit_nanos"]) == (1_000_000_000, 2_000_000_000)
        assert secret["reset_at"] == verdicts[1]["reset_at"].isoformat().replace("+00:00", "Z")
        # its forecast: $0.50 in half an hour, the $1 left lasts an hour
        assert secret["burn_per_hour"] == {"nanos": 1_000_000_000, "tokens": 0, "requests": 0}
        as_of = verdicts[1]["as_of"]
        assert secret["exhausts_at"] == iso(as_of + timedelta(hours=1))
        assert by_budget["project-tokens"]["exhausts_at"] is None  # no tokens burnt

        # the operator's view of the same principal: the same numbers, field for field
        cli = await asyncio.to_thread(
            usage_cli,
            kafka_bootstrap,
            topics,
            tmp_path / "cli",
            "--org-id=broke",
            "--secret-id=sk-openai-broke",
            "--project-id=proj-1",
            "--user-id=broke-openai@example.com",
            "--group=eng",
            "--tag=team=search",
        )
        assert cli == counters

        # another key sees its own counters only; no key is a 401
        other = {"Authorization": f"Bearer {KEY_OF['sk-openai']}"}
        async with session.get(stack.url + "/v1/spend", headers=other) as resp:
            mine = (await resp.json())["counters"]
        assert {(c["budget_id"], *c["scope_values"]) for c in mine} == {
            ("secret-daily-ny", "acme", "sk-openai"),
            ("project-tokens", "acme", "proj-1"),
        }
        async with session.get(stack.url + "/v1/spend") as resp:
            assert resp.status == 401

        # the sidecar's /v1/spend: the same counters for the same context
        config = EnforcerConfig(bootstrap=kafka_bootstrap, topic_prefix=topics.prefix)
        async with Enforcer(config) as sidecar_enforcer:
            await sidecar_enforcer.wait_ready(60)
            runner = web.AppRunner(create_app(sidecar_enforcer))
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = next(a[1] for a in runner.addresses if isinstance(a, tuple))
            try:
                query = [
                    ("org_id", "broke"),
                    ("secret_id", "sk-openai-broke"),
                    ("project_id", "proj-1"),
                    ("user_id", "broke-openai@example.com"),
                    ("group", "eng"),
                    ("tag.team", "search"),
                ]
                async with session.get(f"http://127.0.0.1:{port}/v1/spend", params=query) as r:
                    assert r.status == 200
                    assert (await r.json())["counters"] == counters
            finally:
                await runner.cleanup()
