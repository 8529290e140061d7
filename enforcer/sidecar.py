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

Auth is ``Authorization: Bearer <sidecar_token>`` (constant-time compare);
without a token the sidecar only listens on loopback (see EnforcerConfig).
A refused check (not a peek) publishes its refusal UsageEvent to usage.raw
(keyed by org_id) unless ``publish_refusals`` is off; a publish failure is
counted, never turned into a different decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hmac
import json
import logging
import signal
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, Final

import msgspec
from aiohttp import web
from aiokafka import AIOKafkaProducer

from enforcer.config import EnforcerConfig
from enforcer.context import Context
from enforcer.decision import Decision
from enforcer.errors import InvalidContext
from enforcer.metrics import EnforcerMetrics
from enforcer.service import Enforcer
from schemas.codec import USAGE_EVENT
from schemas.errors import ContractError
from schemas.periods import from_micros
from schemas.topics import Topics
from schemas.usage import PRICED_TOKEN_FIELDS, THROTTLED

log = logging.getLogger("spendbus.enforcer.sidecar")

MAX_BODY: Final = 256 * 1024
ENFORCER_KEY: Final = web.AppKey("enforcer", Enforcer)
# msgspec's JSON codec (C): the sidecar's requests and answers are small and many, and it
# reads and writes them several times faster than the stdlib (bench/bench_enforcer.py)
_dumps = msgspec.json.Encoder().encode
_loads = msgspec.json.Decoder().decode
_JSON_TYPE: Final = "application/json"


class RefusalPublisher:
    """Publishes refusal UsageEvents to usage.raw with a plain aiokafka producer."""

    def __init__(self, config: EnforcerConfig, metrics: EnforcerMetrics) -> None:
        self.topic = Topics(config.topic_prefix).usage_raw
        self.metrics = metrics
        self._producer = AIOKafkaProducer(
            bootstrap_servers=config.bootstrap,
            client_id=f"{config.client_id}-refusals",
            acks="all",
            enable_idempotence=True,
            linger_ms=5,
            **config.kafka_security.client_kwargs(),
        )
        self._pending: set[asyncio.Future[Any]] = set()

    async def start(self) -> None:
        await self._producer.start()

    async def stop(self) -> None:
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
        await self._producer.stop()

    async def publish(self, event: dict[str, Any]) -> None:
        """Hand the event to the producer; delivery is counted when the broker acknowledges."""
        try:
            future = await self._producer.send(
                self.topic, USAGE_EVENT.encode(event), key=event["org_id"].encode()
            )
        except Exception:
            self.metrics.published["error"] += 1
            log.exception("refusal event not published")
            return
        self._pending.add(future)
        future.add_done_callback(self._delivered)

    def _delivered(self, future: asyncio.Future[Any]) -> None:
        self._pending.discard(future)
        if future.cancelled() or future.exception() is not None:
            self.metrics.published["error"] += 1
            log.error("refusal event not delivered: %s", future.exception())
        else:
            self.metrics.published["ok"] += 1


# An allowed answer (the common one) is written from these pieces instead of building
# Decision.to_json()'s dict and encoding it: the same bytes (a test holds every kind of
# decision to it), with only the warning headers and the hold id filled in.
_ALLOWED_HEAD: Final = (
    b'{"allowed":true,"decision":"allowed","outcome":"allowed","status":200,'
    b'"budget_id":null,"reason":null,"retry_after":null,"headers":'
)
_ALLOWED_HOLD: Final = b',"body":null,"hold_id":'
_ALLOWED_TAIL: Final = (
    b',"over_budget":false,"job_over_budget":false,"exceeded_budgets":[],'
    b'"usage_fields":{"outcome":"allowed","decision":"allowed","decision_budget_id":null}}'
)


