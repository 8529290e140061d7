"""The sidecar's routes: /v1/check, /v1/settle, /v1/usage (/v1/spend), /healthz,
/readyz and /metrics as low-level aiohttp handlers, who the caller is (its bearer
token), the hold ids the sidecar hands out (opaque, bound to their caller), the optional
per-key in-flight limit, and the settle body's usage read into what ``settle`` takes.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any

import msgspec
from aiohttp import web

from enforcer.config import EnforcerConfig
from enforcer.context import Context
from enforcer.decision import Decision
from enforcer.errors import InvalidContext
from enforcer.holds import Holds
from enforcer.service import Enforcer
from enforcer.sidecar_json import (
    JSON_TYPE,
    MAX_BODY,
    body_refused,
    decision_dict,
    decision_json,
    error_response,
    invalid_json,
    json_response,
    loads,
)
from schemas.errors import ContractError
from schemas.periods import from_micros
from schemas.records import UsageEvent
from schemas.usage import PRICED_TOKEN_FIELDS, THROTTLED
from schemas.usage_sink import UsageSink

log = logging.getLogger("spendbus.enforcer.sidecar")

#: a route's handler (a low-level aiohttp handler: it reads only what BaseRequest has)
Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


#: random bytes in a hold id the sidecar hands out (URL-safe base64: 22 characters)
HOLD_ID_BYTES = 16


class Callers:
    """Who a request comes from: the bearer tokens the sidecar accepts, each its own caller.

    A caller is named by a digest of its token (never the token): what a hold is bound
    to. Without any token (``sidecar_insecure_loopback``, or a unix socket fenced by its
    permissions) every request is the one anonymous caller ``""``.
    """

    def __init__(self, tokens: tuple[str, ...]) -> None:
        self.open = not tokens
        #: (the whole Authorization value expected, the caller it names)
        self._expected = tuple(
            (f"Bearer {token}".encode(), hashlib.sha256(token.encode()).hexdigest()[:32])
            for token in tokens
        )

    def of(self, request: web.BaseRequest) -> str | None:
        """The caller, or None when the request carries no accepted token (a 401).

        Every accepted token is compared (constant time each), so the time taken does
        not say which one matched."""
        if self.open:
            return ""
        given = request.headers.get("Authorization", "").encode()
        caller = None
        for expected, name in self._expected:
            if hmac.compare_digest(given, expected):
                caller = name
        return caller


class HoldIds:
    """The hold ids on the sidecar's wire: opaque strings of HOLD_ID_BYTES random bytes
    (not the enforcer's sequential integers, which stay its own), each naming one hold
    in flight and the caller that took it.

    An id works for its caller while the hold is in flight; once settled, released or
    expired it is forgotten, and an unknown id, a forgotten one and another caller's are
    the same "no such hold" (nothing is changed). Ids are kept in the order they were
    given, which is the order of their holds' deadlines (one timeout for every hold), so
    each new id first drops the oldest ones whose holds are gone: at most one id per hold
    in flight is kept, plus those expired since the last check.
    """

    def __init__(self, holds: Holds) -> None:
        self.holds = holds
        #: wire id -> (the enforcer's hold id, the caller that took it), oldest first
        self._ids: OrderedDict[str, tuple[int, str]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._ids)

    def issue(self, hold_id: int, caller: str) -> str:
        """A new wire id for ``hold_id``, taken by ``caller``."""
        ids = self._ids
        if ids:
            self._drop_gone()
        wire = secrets.token_urlsafe(HOLD_ID_BYTES)
        ids[wire] = (hold_id, caller)
        return wire

    def find(self, wire: str, caller: str) -> int | None:
        """The enforcer's id of ``caller``'s hold in flight named ``wire``; None when there
        is none (never given, another caller's, settled, released or expired)."""
        entry = self._ids.get(wire)
        if entry is None:
            return None
        hold_id, owner = entry
        if not hmac.compare_digest(owner, caller):
            return None  # someone else's: left as it is
        hold = self.holds.get(hold_id)
        if hold is None or hold.occurred_us is not None:
            del self._ids[wire]  # expired (or settled outside the sidecar)
            return None
        return hold_id

    def forget(self, wire: str) -> None:
        self._ids.pop(wire, None)

    def _drop_gone(self) -> None:
        ids = self._ids
        holds = self.holds
        while ids:
            wire, (hold_id, _) = next(iter(ids.items()))
            hold = holds.get(hold_id)
            if hold is not None and hold.occurred_us is None:
                return  # in flight: the ids after it are younger
            del ids[wire]


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
        self.enforcer.metrics.in_flight_per_key_refusals += 1
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
    refusals: UsageSink | None = None,
    *,
    token: str | Sequence[str] | None = None,
) -> dict[tuple[str, str], Handler]:
    """Every route of the sidecar, (method, path) → handler: what :func:`create_app` and
    :func:`create_handler` both serve.

    ``token``: the bearer token(s) /v1/* accept, each its own caller (default: the
    config's ``sidecar_token`` and ``sidecar_tokens``); with none at all every request is
    served as one anonymous caller (:class:`~enforcer.sidecar.Sidecar` listens that way
    only on a unix socket or with ``sidecar_insecure_loopback``)."""
    if token is None:
        tokens = enforcer.config.sidecar_token_values
    else:
        tokens = (token,) if isinstance(token, str) else tuple(token)
    served = Routes(enforcer, refusals, Callers(tuple(t for t in tokens if t)))
    return {
        ("POST", "/v1/check"): served.check,
        ("POST", "/v1/settle"): served.settle,
        ("GET", "/v1/usage"): served.usage,
        ("GET", "/v1/spend"): served.usage,
        ("GET", "/healthz"): served.healthz,
        ("GET", "/readyz"): served.readyz,
        ("GET", "/metrics"): served.metrics,
    }


class Routes:
    """The sidecar's handlers over one enforcer, with its callers, the hold ids it handed
    out and the per-key in-flight limit (when configured)."""

    def __init__(self, enforcer: Enforcer, refusals: UsageSink | None, callers: Callers) -> None:
        config = enforcer.config
        self.enforcer = enforcer
        #: where refusal events go (None: not published)
        self.refusals = refusals
        self.caller_of = callers.of
        self.hold_ids = HoldIds(enforcer.holds)
        # Enforcer.check is this call (compiled) behind an interpreted method: call it
        # directly, unless a policy is consulted after it (Enforcer.check applies it)
        self.decide = enforcer.checker.check if enforcer.policy is None else enforcer.check
        self.body_timeout_s = config.sidecar_body_timeout_s
        self.in_flight = (
            InFlight(enforcer, config) if config.sidecar_max_in_flight_per_key else None
        )
        self.published = enforcer.metrics.published

    async def check(self, request: web.BaseRequest) -> web.Response:
        if (caller := self.caller_of(request)) is None:
            return unauthorized()
        # the common case (the whole body came with the head) reads without a timer
        content = request.content
        if content.is_eof() and (request.content_length or 0) <= MAX_BODY:
            raw = await request.read()
        else:
            raw = await self.receive(request)
        try:  # the common case without a second coroutine (parse_json has the fallbacks)
            data = loads(raw)
        except (msgspec.DecodeError, RecursionError):
            data = parse_json(raw)
        reserve = True
        if isinstance(data, dict) and "reserve" in data:
            data = dict(data)
            reserve = data.pop("reserve")
            if not isinstance(reserve, bool):
                return error_response(400, "invalid_context", "reserve must be true or false")
        try:
            ctx = Context.from_mapping(data)
        except InvalidContext as exc:
            return error_response(400, "invalid_context", str(exc), field=exc.field)
        in_flight = self.in_flight
        if in_flight is not None and reserve and not in_flight.admits(ctx.secret_id):
            return json_response(in_flight.refusal(ctx.secret_id))
        decision = self.decide(ctx, reserve=reserve)
        held = decision.hold_id
        wire_id = None
        if held is not None:
            wire_id = self.hold_ids.issue(held, caller)
            if in_flight is not None:
                in_flight.add(ctx.secret_id, held)
        counters = bool(request.query_string) and request.query.get("counters") == "1"
        if self.refusals is not None and reserve and not decision.allowed:
            return await self.refused(decision, counters, wire_id)
        return web.Response(
            body=decision_json(decision, counters=counters, hold_id=wire_id),
            content_type=JSON_TYPE,
        )

    async def refused(
        self, decision: Decision, counters: bool, wire_id: str | None
    ) -> web.Response:
        """A refusal's answer, its event published first (``published`` says so)."""
        out = decision_dict(decision, counters=counters, hold_id=wire_id)
        event = decision.refusal_event()
        if event is not None:
            await self.publish_refusal(event)
            out["published"] = True
        return json_response(out)

    async def settle(self, request: web.BaseRequest) -> web.Response:
        if (caller := self.caller_of(request)) is None:
            return unauthorized()
        data = await self.read_json(request)
        if not isinstance(data, dict):
            return error_response(400, "invalid_settle", "expected a JSON object")
        wire_id = data.get("hold_id")
        if type(wire_id) is not str:
            return error_response(
                400, "invalid_settle", "hold_id must be the string /v1/check returned"
            )
        release = data.get("release") is True
        usage = data.get("usage")
        if not release and not isinstance(usage, dict):
            return error_response(400, "invalid_settle", "give usage {...} or release: true")
        hold_id = self.hold_ids.find(wire_id, caller)
        if hold_id is None:
            return no_such_hold()
        enforcer = self.enforcer
        if release:
            released = enforcer.release(hold_id)
            settled = False
        else:
            assert isinstance(usage, dict)
            try:  # a usage refused here leaves the hold (and its id) as they were
                event = settle_event(usage, enforcer.clock())
                settled = enforcer.settle(hold_id, event)
            except ContractError as exc:
                return error_response(400, "invalid_settle", str(exc))
        self.hold_ids.forget(wire_id)
        if self.in_flight is not None:
            self.in_flight.done(hold_id)
        if release:
            return json_response({"settled": False, "released": released})
        return json_response({"settled": settled})

    async def usage(self, request: web.BaseRequest) -> web.Response:
        if self.caller_of(request) is None:
            return unauthorized()
        query = request.query
        fields: dict[str, Any] = {}
        tags: dict[str, str] = {}
        for name, value in query.items():
            if name == "group":
                continue
            if name.startswith("tag."):
                tags[name[4:]] = value
            elif name in ("input_tokens", "request_bytes", "max_output_tokens", "candidates"):
                try:
                    fields[name] = int(value)
                except ValueError:
                    return error_response(400, "invalid_context", f"{name} must be an integer")
            else:
                fields[name] = value
        fields["groups"] = query.getall("group", [])
        fields["tags"] = tags
        try:
            ctx = Context.from_mapping(fields)
        except InvalidContext as exc:
            return error_response(400, "invalid_context", str(exc), field=exc.field)
        enforcer = self.enforcer
        counters = [c.to_json() for c in enforcer.usage(ctx)]
        return json_response(
            {"ready": enforcer.ready, "stale": enforcer.stale, "counters": counters}
        )

    async def healthz(self, request: web.BaseRequest) -> web.Response:
        failure = self.enforcer.follower.failure
        if failure is not None:
            return json_response({"status": "failed", "error": repr(failure)}, 500)
        return json_response({"status": "ok"})

    async def readyz(self, request: web.BaseRequest) -> web.Response:
        enforcer = self.enforcer
        ready, stale = enforcer.ready, enforcer.stale
        body = {
            "ready": ready,
            "stale": stale,
            "counters": len(enforcer.state.verdicts),
            "budgets": len(enforcer.state.budgets),
        }
        return json_response(body, 200 if ready and not stale else 503)

    async def metrics(self, request: web.BaseRequest) -> web.Response:
        return web.Response(
            body=self.enforcer.metrics.render(),
            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
        )

    async def publish_refusal(self, event: UsageEvent) -> None:
        """Hand the refusal event to the sink (the ingest publisher spools it: it reaches
        the broker when it can); a failure is counted and logged, the answer stays."""
        assert self.refusals is not None
        try:
            await self.refusals.publish(event)
        except Exception:
            self.published["error"] += 1
            log.exception("refusal event not published")
        else:
            self.published["ok"] += 1

    async def receive(self, request: web.BaseRequest) -> bytes:
        """The body within the body deadline and MAX_BODY, else a 408/413 that closes the
        connection (nothing of the rest of the body is read)."""
        declared = request.content_length
        if declared is not None and declared > MAX_BODY:
            raise body_refused(413, f"a body of {declared} bytes is over the {MAX_BODY}-byte limit")
        body_timeout_s = self.body_timeout_s
        try:
            async with asyncio.timeout(body_timeout_s):
                return await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise body_refused(413, f"the body is over the {MAX_BODY}-byte limit") from None
        except TimeoutError:
            raise body_refused(
                408, f"the body was not received within {body_timeout_s:g} s of its head"
            ) from None

    async def read_json(self, request: web.BaseRequest) -> Any:
        return parse_json(await self.receive(request))


def unauthorized() -> web.Response:
    """The 401 of a request without an accepted bearer token (checked inline in each
    route: no middleware layer on the hot path)."""
    response = error_response(401, "unauthorized", "a valid bearer token is required")
    response.headers["WWW-Authenticate"] = "Bearer"
    return response


def no_such_hold() -> web.Response:
    """One answer for every hold id that names nothing this caller may settle."""
    return error_response(
        404,
        "unknown_hold",
        "no hold in flight with this id for this caller (never given, already settled "
        "or released, expired, or taken with another token)",
    )


def parse_json(raw: bytes) -> Any:
    try:
        return loads(raw)
    except msgspec.DecodeError:
        pass
    except RecursionError:
        raise invalid_json("nested too deeply to read") from None
    # what msgspec refuses but the stdlib reads (NaN, ...) gets the same answer as
    # before: the context's validation says which field is wrong
    try:
        return json.loads(raw)
    except RecursionError:
        raise invalid_json("nested too deeply to read") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise invalid_json(str(exc)) from None


def settle_event(usage: dict[str, Any], now_s: float) -> dict[str, Any]:
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
