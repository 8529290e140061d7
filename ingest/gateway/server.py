"""Serving a :class:`~ingest.gateway.Gateway` on a port (the command, tests, the bench, the demo)."""

from __future__ import annotations

import gc
from types import TracebackType

from aiohttp import web

from ingest.receive import AnswerAfterHalfClose

from .proxy import Gateway


class GatewayServer:
    """The gateway's app on ``host``:``port`` (0: any free port); ``url`` once started."""

    def __init__(self, gateway: Gateway, host: str = "127.0.0.1", port: int = 0) -> None:
        self.gateway = gateway
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> str:
        # a client that shut its sending side after its request still gets the answer
        runner = AnswerAfterHalfClose(
            self.gateway.app(),
            access_log=None,
            handle_signals=False,
            **self.gateway.server_options(),
        )
        await runner.setup()
        # What exists before the first request (imports, config, the enforcer's state, the
        # price book) lives as long as the server: frozen, a full collection no longer walks
        # it. Unfrozen, a full collection in the gateway held the event loop long enough to
        # be felt (every stream's next chunk and every admission waited behind it); frozen,
        # a small part of that (bench/records/comment_figures_2026-12-07.jsonl). Before
        # listening: the one collection here delays no client.
        gc.collect()
        gc.freeze()
        try:
            site = web.TCPSite(runner, self.host, self.port, reuse_address=True)
            await site.start()
        except BaseException:
            gc.unfreeze()
            await runner.cleanup()
            raise
        self._runner = runner
        ports = [a[1] for a in runner.addresses if isinstance(a, tuple)]
        self.port = ports[0] if ports else self.port
        return self.url

    async def stop(self) -> None:
        """Stop listening, finish the accounting of responses in flight, close the pool."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
            gc.unfreeze()  # what start froze is collectable again

    async def __aenter__(self) -> GatewayServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