def decision_json(decision: Decision, *, counters: bool = False) -> bytes:
    """``Decision.to_json(counters=...)`` encoded as JSON, by the short path when allowed."""
    if counters or decision.outcome != "allowed":
        return _dumps(decision.to_json(counters=counters))
    answer = decision.response
    if answer.status != 200 or answer.body is not None or answer.retry_after is not None:
        return _dumps(decision.to_json(counters=counters))  # not the allowed answer's shape
    headers = answer.headers
    hold_id = decision.hold_id
    return b"".join(
        (
            _ALLOWED_HEAD,
            _dumps(headers) if headers else b"[]",  # tuples encode as arrays, as lists do
            _ALLOWED_HOLD,
            b"null" if hold_id is None else _dumps(hold_id),
            _ALLOWED_TAIL,
        )
    )


def _invalid_json(message: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(
        body=_dumps({"error": "invalid_json", "message": message}), content_type=_JSON_TYPE
    )


def _refused(status: int, message: str) -> web.HTTPException:
    """A body refused unread: 413 (too large) or 408 (too slow); the connection closes."""
    exc: web.HTTPException
    if status == 413:
        body = _dumps({"error": "body_too_large", "message": message})
        exc = web.HTTPRequestEntityTooLarge(MAX_BODY, text=None, body=body, content_type=_JSON_TYPE)
    else:
        body = _dumps({"error": "body_timeout", "message": message})
        exc = web.HTTPRequestTimeout(body=body, content_type=_JSON_TYPE)
    exc.force_close()
    return exc


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=_dumps(data), status=status, content_type=_JSON_TYPE)


def _error(status: int, error: str, message: str, **extra: Any) -> web.Response:
    return _json({"error": error, "message": message, **extra}, status)


#: a route's handler (a low-level aiohttp handler: it reads only what BaseRequest has)
Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


class InFlight:
    """Holds in flight per key (the context's ``secret_id``), for the optional limit.

    A hold leaves when its request is settled or released, or when the enforcer no longer
    has it (expired after ``hold_timeout_s``: looked up only when a key is at its limit,
    so a proxy that never settles cannot wedge its key for longer than that).
    """

    def __init__(self, enforcer: Enforcer, config: EnforcerConfig) -> None:
        self.enforcer = enforcer
        assert config.sidecar_max_in_flight_per_key is not None
        self.limit = config.sidecar_max_in_flight_per_key
        self.retry_after_s = config.sidecar_throttle_retry_after_s
        self.by_key: dict[str, set[int]] = {}
        self.key_of: dict[int, str] = {}
        self.refused = 0

    def admits(self, key: str) -> bool:
        held = self.by_key.get(key)
        if held is None or len(held) < self.limit:
            return True
        for hold_id in [h for h in held if self.enforcer.holds.get(h) is None]:
            self.done(hold_id)  # expired in the enforcer
        return len(self.by_key.get(key, ())) < self.limit

    def add(self, key: str, hold_id: int) -> None:
        self.by_key.setdefault(key, set()).add(hold_id)
        self.key_of[hold_id] = key

    def done(self, hold_id: int) -> None:
        key = self.key_of.pop(hold_id, None)
        if key is None:
            return
        held = self.by_key[key]
        held.discard(hold_id)
        if not held:
            del self.by_key[key]

    def refusal(self, key: str) -> dict[str, Any]:
        """A refused decision as /v1/check answers one: 429 ``throttled``, Retry-After."""
        self.refused += 1
        retry = self.retry_after_s
        message = (
            f"throttled: key {key!r} has {self.limit} requests in flight, the most it may "
            f"(sidecar_max_in_flight_per_key); retry in {retry} s."
        )
        return {
            "allowed": False,
            "decision": THROTTLED,
            "outcome": "refused",
            "status": 429,
            "budget_id": None,
            "reason": "in_flight_per_key",
            "retry_after": retry,
            "headers": [
                ["content-type", "application/json"],
                ["retry-after", str(retry)],
                ["retry-after-ms", str(retry * 1000)],
                ["x-should-retry", "true"],
            ],
            "body": {
                "error": THROTTLED,
                "reason": "in_flight_per_key",
                "secret_id": key,
                "limit": self.limit,
                "retry_after_ms": retry * 1000,
                "message": message,
            },
            "hold_id": None,
            "over_budget": False,
            "job_over_budget": False,
            "exceeded_budgets": [],
            "usage_fields": {
                "outcome": "refused",
                "decision": THROTTLED,
                "decision_budget_id": None,
            },
        }


