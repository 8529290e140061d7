"""One alert to one webhook: POST, and retry what may succeed later.

- 2xx: delivered.
- Connection errors, timeouts, 5xx, 408 and 429: retried with exponential backoff
  (:class:`~notify.webhooks.RetryPolicy`; a 429's or 503's ``Retry-After`` in seconds is
  honoured when longer, up to ``max_seconds``), until delivered or ``max_attempts``.
- Any other status (a 4xx, a 3xx: redirects are not followed, a signed body is not
  re-sent elsewhere): given up at once, logged and recorded as failed.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp

from notify.payload import IDEMPOTENCY_HEADER, SIGNATURE_HEADER, signature
from notify.webhooks import Webhook

log = logging.getLogger(__name__)

RETRIED_STATUSES = frozenset({408, 429})


@dataclass(frozen=True)
class Outcome:
    delivered: bool
    attempts: int
    http_status: int | None
    error: str


def _retry_after(value: str | None) -> float | None:
    try:
        return None if value is None else max(0.0, float(value))
    except ValueError:
        return None  # an HTTP date: our own backoff applies


async def deliver(
    session: aiohttp.ClientSession,
    webhook: Webhook,
    alert_id: str,
    data: bytes,
    *,
    on_retry: Callable[[int, str], None] | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> Outcome:
    """POST ``data`` until an answer settles it (see the module); never raises for HTTP."""
    headers = {"Content-Type": "application/json", IDEMPOTENCY_HEADER: alert_id}
    if webhook.secret is not None:
        headers[SIGNATURE_HEADER] = signature(webhook.secret.get_secret_value(), data)
    policy = webhook.retry
    timeout = aiohttp.ClientTimeout(total=policy.timeout_seconds)
    attempt = 0
    while True:
        attempt += 1
        status: int | None = None
        wait_at_least = 0.0
        try:
            async with session.post(
                webhook.url, data=data, headers=headers, timeout=timeout, allow_redirects=False
            ) as response:
                status = response.status
                await response.read()
                if 200 <= status < 300:
                    return Outcome(True, attempt, status, "")
                error = f"HTTP {status}"
                if status < 500 and status not in RETRIED_STATUSES:
                    log.warning(
                        "webhook %s answered %d for alert %s: giving up (not retriable)",
                        webhook.shown,
                        status,
                        alert_id,
                    )
                    return Outcome(False, attempt, status, error)
                wait_at_least = _retry_after(response.headers.get("Retry-After")) or 0.0
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            # the exception's text may quote the URL: only its type is kept
            error = f"{type(exc).__name__}"
        if policy.max_attempts and attempt >= policy.max_attempts:
            log.warning(
                "webhook %s: alert %s not delivered after %d attempts (%s): giving up",
                webhook.shown,
                alert_id,
                attempt,
                error,
            )
            return Outcome(False, attempt, status, error)
        delay = max(policy.delay(attempt, random.random()), min(wait_at_least, policy.max_seconds))
        log.info(
            "webhook %s: alert %s attempt %d failed (%s), retrying in %.2fs",
            webhook.shown,
            alert_id,
            attempt,
            error,
            delay,
        )
        if on_retry is not None:
            on_retry(attempt, error)
        await sleep(delay)
