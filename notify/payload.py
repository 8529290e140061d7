"""What a webhook receives: the alert as JSON, a sentence, Slack's ``text``, the signature.

The body is the Alert record's fields (``as_of`` as ISO 8601 UTC, amounts in nanos as
the record has them) plus:

- ``scope`` and ``scope_values``: the budget's scope and the counter's values (from the
  counter key), ``spent_usd`` / ``limit_usd`` as decimal strings;
- ``summary``: one human sentence; ``text``: the same for Slack-compatible receivers.

Signed bodies carry ``X-Spendbus-Signature: sha256=<hex HMAC-SHA256(secret, body)>`` over
the exact bytes sent; every body carries ``Idempotency-Key: <alert_id>``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

from schemas.errors import ContractError
from schemas.ids import decompose
from schemas.money import format_usd, nanos_to_usd

SIGNATURE_HEADER: Final = "X-Spendbus-Signature"
IDEMPOTENCY_HEADER: Final = "Idempotency-Key"


def scope_values(counter_key: str) -> list[str]:
    """The scope values of a counter key (its parts after the budget id); [] if none."""
    if not counter_key:
        return []
    try:
        return decompose(counter_key)[1:]
    except ContractError:
        return []


def distinct_usd(spent_nanos: int, limit_nanos: int) -> tuple[str, str]:
    """Both amounts in dollars, with cents, or with as many more places as tell two
    different amounts apart ("$0.005 of $0.01", not "$0.01 of $0.01"); to the nano at most."""
    for places in range(2, 10):
        spent, limit = format_usd(spent_nanos, places), format_usd(limit_nanos, places)
        if spent != limit or spent_nanos == limit_nanos:
            break
    return _trim(spent), _trim(limit)


def _trim(usd: str) -> str:
    """Cents always; places past them only as far as they say something."""
    whole, _, places = usd.partition(".")
    return f"{whole}.{places[:2]}{places[2:].rstrip('0')}"


def summary(alert: Mapping[str, Any], scope: str | None) -> str:
    """One sentence a person reads in a chat or a pager."""
    kind = alert["kind"]
    if kind == "unpriced_model":
        return (
            f"Model {alert.get('model')} is in use without a price: its calls are charged $0 "
            "until a price is added (spendbus prices check)."
        )
    if kind == "reconciliation":
        provider = "/".join(scope_values(alert["counter_key"]))
        return (
            f"Reconciliation drift: {provider}'s report of {alert['period'].removeprefix('d:')} "
            f"differs from the ledger by {alert['spent_tokens']:,} tokens and "
            f"{format_usd(alert['spent_nanos'], 6)} that no known cause explains "
            "(spendbus reconcile report)."
        )
    values = scope_values(alert["counter_key"])
    who = f" ({scope or 'scope'} {'/'.join(values)})" if values else ""
    spent = format_usd(alert["spent_nanos"], 2)
    limits = []
    if alert.get("limit_nanos") is not None:
        shown, limit = distinct_usd(alert["spent_nanos"], alert["limit_nanos"])
        limits.append(f"{shown} of {limit}")
    if alert.get("limit_tokens") is not None:
        limits.append(f"{alert['spent_tokens']:,} of {alert['limit_tokens']:,} tokens")
    if alert.get("limit_requests") is not None:
        limits.append(f"{alert['spent_requests']:,} of {alert['limit_requests']:,} requests")
    used = ", ".join(limits) or f"{spent} spent"
    if kind == "threshold":
        verb = (
            "is exhausted"
            if alert["state"] == "exceeded"
            else f"passed {alert['threshold'] * 100:g}% of its limit"
        )
        return f"Budget {alert['budget_id']}{who} {verb} in period {alert['period']}: {used}."
    if kind == "exhausted":
        return (
            f"Budget {alert['budget_id']}{who} is exhausted: a request was refused for it in "
            f"period {alert['period']}: {used}."
        )
    if kind == "forecast" and isinstance(alert.get("exhausts_at"), datetime):
        at = alert["exhausts_at"].isoformat(timespec="minutes").replace("+00:00", "Z")
        return (
            f"Budget {alert['budget_id']}{who} is forecast to run out at {at}, before period "
            f"{alert['period']} ends, at its burn over the last hour: {used}."
        )
    return f"Budget {alert['budget_id']}{who}: {kind} alert in period {alert['period']}: {used}."


def payload(alert: Mapping[str, Any], scope: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in alert.items()
    }
    out["scope"] = scope
    out["scope_values"] = scope_values(alert["counter_key"])
    out["spent_usd"] = str(nanos_to_usd(alert["spent_nanos"]))
    limit = alert.get("limit_nanos")
    out["limit_usd"] = None if limit is None else str(nanos_to_usd(limit))
    out["summary"] = summary(alert, scope)
    out["text"] = f":rotating_light: spendbus: {out['summary']}"
    return out


def body(alert: Mapping[str, Any], scope: str | None) -> bytes:
    """The exact bytes POSTed (and signed): compact JSON, keys sorted."""
    return json.dumps(payload(alert, scope), separators=(",", ":"), sort_keys=True).encode()


def signature(secret: str, data: bytes) -> str:
    """The ``X-Spendbus-Signature`` value of ``data``: ``sha256=<hex>``."""
    return "sha256=" + hmac.new(secret.encode(), data, hashlib.sha256).hexdigest()


def verify_signature(secret: str, data: bytes, header: str) -> bool:
    """What a receiver does: recompute over the raw body, compare in constant time."""
    return hmac.compare_digest(signature(secret, data), header)