def routes(
    enforcer: Enforcer,
    publisher: RefusalPublisher | None = None,
    *,
    token: str | None = None,
) -> dict[tuple[str, str], Handler]:
    """Every route of the sidecar, (method, path) → handler: what :func:`create_app` and
    :func:`create_handler` both serve."""
    config = enforcer.config
    if token is None and config.sidecar_token is not None:
        token = config.sidecar_token.get_secret_value()
    expected = f"Bearer {token}".encode() if token else None
    # Enforcer.check is this call (compiled) behind an interpreted method: call it directly
    decide = enforcer.checker.check
    body_timeout_s = config.sidecar_body_timeout_s
    in_flight = InFlight(enforcer, config) if config.sidecar_max_in_flight_per_key else None

    async def receive(request: web.BaseRequest) -> bytes:
        """The body within the body deadline and MAX_BODY, else a 408/413 that closes the
        connection (nothing of the rest of the body is read)."""
        declared = request.content_length
        if declared is not None and declared > MAX_BODY:
            raise _refused(413, f"a body of {declared} bytes is over the {MAX_BODY}-byte limit")
        try:
            async with asyncio.timeout(body_timeout_s):
                return await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise _refused(413, f"the body is over the {MAX_BODY}-byte limit") from None
        except TimeoutError:
            raise _refused(
                408, f"the body was not received within {body_timeout_s:g} s of its head"
            ) from None

    def unauthorized(request: web.BaseRequest) -> web.Response | None:
        """A 401 unless the request carries the bearer token (checked inline: no middleware
        layer on the hot path)."""
        if expected is None:
            return None
        given = request.headers.get("Authorization", "").encode()
        if hmac.compare_digest(given, expected):
            return None
        response = _error(401, "unauthorized", "a valid bearer token is required")
        response.headers["WWW-Authenticate"] = "Bearer"
        return response

    def parse_json(raw: bytes) -> Any:
        try:
            return _loads(raw)
        except msgspec.DecodeError:
            pass
        except RecursionError:
            raise _invalid_json("nested too deeply to read") from None
        # what msgspec refuses but the stdlib reads (NaN, ...) gets the same answer as
        # before: the context's validation says which field is wrong
        try:
            return json.loads(raw)
        except RecursionError:
            raise _invalid_json("nested too deeply to read") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise _invalid_json(str(exc)) from None

    async def read_json(request: web.BaseRequest) -> Any:
        return parse_json(await receive(request))

    async def check(request: web.BaseRequest) -> web.Response:
        if (denied := unauthorized(request)) is not None:
            return denied
        # the common case (the whole body came with the head) reads without a timer
        content = request.content
        if content.is_eof() and (request.content_length or 0) <= MAX_BODY:
            raw = await request.read()
        else:
            raw = await receive(request)
        try:  # the common case without a second coroutine (parse_json has the fallbacks)
            data = _loads(raw)
        except (msgspec.DecodeError, RecursionError):
            data = parse_json(raw)
        reserve = True
        if isinstance(data, dict) and "reserve" in data:
            data = dict(data)
            reserve = data.pop("reserve")
            if not isinstance(reserve, bool):
                return _error(400, "invalid_context", "reserve must be true or false")
        try:
            ctx = Context.from_mapping(data)
        except InvalidContext as exc:
            return _error(400, "invalid_context", str(exc), field=exc.field)
        if in_flight is not None and reserve and not in_flight.admits(ctx.secret_id):
            return _json(in_flight.refusal(ctx.secret_id))
        decision = decide(ctx, reserve=reserve)
        if in_flight is not None and decision.hold_id is not None:
            in_flight.add(ctx.secret_id, decision.hold_id)
        counters = bool(request.query_string) and request.query.get("counters") == "1"
        if publisher is not None and reserve and not decision.allowed:
            out = decision.to_json(counters=counters)
            event = decision.refusal_event()
            if event is not None:
                await publisher.publish(event)
                out["published"] = True
            return _json(out)
        return web.Response(
            body=decision_json(decision, counters=counters), content_type=_JSON_TYPE
        )

    async def settle(request: web.BaseRequest) -> web.Response:
        if (denied := unauthorized(request)) is not None:
            return denied
        data = await read_json(request)
        if not isinstance(data, dict):
            return _error(400, "invalid_settle", "expected a JSON object")
        hold_id = data.get("hold_id")
        if type(hold_id) is not int:
            return _error(400, "invalid_settle", "hold_id must be the integer /v1/check returned")
        if in_flight is not None:
            in_flight.done(hold_id)
        if data.get("release") is True:
            return _json({"settled": False, "released": enforcer.release(hold_id)})
        usage = data.get("usage")
        if not isinstance(usage, dict):
            return _error(400, "invalid_settle", "give usage {...} or release: true")
        try:
            event = _settle_event(usage, enforcer.clock())
            settled = enforcer.settle(hold_id, event)
        except ContractError as exc:
            return _error(400, "invalid_settle", str(exc))
        return _json({"settled": settled})

    async def usage(request: web.BaseRequest) -> web.Response:
        if (denied := unauthorized(request)) is not None:
            return denied
        query = request.query
        fields: dict[str, Any] = {}
        tags: dict[str, str] = {}
        for name, value in query.items():
            if name == "group":
                continue
            if name.startswith("tag."):
                tags[name[4:]] = value
            elif name in ("input_tokens", "request_bytes", "max_output_tokens"):
                try:
                    fields[name] = int(value)
                except ValueError:
                    return _error(400, "invalid_context", f"{name} must be an integer")
            else:
                fields[name] = value
        fields["groups"] = query.getall("group", [])
        fields["tags"] = tags
        try:
            ctx = Context.from_mapping(fields)
        except InvalidContext as exc:
            return _error(400, "invalid_context", str(exc), field=exc.field)
        counters = [c.to_json() for c in enforcer.usage(ctx)]
        return _json({"ready": enforcer.ready, "stale": enforcer.stale, "counters": counters})

    async def healthz(request: web.BaseRequest) -> web.Response:
        failure = enforcer.follower.failure
        if failure is not None:
            return _json({"status": "failed", "error": repr(failure)}, 500)
        return _json({"status": "ok"})

    async def readyz(request: web.BaseRequest) -> web.Response:
        ready, stale = enforcer.ready, enforcer.stale
        body = {
            "ready": ready,
            "stale": stale,
            "counters": len(enforcer.state.verdicts),
            "budgets": len(enforcer.state.budgets),
        }
        return _json(body, 200 if ready and not stale else 503)

    async def metrics(request: web.BaseRequest) -> web.Response:
        return web.Response(
            body=enforcer.metrics.render(),
            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
        )

    return {
        ("POST", "/v1/check"): check,
        ("POST", "/v1/settle"): settle,
        ("GET", "/v1/usage"): usage,
        ("GET", "/v1/spend"): usage,
        ("GET", "/healthz"): healthz,
        ("GET", "/readyz"): readyz,
        ("GET", "/metrics"): metrics,
    }


