"""The bare aiohttp pass-through bench_gateway measures the gateway beside (its own process,
``bench_gateway.py --role passthrough``): forward the POST, relay the body chunk by chunk."""

from __future__ import annotations

import time

import aiohttp
from aiohttp import web

from bench.gateway_load import MIB


def burn(seconds: float) -> None:
    """Spin on the CPU for ``seconds`` of this thread's CPU time."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def passthrough_app(upstream: str, burn_us: float = 0.0) -> web.Application:
    """The least an aiohttp proxy can do: forward and relay, chunk by chunk.

    ``burn_us`` > 0 makes it a calibrated stand-in: it also spins that much CPU per
    request, half before forwarding and half once the response ended, where the
    gateway does its admission (check, hold) and its accounting (usage, settle)."""
    drop = {"host", "content-length", "transfer-encoding", "connection"}
    state: dict[str, aiohttp.ClientSession] = {}
    half_burn_s = burn_us / 2e6

    async def startup(_: web.Application) -> None:
        state["client"] = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), auto_decompress=False
        )

    async def cleanup(_: web.Application) -> None:
        await state["client"].close()

    async def relay(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if half_burn_s:
            burn(half_burn_s)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in drop}
        async with state["client"].post(
            upstream + request.path_qs, data=body, headers=headers
        ) as up:
            response = web.StreamResponse(
                status=up.status,
                headers={k: v for k, v in up.headers.items() if k.lower() not in drop},
            )
            await response.prepare(request)
            while chunk := await up.content.readany():
                await response.write(chunk)
            await response.write_eof()
        if half_burn_s:
            burn(half_burn_s)
        return response

    app = web.Application(client_max_size=32 * MIB)
    app.router.add_post("/{tail:.*}", relay)
    app.on_startup.append(startup)
    app.on_cleanup.append(cleanup)
    return app


def serve_passthrough(upstream: str, port: int, burn_us: float = 0.0) -> None:
    """Run :func:`passthrough_app` on 127.0.0.1:``port`` (with ``/healthz``) until stopped."""

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = passthrough_app(upstream, burn_us)
    app.router.add_get("/healthz", healthz)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)
