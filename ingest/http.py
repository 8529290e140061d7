"""HTTP ingest for proxies in other languages: ``POST /v1/usage`` (aiohttp).

A thin adapter over :class:`~ingest.publisher.UsagePublisher`:

``POST /v1/usage``
    ``Authorization: Bearer <token>`` (compared in constant time), body a JSON
    array of UsageEvents in their JSON form (``schemas.usage.usage_event_from_json``).

    - **All or nothing per request**: every event is validated (and encoded)
      before any is published. If one is invalid the answer is ``400`` with
      ``{"error": ..., "events": [{"index", "event_id", "field", "reason"}, ...]}``
      naming every bad event, and nothing is published.
    - ``202 {"accepted": n}`` only once the broker acknowledged every event of
      the request (the handler waits for the publisher's flush).
    - ``503`` (with ``Retry-After``) when the spool is full or the broker did not
      acknowledge within ``ack_timeout_s``. In the second case the events are
      spooled and *will* be delivered; re-posting them is safe.
    - **Idempotent by event_id**: re-posting an event publishes it again under
      the same event_id; the aggregator counts an event_id once. So a client
      retries a request whose answer it did not get, unchanged.
    - ``401`` without a valid token; ``413`` for a body over ``max_body_bytes``
      (a declared ``Content-Length`` over it is refused before anything is read)
      or more than ``max_events`` events; ``400`` for a body that is not a JSON
      array (malformed, or nested too deeply to read); ``408`` for a body not
      received within ``body_timeout_s`` of its head. A 408 or 413 closes the
      connection. A request head not received within ``header_timeout_s`` (which
      is also the longest a keep-alive connection idles) closes the connection.

``GET /v1/usage/schema``
    The JSON Schema (draft 2020-12) of ``POST /v1/usage``'s body, as shipped in
    ``schemas/json/usage_ingest_body.schema.json`` (``application/schema+json``). No auth:
    it is the public contract.

``GET /healthz``
    ``200`` with the publisher's status while it runs, else ``503``. No auth.

``GET /metrics``
    Prometheus text: the publisher's metrics and the requests by status. No auth.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Final

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, Counter, generate_latest

from ingest.errors import PublisherClosed, PublishTimeout, SpoolFull, reason_of
from ingest.publisher import PreparedEvent, PublisherConfig, UsagePublisher
from ingest.receive import BodyRefused, close_after, read_body, run_app, server_options
from runtime.http_log import expose_malformed_requests
from schemas.errors import ConfigError, InvalidRecord
from schemas.usage import usage_event_from_json
from schemas.usage_json_schema import shipped_schema_bytes

log = logging.getLogger(__name__)

#: where the server answers the JSON Schema of the body it takes
USAGE_SCHEMA_PATH: Final = "/v1/usage/schema"
DEFAULT_MAX_BODY_BYTES: Final = 4 * 1024 * 1024
DEFAULT_MAX_EVENTS: Final = 10_000
DEFAULT_ACK_TIMEOUT_S: Final = 10.0
#: seconds a client has to send a request head (and the longest a keep-alive connection
#: idles), and to send the body once the head is in (408 after)
DEFAULT_HEADER_TIMEOUT_S: Final = 30.0
DEFAULT_BODY_TIMEOUT_S: Final = 60.0
#: seconds a client is told to wait before retrying after a 503
RETRY_AFTER_S: Final = 5

PUBLISHER_KEY: Final = web.AppKey("publisher", UsagePublisher)


def event_error(index: int, obj: Any, exc: InvalidRecord) -> dict[str, Any]:
    """One entry of a 400's ``events`` list: which event, which field, why."""
    event_id = exc.record_id
    if event_id is None and isinstance(obj, dict) and isinstance(obj.get("event_id"), str):
        event_id = obj["event_id"]
    return {"index": index, "event_id": event_id, "field": exc.field, "reason": reason_of(exc)}


def build_app(
    publisher: UsagePublisher,
    *,
    token: str,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_events: int = DEFAULT_MAX_EVENTS,
    ack_timeout_s: float = DEFAULT_ACK_TIMEOUT_S,
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
) -> web.Application:
    """The ingest app over a publisher the caller starts and stops (see :func:`create_app`)."""
    if not token:
        raise ConfigError(
            "the HTTP ingest needs a bearer token (--token-file or SPENDBUS_INGEST_TOKEN)"
        )
    endpoint = _UsageEndpoint(
        publisher,
        expected=token.encode("utf-8"),
        max_body_bytes=max_body_bytes,
        max_events=max_events,
        ack_timeout_s=ack_timeout_s,
        body_timeout_s=body_timeout_s,
    )
    app = web.Application(client_max_size=max_body_bytes)
    app[PUBLISHER_KEY] = publisher
    app.router.add_post("/v1/usage", endpoint.post_usage)
    app.router.add_get(USAGE_SCHEMA_PATH, endpoint.usage_schema)
    app.router.add_get("/healthz", endpoint.healthz)
    app.router.add_get("/metrics", endpoint.metrics)
    return app


