"""The gateway's access log: one line per request, off unless ``access_log: true``.

aiohttp's own access log stays off everywhere (runtime/http_log.py: its request line
carries the query string, Gemini's ``?key=`` among them). This line is the gateway's own,
made only of what carries no secret: the method, the path without its query (still
passed through ``redact``, for a key a client pasted into a path), the status, the
latency, the gate's decision and the budget that decided (seed 003's budget note). Never
a header, a key, the query or the body. Values that are not plain tokens (a budget id
with a space or a newline) are JSON-quoted, so a line cannot be split or forged.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Final

from aiohttp import web

from runtime.log_redaction import redact

from .gate import GateDecision

#: the access lines' logger (INFO), apart from the gateway's own so it can be routed apart
ACCESS_LOG: Final = logging.getLogger("spendbus.gateway.access")
#: the request's gate decision, set where the gate decided (proxy.py, realtime.py)
DECISION: Final = web.RequestKey("spendbus_gateway_decision", GateDecision)
#: characters of the path logged at most (a longer one is cut and marked)
PATH_LIMIT: Final = 256
#: what a value may hold to be written as is
_PLAIN: Final = re.compile(r"[A-Za-z0-9._:/@%+~,=-]+")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _token(value: str | None) -> str:
    if value is None:
        return "-"
    return value if _PLAIN.fullmatch(value) else json.dumps(value)


def access_line(
    method: str,
    raw_path: str,
    status: int | None,
    latency_ms: float,
    decision: GateDecision | None,
) -> str:
    """One request's line: ``method=… path=… status=… latency_ms=… decision=… budget=…``
    (``-`` for what the request did not reach: no gate decision, no answer)."""
    path = redact(raw_path.split("?", 1)[0])
    if len(path) > PATH_LIMIT:
        path = path[:PATH_LIMIT] + "..."
    fields = {} if decision is None else decision.usage_fields()
    return (
        f"method={_token(method)} path={_token(path)} "
        f"status={'-' if status is None else status} latency_ms={latency_ms:.1f} "
        f"decision={_token(fields.get('decision'))} budget={_token(fields.get('decision_budget_id'))}"
    )


@web.middleware
async def access_log(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Log one line once the request is answered (or failed, or was cancelled: status -)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    status: int | None = None
    try:
        response = await handler(request)
        status = response.status
        return response
    except web.HTTPException as exc:
        status = exc.status
        raise
    except Exception:
        status = 500  # what aiohttp answers an unhandled error with
        raise
    finally:
        ACCESS_LOG.info(
            "%s",
            access_line(
                request.method,
                request.raw_path,
                status,
                (loop.time() - started) * 1000,
                request.get(DECISION),
            ),
        )
