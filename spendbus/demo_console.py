"""The spend console over the demo's stack, once its checks passed: the admin server
(admin/, through its face) on loopback, and a platform-admin login minted for it, so
whoever ran ``make demo`` opens the console and finds the refused key, why and when it
resets. Held on a terminal until Ctrl-C or for ``TERMINAL_HOLD_S`` (a demo driven through
a pseudo-terminal still ends by itself); off one (CI, a pipe) only for ``--hold``
seconds, and not at all without it."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Final

from spendbus.settings import Settings

#: how long a demo on a terminal serves its console unless Ctrl-C comes first
TERMINAL_HOLD_S: Final = 900.0


@dataclass(frozen=True)
class ServedConsole:
    url: str
    #: a platform-admin token minted for this console (shown once)
    token: str
    token_id: str


def hold_seconds(hold: float | None, on_terminal: bool) -> float | None:
    """How long the demo serves its console: ``--hold`` when given (infinity: until
    Ctrl-C), else ``TERMINAL_HOLD_S`` on a terminal, else not at all (None)."""
    if hold is not None:
        return hold
    return TERMINAL_HOLD_S if on_terminal else None


@asynccontextmanager
async def console_served(settings: Settings, bootstrap: str) -> AsyncIterator[ServedConsole]:
    """The admin server and its console over the demo's stack, on ``admin_port`` (another
    free port when that one is taken: a second stack may hold it)."""
    from aiohttp import web

    from admin import SERVER_OPTIONS, AdminConfig, AdminStore, build_app
    from spendbus.commands.admin_api import spend_query, token_book
    from spendbus.stack.key_secret import key_secret

    config = AdminConfig(
        bootstrap=bootstrap,
        topics=settings.topics,
        key_secret=key_secret(settings),
        security=settings.kafka_security,
    )
    tokens = token_book(settings)
    app = build_app(AdminStore(config), tokens, spend_query=spend_query(settings))
    runner = web.AppRunner(app, access_log=None, **SERVER_OPTIONS)
    await runner.setup()
    try:
        try:
            await web.TCPSite(runner, "127.0.0.1", settings.admin_port).start()
        except OSError:  # the port is taken: any free one, and the address says which
            await web.TCPSite(runner, "127.0.0.1", 0).start()
        port = next(a[1] for a in runner.addresses if isinstance(a, tuple))
        token, record = tokens.mint("platform-admin", None)
        yield ServedConsole(f"http://127.0.0.1:{port}/", token, record.token_id)
    finally:
        await runner.cleanup()


def served_lines(served: ServedConsole, seconds: float) -> list[str]:
    until = (
        "until Ctrl-C; the demo stack stops then"
        if math.isinf(seconds)
        else f"for {seconds:g} s or until Ctrl-C; the demo stack stops then"
    )
    return [
        f"spend console: {served.url}  (serving {until})",
        f"console login (platform-admin token {served.token_id}, shown once): {served.token}",
        "open it: the Budgets table names the refused key (state exceeded), why (the "
        "budget and its limit) and when it resets",
    ]


def hold_console(
    settings: Settings, bootstrap: str, seconds: float, print_line: Callable[[str], None]
) -> None:
    """Serve the console for ``seconds`` (infinity: until Ctrl-C), printing its address
    and a login first."""

    async def serve() -> None:
        async with console_served(settings, bootstrap) as served:
            for line in served_lines(served, seconds):
                print_line(line)
            if math.isinf(seconds):
                await asyncio.Event().wait()
            else:
                await asyncio.sleep(seconds)

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        print_line("Ctrl-C: the console stops")
