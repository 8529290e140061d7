"""bench_gateway's load: streams through one path, ``concurrency`` at a time (a steady
state, or a burst started at once), each one's time to the first byte and to the last,
and a probe of the direct path's TTFB while it runs."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp

MIB = 1 << 20
VIRTUAL_KEY = "vk-bench-0123456789abcdef"
PROMPT = "Summarise the retention policy of usage.raw for the finance team. " * 30


async def one(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str], body: bytes
) -> tuple[float, float, int]:
    started = time.perf_counter()
    async with session.post(url, data=body, headers=headers) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}: {(await resp.read())[:200]!r}")
        first = await resp.content.readany()
        ttfb = time.perf_counter() - started
        size = len(first)
        while chunk := await resp.content.readany():
            size += len(chunk)
    return ttfb * 1000, (time.perf_counter() - started) * 1000, size


async def first_byte(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str], body: bytes
) -> float:
    """The TTFB of one stream, in ms; the rest of the stream is not read (closed)."""
    started = time.perf_counter()
    async with session.post(url, data=body, headers=headers) as resp:
        await resp.content.readany()
        ttfb = time.perf_counter() - started
        resp.close()
    return ttfb * 1000


async def wave(
    url: str, concurrency: int, requests: int, ramp_s: float = 0.0, probe_url: str = ""
) -> dict[str, Any]:
    """``requests`` streams, ``concurrency`` at a time, each worker starting its next
    stream as its last one ends.

    The workers start spread over ``ramp_s`` (0: all at once, the burst); with
    ``ramp_s`` about one stream's length, starts and ends are continuous and,
    once every worker has started, each new stream finds ``concurrency - 1``
    others open. Only those (started at or after ``ramp_s``) are the steady
    state's TTFB percentiles; the ramp's streams are its warm-up, left out.
    ``open_at_start`` says how many streams were open as each measured one began.

    With ``probe_url`` (the upstream), one stream at a time also goes straight to the
    upstream all through the steady state: its TTFB is the load side's own delay
    (client, upstream, whatever else runs on their cores) during this wave, the same
    measure for every path, so a path that makes the load side slower shows it.
    """
    body = json.dumps(
        {
            "model": "claude-sonnet-4-5",
            "max_tokens": 1024,
            "stream": True,
            "messages": [{"role": "user", "content": PROMPT}],
        }
    ).encode()
    headers = {
        "x-api-key": VIRTUAL_KEY,
        "anthropic-version": "2023-06-01",
        "content-type": "application/json",
    }
    queue = list(range(requests))
    #: (started, streams open then, ttfb ms, total ms, bytes)
    results: list[tuple[float, int, float, float, int]] = []
    open_streams = 0
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        began = time.perf_counter()

        async def worker(index: int) -> None:
            nonlocal open_streams
            await asyncio.sleep(ramp_s * index / concurrency)
            while queue:
                queue.pop()
                started, open_then = time.perf_counter() - began, open_streams
                open_streams += 1
                try:
                    ttfb, total, size = await one(session, url + "/v1/messages", headers, body)
                finally:
                    open_streams -= 1
                results.append((started, open_then, ttfb, total, size))

        probes: list[float] = []
        done = asyncio.Event()

        async def probe() -> None:
            await asyncio.sleep(ramp_s)
            while not done.is_set():
                probes.append(await first_byte(session, probe_url + "/v1/messages", headers, body))
                await asyncio.sleep(0.02)

        prober = asyncio.ensure_future(probe()) if probe_url else None
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        done.set()
        if prober is not None:
            await prober
    measured = [r for r in results if r[0] >= ramp_s] if ramp_s else results
    ttfb = sorted(r[2] for r in measured)
    total = sorted(r[3] for r in results)
    return {
        "ttfb_p50": pct(ttfb, 50),
        "ttfb_p99": pct(ttfb, 99),
        "ttfb_ms": ttfb,  # every measured TTFB, pooled over the rounds (not printed)
        "total_p50": pct(total, 50),
        "total_p99": pct(total, 99),
        "measured": len(measured),
        "open_at_start_min": min(r[1] for r in measured),
        "bytes": sum(r[4] for r in results),
        **({"probe_ttfb_ms": sorted(probes)} if probe_url else {}),
    }


def pct(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    index = min(len(values) - 1, max(0, round(p / 100 * len(values) + 0.5) - 1))
    return values[index]