def create_app(
    enforcer: Enforcer,
    publisher: RefusalPublisher | None = None,
    *,
    token: str | None = None,
) -> web.Application:
    """The sidecar's routes as an aiohttp application (to mount or test it as one;
    ``serve`` runs :func:`create_handler` instead)."""
    app = web.Application(client_max_size=MAX_BODY)
    app[ENFORCER_KEY] = enforcer
    for (method, path), handler in routes(enforcer, publisher, token=token).items():
        if method == "GET":
            app.router.add_get(path, handler)  # HEAD too
        else:
            app.router.add_route(method, path, handler)
    return app


def create_handler(
    enforcer: Enforcer,
    publisher: RefusalPublisher | None = None,
    *,
    token: str | None = None,
) -> Handler:
    """The sidecar's routes as one low-level aiohttp handler (``web.Server``), what
    ``serve`` runs: no router, application or middleware chain per request (~1/4 of
    aiohttp's own work per check), /v1/check first. Unknown paths answer 404, other
    methods 405 with ``Allow``, as the application's router does."""
    table = routes(enforcer, publisher, token=token)
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
    publisher: RefusalPublisher | None = None,
    *,
    token: str | None = None,
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

    return web.Server(
        create_handler(enforcer, publisher, token=token),
        request_factory=request_factory,
        access_log=None,
        **server_options(enforcer.config),
    )


