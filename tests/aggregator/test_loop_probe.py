"""The worker's loop probe: a loop held by synchronous work shows as lag on /stats and
/metrics (a lower bound only: nothing here depends on how fast this machine is)."""

from __future__ import annotations

import asyncio
import time

from aggregator.metrics import Metrics


def test_a_held_loop_shows_as_lag() -> None:
    metrics = Metrics()

    async def scenario() -> None:
        probe = asyncio.create_task(metrics.watch_loop(interval=0.005))
        await asyncio.sleep(0.1)
        assert metrics.snapshot()["loop_lag_ms"] is not None  # the probe is running
        time.sleep(0.2)  # a fold (or anything synchronous) holding the loop
        await asyncio.sleep(0.05)
        probe.cancel()
        await asyncio.gather(probe, return_exceptions=True)
        held = metrics.snapshot()["loop_lag_ms"]
        # the wake-up due within 5 ms of the hold's start came after its end
        assert held["max"] >= 195
        exposed = metrics.exposition().decode()
        assert 'spendbus_aggregator_loop_lag_seconds_bucket{le="0.1"}' in exposed
        assert "spendbus_aggregator_loop_lag_seconds_count" in exposed

    asyncio.run(scenario())
