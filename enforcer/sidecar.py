"""The sidecar: the enforcer over HTTP, for proxies in other languages.

A thin aiohttp adapter over :class:`enforcer.Enforcer`; it decides nothing
itself.

======================  =====  ====================================================
route                   auth   answer
======================  =====  ====================================================
POST /v1/check          yes    JSON ctx (+ optional ``"reserve": false`` to peek) →
                               the decision (``?counters=1`` adds every counter)
POST /v1/settle         yes    ``{"hold_id", "usage": {...}}`` or
                               ``{"hold_id", "release": true}`` → ``{"settled": bool}``
GET  /v1/usage          yes    ctx as query (``org_id``, ``secret_id``, ``group`` (repeat),
                               ``tag.<name>``, ...) → every counter it counts in
GET  /v1/spend          yes    the same (the name of the gateway's self-service route)
GET  /healthz           no     200 while the follower runs
GET  /readyz            no     200 once caught up and fresh, else 503
GET  /metrics           no     Prometheus text
======================  =====  ====================================================

Auth is ``Authorization: Bearer <token>`` (constant-time compare), one of
``sidecar_token`` / ``sidecar_tokens``, each token its own caller: the ``hold_id`` a check
returns is an opaque random string that only the caller that took it can settle or
release (404 ``unknown_hold`` for anyone else, as for an id never given). :class:`Sidecar`
refuses to listen without a token unless on a unix socket (``sidecar_unix``: 0600, its
permissions are the fence) or told ``sidecar_insecure_loopback`` (loopback only, logged
at WARNING). The routes are in :mod:`enforcer.sidecar_routes`, the JSON they read and
write in :mod:`enforcer.sidecar_json`; this module serves them and runs the sidecar
(enforcer, listener).
A refused check (not a peek) publishes its refusal UsageEvent through the
:class:`~schemas.usage_sink.UsageSink` it is given (``spendbus enforcer serve``
wires in the ingest publisher: its spool and retries, so a refusal made while the
broker is away arrives once it is back), unless ``publish_refusals`` is off; a
publish failure is counted, never turned into a different decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import stat
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Final

from aiohttp import web

from enforcer.config import EnforcerConfig
from enforcer.service import Enforcer
from enforcer.sidecar_json import MAX_BODY
from enforcer.sidecar_routes import Handler, routes
from runtime.half_close import HalfCloseServer
from schemas.errors import ConfigError
from schemas.usage_sink import UsageSink

log = logging.getLogger("spendbus.enforcer.sidecar")

ENFORCER_KEY: Final = web.AppKey("enforcer", Enforcer)


def create_app(
    enforcer: Enforcer,
    refusals: UsageSink | None = None,
    *,
    token: str | Sequence[str] | None = None,
) -> web.Application:
    """The sidecar's routes as an aiohttp application (to mount or test it as one;
    ``serve`` runs :func:`create_handler` instead)."""
    app = web.Application(client_max_size=MAX_BODY)
    app[ENFORCER_KEY] = enforcer
    for (method, path), handler in routes(enforcer, refusals, token=token).items():
        if method == "GET":
            app.router.add_get(path, handler)  # HEAD too
        else:
            app.router.add_route(method, path, handler)
    return app


def create_handler(
    enforcer: Enforcer,
    refusals: UsageSink | None = None,
    *,
    token: str | Sequence[str] | None = None,
) -> Handler:
    """The sidecar's routes as one low-level aiohttp handler (``web.Server``), what
    ``serve`` runs: no router, application or middleware chain per request (~1/4 of
    aiohttp's own work per check), /v1/check first. Unknown paths answer 404, other
    methods 405 with ``Allow``, as the application's router does."""
    table = routes(enforcer, refusals, token=token)
    by_path: dict[str, dict[str, Handler]] = {}
    for (method, path), handler in table.items():
        methods = by_path.setdefault(path, {})
        methods[method] = handler
        if method == "GET":
            methods["HEAD"] = handler
    check = table[("POST", "/v1/check")]

    def dispatch(request: web.BaseRequest) -> Awaitable[web.StreamResponse]:
        # a plain function returning the handler's coroutine: one coroutine per request
        path = request.path
        if path == "/v1/check" and request.method == "POST":
            return check(request)
        methods = by_path.get(path)
        if methods is None:
            raise web.HTTPNotFound()
        handler = methods.get(request.method)
        if handler is None:
            raise web.HTTPMethodNotAllowed(request.method, sorted(methods))
        return handler(request)

    return dispatch


def create_server(
    enforcer: Enforcer,
    refusals: UsageSink | None = None,
    *,
    token: str | Sequence[str] | None = None,
) -> web.Server:
    """:func:`create_handler` in aiohttp's low-level server (no access log; bodies up to
    ``MAX_BODY``, as the application allows). Call it inside the running loop."""
    loop = asyncio.get_running_loop()

    def request_factory(
        message: Any, payload: Any, protocol: Any, writer: Any, task: Any
    ) -> web.BaseRequest:
        return web.BaseRequest(
            message, payload, protocol, writer, task, loop, client_max_size=MAX_BODY
        )

    # a client that shut its sending side after its request still gets the decision
    return HalfCloseServer(
        create_handler(enforcer, refusals, token=token),
        request_factory=request_factory,
        access_log=None,
        **server_options(enforcer.config),
    )


def server_options(config: EnforcerConfig) -> dict[str, Any]:
    """aiohttp server settings for the sidecar: the header deadline is aiohttp's
    ``keepalive_timeout``, armed when a connection opens and after each response (a
    connection without a whole request head by then is closed)."""
    return {"keepalive_timeout": config.sidecar_header_timeout_s}


class Sidecar:
    """Enforcer + HTTP server, started and stopped in order; refused checks publish their
    refusal events to ``refusals`` (owned, started and stopped by the caller).

    start: 1. enforcer (reads topics) 2. HTTP listener (readyz is 503 until the enforcer
    is caught up). stop: the reverse.
    """

    def __init__(
        self,
        config: EnforcerConfig,
        *,
        clock: Callable[[], float] | None = None,
        refusals: UsageSink | None = None,
        job_key_secret: bytes | None = None,
    ) -> None:
        self.config = config
        self.enforcer = (
            Enforcer(config, job_key_secret=job_key_secret)
            if clock is None
            else Enforcer(config, clock=clock, job_key_secret=job_key_secret)
        )
        self.refusals = refusals if config.publish_refusals else None
        self._runner: web.ServerRunner | None = None
        self.port: int | None = None
        self._unix_bound: Path | None = None

    async def start(self) -> None:
        config = self.config
        open_loopback = not config.sidecar_token_values and config.sidecar_unix is None
        if open_loopback and not config.sidecar_insecure_loopback:
            raise ConfigError(
                "the sidecar needs a bearer token (sidecar_token), or a unix socket "
                "(sidecar_unix), or sidecar_insecure_loopback=True to let every local "
                "process use it"
            )
        # 1. the enforcer starts reading (checks follow fail_mode until it is ready)
        await self.enforcer.start()
        try:
            # 2. the HTTP listener (aiohttp's low-level server: see create_handler)
            self._runner = web.ServerRunner(create_server(self.enforcer, self.refusals))
            await self._runner.setup()
            site: web.BaseSite
            if config.sidecar_unix is not None:
                unix = Path(config.sidecar_unix)
                site = web.SockSite(self._runner, bind_unix(unix))
                self._unix_bound = unix
            else:
                site = web.TCPSite(self._runner, config.sidecar_host, config.sidecar_port)
            await site.start()
        except BaseException:
            await self.stop()
            raise
        if config.sidecar_unix is not None:
            self.port = None
            return
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1] if sockets else config.sidecar_port
        if open_loopback:
            log.warning(
                "insecure loopback: /v1/* on %s:%s take no token; any local process may read "
                "any org's spend, take and release holds and publish refusal events",
                config.sidecar_host,
                self.port,
            )

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._unix_bound is not None:  # the socket file this sidecar made
            with contextlib.suppress(OSError):
                self._unix_bound.unlink()
            self._unix_bound = None
        await self.enforcer.stop()