class _UsageEndpoint:
    """The handlers of :func:`build_app`, over one publisher and its metrics registry."""

    def __init__(
        self,
        publisher: UsagePublisher,
        *,
        expected: bytes,
        max_body_bytes: int,
        max_events: int,
        ack_timeout_s: float,
        body_timeout_s: float,
    ) -> None:
        self.publisher = publisher
        self._expected = expected
        self.max_body_bytes = max_body_bytes
        self.max_events = max_events
        self.ack_timeout_s = ack_timeout_s
        self.body_timeout_s = body_timeout_s
        #: read once: the file the package ships, byte for byte
        self.schema_bytes = shipped_schema_bytes()
        self.registry = publisher.metrics.registry
        expose_malformed_requests(self.registry)  # refused heads (runtime/http_log.py)
        self._requests = Counter(
            "spendbus_ingest_http_requests",
            "POST /v1/usage requests by status code",
            ["code"],
            registry=self.registry,
        )

    def answer(self, status: int, body: dict[str, Any], **headers: str) -> web.Response:
        self._requests.labels(str(status)).inc()
        return web.json_response(body, status=status, headers=headers or None)

    def authorized(self, request: web.Request) -> bool:
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        # constant time over the token's bytes, whatever the client sent
        return hmac.compare_digest(given.strip().encode("utf-8"), self._expected)

    async def post_usage(self, request: web.Request) -> web.Response:
        if not self.authorized(request):
            return self.answer(
                401, {"error": "missing or invalid bearer token"}, **{"WWW-Authenticate": "Bearer"}
            )
        try:
            body = await read_body(
                request, timeout_s=self.body_timeout_s, max_bytes=self.max_body_bytes
            )
        except BodyRefused as exc:
            return close_after(self.answer(exc.status, {"error": exc.reason}))
        try:
            payload = json.loads(body)
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            return self.answer(400, {"error": f"invalid JSON: {exc}"})
        if not isinstance(payload, list):
            return self.answer(400, {"error": "the body must be a JSON array of UsageEvents"})
        if len(payload) > self.max_events:
            return self.answer(
                413, {"error": f"{len(payload)} events in one request; at most {self.max_events}"}
            )
        prepared, errors = self._prepare(payload)
        if errors:
            return self.answer(
                400,
                {
                    "error": f"{len(errors)} of {len(payload)} events are invalid; "
                    "none of the request was published",
                    "events": errors,
                },
            )
        return await self._publish(prepared)

    def _prepare(self, payload: list[Any]) -> tuple[list[PreparedEvent], list[dict[str, Any]]]:
        """Every event validated and encoded: ``(prepared, errors)``, one error per bad event."""
        publisher = self.publisher
        prepared: list[PreparedEvent] = []
        errors: list[dict[str, Any]] = []
        for index, obj in enumerate(payload):
            try:
                event = usage_event_from_json(obj)
            except InvalidRecord as exc:
                publisher.metrics.rejected(exc.field)
                errors.append(event_error(index, obj, exc))
                continue
            try:
                prepared.append(publisher.prepare(event))
            except InvalidRecord as exc:
                errors.append(event_error(index, obj, exc))
        return prepared, errors

    async def _publish(self, prepared: list[PreparedEvent]) -> web.Response:
        """202 once the broker acknowledged every event, else 503 saying why."""
        retry = {"Retry-After": str(RETRY_AFTER_S)}
        try:
            await self.publisher.publish_prepared(prepared)
            await self.publisher.flush(self.ack_timeout_s)
        except SpoolFull as exc:
            return self.answer(503, {"error": f"spool full: {exc}"}, **retry)
        except PublishTimeout:
            return self.answer(
                503,
                {
                    "error": f"the broker did not acknowledge within {self.ack_timeout_s}s; the "
                    "events are spooled and will be delivered; re-posting them (same event ids) "
                    "is safe",
                    "spooled": len(prepared),
                },
                **retry,
            )
        except PublisherClosed as exc:
            return self.answer(503, {"error": f"shutting down: {exc}"}, **retry)
        return self.answer(202, {"accepted": len(prepared)})

    async def usage_schema(self, request: web.Request) -> web.Response:
        return web.Response(body=self.schema_bytes, content_type="application/schema+json")

    async def healthz(self, request: web.Request) -> web.Response:
        status = self.publisher.status()
        ok = status["state"] == "running"
        return web.json_response(
            {"status": "ok" if ok else "down", **status}, status=200 if ok else 503
        )

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )


def create_app(
    config: PublisherConfig,
    *,
    token: str,
    drain_timeout_s: float = 10.0,
    **options: Any,
) -> web.Application:
    """The ingest app owning its publisher: started with the app, stopped (drained) with it."""
    publisher = UsagePublisher(config)
    app = build_app(publisher, token=token, **options)

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        await publisher.start()
        log.info(
            "ingest: publishing to %s via %s (spool %s)",
            config.topic,
            config.bootstrap,
            config.spool_dir,
        )
        yield
        await publisher.stop(timeout=drain_timeout_s)

    app.cleanup_ctx.append(lifecycle)
    return app


def serve_http_ingest(
    config: PublisherConfig,
    *,
    token: str,
    host: str = "127.0.0.1",
    port: int = 8787,
    print_fn: Callable[..., None] | None = print,
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
    **options: Any,
) -> None:
    """Serve until SIGINT/SIGTERM, then drain and stop the publisher."""
    app = create_app(config, token=token, **options)
    # answers a client that shut its sending side after a whole request (web.run_app's
    # server closes such a connection without the answer: the client retries accepted events)
    run_app(
        app,
        host=host,
        port=port,
        print_fn=print_fn,
        access_log=None,
        **server_options(header_timeout_s),
    )


__all__ = [
    "DEFAULT_ACK_TIMEOUT_S",
    "DEFAULT_BODY_TIMEOUT_S",
    "DEFAULT_HEADER_TIMEOUT_S",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_EVENTS",
    "PUBLISHER_KEY",
    "build_app",
    "create_app",
    "event_error",
    "serve_http_ingest",
]
