"""A temporary raise that expires under traffic (issue 23): an exhausted org's requests
through the gateway are refused, allowed once ``spendbus budgets raise`` publishes a raise,
and refused again from ``--until`` on, by the enforcer's clock. Real broker, real gateway,
the CLI as an operator runs it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from schemas.topics import Topics
from tests.gateway.kit import (
    BROKE,
    KEY_OF,
    eventually,
    exhausted_verdict,
    gateway_stack,
    request_for,
)

pytestmark = pytest.mark.integration


def spendbus(bootstrap: str, topics: Topics, home: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "spendbus", *args],
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
    return done.stdout


async def test_a_raise_lets_an_exhausted_org_through_until_it_expires(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    home = tmp_path / "cli"
    async with (
        gateway_stack(
            kafka_bootstrap, topics, tmp_path, verdicts=[exhausted_verdict(BROKE, ["broke"])]
        ) as stack,
        aiohttp.ClientSession() as session,
    ):
        await eventually(lambda: stack.enforcer.ready and bool(stack.enforcer.state.verdicts))
        path, body, _ = request_for("openai-chat", False)
        auth = {"Authorization": f"Bearer {KEY_OF['sk-openai-broke']}"}
        #: (sent at, answered at, status, refusal body or None): a request was checked
        #: between the two instants
        sent: list[tuple[float, float, int, dict[str, Any] | None]] = []
        raised_at: list[float] = []

        async def traffic(stop_at: float) -> None:
            while time.time() < stop_at:
                at = time.time()
                async with session.post(stack.url + path, json=body, headers=auth) as resp:
                    payload = await resp.json() if resp.status == 402 else None
                    sent.append((at, time.time(), resp.status, payload))
                await asyncio.sleep(0.05)

        load = asyncio.create_task(traffic(time.time() + 60))
        try:
            await eventually(lambda: len(sent) >= 5)
            raised_at.append(time.time())
            out = await asyncio.to_thread(
                spendbus,
                kafka_bootstrap,
                topics,
                home,
                "budgets",
                "raise",
                BROKE.budget_id,
                "--scope",
                "broke",
                "--by",
                "10",
                "--until",
                "8s",
                "--reason",
                "month-end batch",
            )
            assert "$5.00 -> $15.00" in out, out
            listed = json.loads(
                await asyncio.to_thread(
                    spendbus, kafka_bootstrap, topics, home, "budgets", "raises", "--json"
                )
            )
            (entry,) = listed
            until = datetime.fromisoformat(entry["until"]).astimezone(UTC).timestamp()
            assert entry["status"] == "active" and entry["scope_values"] == ["broke"]
            # traffic goes on until two seconds past the raise's end
            await eventually(lambda: time.time() > until + 2, timeout=60)
        finally:
            load.cancel()
            await asyncio.gather(load, return_exceptions=True)

        before = [s for s in sent if s[1] < raised_at[0]]
        during = [s for s in sent if raised_at[0] <= s[0] and s[1] < until]
        after = [s for s in sent if s[0] >= until]
        assert before and all(s[2] == 402 for s in before)
        assert any(s[2] == 200 for s in during), "the raise never let one through"
        # once the raise reached the enforcer, every request checked before its end passed
        first = next(s[0] for s in during if s[2] == 200)
        assert all(s[2] == 200 for s in during if s[0] >= first)
        # from --until on, refused again against the base limit
        assert after and all(s[2] == 402 for s in after)
        assert all(s[3] is not None and s[3]["limit_nanos"] == BROKE.limit_nanos for s in after)
        assert all(s[3] is not None and "raise" not in s[3] for s in after)
        status = json.loads(
            await asyncio.to_thread(
                spendbus, kafka_bootstrap, topics, home, "budgets", "raises", "--json"
            )
        )
        assert [r["status"] for r in status] == ["expired"]
        assert (await stack.upstream_stats())["requests"] == sum(s[2] == 200 for s in sent)