def bind_unix(path: Path) -> socket.socket:
    """A listening unix socket at ``path``, mode 0600 from the moment it exists (its
    directory made 0700 when missing); a stale socket file left by a dead sidecar is
    replaced, a live one or any other file is refused."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(mode):
            raise ConfigError(f"sidecar_unix={path}: exists and is not a socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink()  # nobody listens there: a dead sidecar's
        else:
            raise ConfigError(f"sidecar_unix={path}: another process listens there")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        previous = os.umask(0o177)  # bind creates the file 0600: no moment open to others
        try:
            sock.bind(str(path))
        finally:
            os.umask(previous)
        os.chmod(path, 0o600)
        sock.listen(1024)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


async def serve(
    config: EnforcerConfig,
    *,
    refusals: UsageSink | None = None,
    on_started: Callable[[Sidecar], None] | None = None,
    job_key_secret: bytes | None = None,
) -> None:
    """Run the sidecar until SIGINT/SIGTERM (this process is the sidecar's own), refusal
    events going to ``refusals``; ``job_key_secret``: with a policy, what job keys are
    keyed with (schemas/jobs.py)."""
    sidecar = Sidecar(config, refusals=refusals, job_key_secret=job_key_secret)
    await sidecar.start()
    if on_started is not None:
        on_started(sidecar)
    freezer = asyncio.create_task(_freeze_when_ready(sidecar.enforcer))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        # no signal handlers off the main thread or on loops without them: Ctrl-C still stops it
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        freezer.cancel()
        await sidecar.stop()


async def _freeze_when_ready(enforcer: Enforcer, poll_s: float = 0.5) -> None:
    """Once the state is loaded, move it out of the garbage collector's sight.

    100k verdicts are 100k tracked objects that every full collection would walk
    (pauses of tens of ms on the check path); they hold no cycles, so freezing
    them loses nothing (a replaced verdict is still freed by its refcount).
    """
    while not enforcer.ready:
        await asyncio.sleep(poll_s)
    gc.collect()
    gc.freeze()
    log.info("state loaded: %d objects frozen out of the collector's sight", gc.get_freeze_count())
