"""The admin API's aiohttp app and how it is served: bearer tokens checked, every refusal
a JSON 4xx, on loopback only.

The tokens travel in every request, and this server speaks plain HTTP: to reach it from
another host, put a TLS-terminating proxy on that host's side of loopback (docs/security.md).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final

from aiohttp import web

from admin import api
from admin.access import VIRTUAL_KEY, Caller
from admin.console import mount_console
from admin.dead_letters import DeadLetterFollower
from admin.errors import ApiError
from admin.openapi import openapi_document
from admin.reports import SpendQuery
from admin.routes import PREFIX, ROUTES, Route
from admin.store import AdminConfig, AdminStore
from admin.tokens import TOKEN_PREFIX, TokenBook
from runtime.http_receive import close_after, run_app, server_options
from runtime.net import is_loopback
from schemas.errors import ConfigError, SpendbusError

log = logging.getLogger("spendbus.admin")

DEFAULT_PORT: Final = 6070
#: seconds a client has to send a request head (and the longest a connection idles)
DEFAULT_HEADER_TIMEOUT_S: Final = 10.0
#: the server's settings: a head's deadline, and no lingering on a body left unread (a
#: refused one: the answer is sent and the connection closed, not held for 10 s more)
SERVER_OPTIONS: Final = {**server_options(DEFAULT_HEADER_TIMEOUT_S), "lingering_time": 0}


def _bound(route: Route) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handle(request: web.Request) -> web.StreamResponse:
        caller = _caller(request)
        if caller.role == VIRTUAL_KEY and not route.keys_may_call:
            raise ApiError(403, "a virtual key reads its own counters only")
        return await route.handler(request, caller)

    return handle


def _caller(request: web.Request) -> Caller:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "missing bearer token (Authorization: Bearer <admin token>)")
    if not token.strip().startswith(TOKEN_PREFIX):  # a gateway's virtual key, or nothing
        key_caller = api.key_caller(request.app[api.STORE], token.strip(), request.remote or "")
        if key_caller is None:
            raise ApiError(401, "unknown or revoked admin token or virtual key")
        return key_caller
    try:
        record = request.app[api.TOKENS].verify(token.strip())
    except ConfigError as exc:
        log.error("admin tokens file: %s", exc)
        raise ApiError(503, "the admin tokens file cannot be read (see the server's log)") from None
    if record is None:
        raise ApiError(401, "unknown or revoked admin token")
    return Caller.of(record, request.remote or "")


@web.middleware
async def json_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except api.ClosingError as exc:
        return close_after(exc.response())
    except ApiError as exc:
        return exc.response()
    except web.HTTPException as exc:  # no route, wrong method: the same JSON shape
        if exc.status < 400:
            raise
        return ApiError(exc.status, f"{request.method} {request.path}: {exc.reason}").response()
    except SpendbusError as exc:  # a record the topics hold that does not decode, and the like
        log.error("admin API: %s %s: %s", request.method, request.path, exc)
        return ApiError(503, f"the server could not read its state: {exc}").response()


def build_app(
    store: AdminStore,
    tokens: TokenBook,
    *,
    spend_query: SpendQuery | None = None,
    max_body_bytes: int = api.DEFAULT_MAX_BODY_BYTES,
    body_timeout_s: float = api.DEFAULT_BODY_TIMEOUT_S,
) -> web.Application:
    """The app; ``store`` is started and stopped with it. ``spend_query`` runs a spend
    report's SELECT on ClickHouse (None: reports answer 503)."""
    # aiohttp's own limit sits past ours: read_body answers the JSON 413 first
    app = web.Application(client_max_size=max_body_bytes + 1, middlewares=[json_errors])
    app[api.STORE] = store
    app[api.TOKENS] = tokens
    app[api.LIMITS] = (max_body_bytes, body_timeout_s)
    app[api.SPEND_QUERY] = spend_query
    app[api.DEAD_LETTERS] = DeadLetterFollower(
        store.config.bootstrap, store.config.topics.usage_dlq, store.config.security
    )
    for route in ROUTES:
        app.router.add_route(route.method, PREFIX + route.path, _bound(route))
    document = openapi_document()

    async def openapi(request: web.Request) -> web.StreamResponse:
        return web.json_response(document)

    async def healthz(request: web.Request) -> web.StreamResponse:
        return web.json_response({"status": "ok"})

    app.router.add_get("/openapi.json", openapi)
    app.router.add_get("/healthz", healthz)
    mount_console(app)  # the HTML console at / (admin/console/)

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        await store.start()
        yield
        await app[api.DEAD_LETTERS].stop()
        await store.stop()

    app.cleanup_ctx.append(lifecycle)
    return app


def serve_admin(
    config: AdminConfig,
    tokens: TokenBook,
    *,
    spend_query: SpendQuery | None = None,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    print_fn: Callable[..., None] | None = print,
) -> None:
    """Serve until SIGINT/SIGTERM, on a loopback address only."""
    if not is_loopback(host):
        raise ConfigError(
            f"admin API on {host}: it serves loopback only (its bearer tokens would cross "
            "the network in clear): bind 127.0.0.1 and put a TLS proxy in front"
        )
    app = build_app(AdminStore(config), tokens, spend_query=spend_query)
    run_app(
        app,
        host=host,
        port=port,
        print_fn=print_fn,
        access_log=None,
        **SERVER_OPTIONS,
    )