def server_options(config: EnforcerConfig) -> dict[str, Any]:
    """aiohttp server settings for the sidecar: the header deadline is aiohttp's
    ``keepalive_timeout``, armed when a connection opens and after each response (a
    connection without a whole request head by then is closed)."""
    return {"keepalive_timeout": config.sidecar_header_timeout_s}


def _settle_event(usage: dict[str, Any], now_s: float) -> dict[str, Any]:
    """The fields settle reads, from a JSON usage object (times RFC 3339 or µs)."""
    occurred = usage.get("occurred_at")
    if occurred is None:
        at = from_micros(int(now_s * 1_000_000))
    elif type(occurred) is int:
        at = from_micros(occurred)
    elif isinstance(occurred, str):
        try:
            at = datetime.fromisoformat(occurred.replace("Z", "+00:00"))
        except ValueError:
            raise ContractError(f"occurred_at: not an RFC 3339 time: {occurred!r}") from None
        if at.tzinfo is None:
            raise ContractError("occurred_at: needs a time zone (use Z for UTC)")
    else:
        raise ContractError("occurred_at: an RFC 3339 string or integer microseconds")
    model = usage.get("model")
    if not isinstance(model, str) or not model:
        raise ContractError("model: required, the model the provider billed")
    event: dict[str, Any] = {"model": model, "occurred_at": at}
    for name in PRICED_TOKEN_FIELDS:
        value = usage.get(name, 0)
        if type(value) is not int or value < 0:
            raise ContractError(f"{name}: must be an integer >= 0")
        event[name] = value
    units = usage.get("units")
    if units is not None and not isinstance(units, dict):
        raise ContractError("units: a map of unit name to count")
    event["units"] = units  # checked by the price book (names, counts)
    tier = usage.get("service_tier")
    if tier is not None and not isinstance(tier, str):
        raise ContractError("service_tier: a tier name")
    event["service_tier"] = tier
    event["outcome"] = usage.get("outcome", "allowed")
    return event


class Sidecar:
    """Enforcer + refusal publisher + HTTP server, started and stopped in order.

    start: 1. enforcer (reads topics) 2. publisher 3. HTTP listener (readyz is 503
    until the enforcer is caught up). stop: the reverse.
    """

    def __init__(
        self,
        config: EnforcerConfig,
        *,
        clock: Callable[[], float] | None = None,
        publish: bool | None = None,
    ) -> None:
        self.config = config
        self.enforcer = Enforcer(config) if clock is None else Enforcer(config, clock=clock)
        wants = config.publish_refusals if publish is None else publish
        self.publisher = RefusalPublisher(config, self.enforcer.metrics) if wants else None
        self._runner: web.ServerRunner | None = None
        self.port: int | None = None

    async def start(self) -> None:
        # 1. the enforcer starts reading (checks follow fail_mode until it is ready)
        await self.enforcer.start()
        try:
            # 2. the refusal publisher
            if self.publisher is not None:
                await self.publisher.start()
            # 3. the HTTP listener (aiohttp's low-level server: see create_handler)
            self._runner = web.ServerRunner(create_server(self.enforcer, self.publisher))
            await self._runner.setup()
            site = web.TCPSite(self._runner, self.config.sidecar_host, self.config.sidecar_port)
            await site.start()
        except BaseException:
            await self.stop()
            raise
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1] if sockets else self.config.sidecar_port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.publisher is not None:
            await self.publisher.stop()
        await self.enforcer.stop()


async def serve(
    config: EnforcerConfig, *, on_started: Callable[[Sidecar], None] | None = None
) -> None:
    """Run the sidecar until SIGINT/SIGTERM (this process is the sidecar's own)."""
    sidecar = Sidecar(config)
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
