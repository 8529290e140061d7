"""Budget alerts and what became of them: the shared ``budget.alerts`` topic (Alert
records, as ``spendbus notify`` reads them) and the notifier's ``notify.deliveries``
records, both followed by the store's view, joined by alert id.

A delivery is shown by its webhook id, status, attempts, HTTP status, error and time:
never the webhook's URL (even redacted, a URL names a host an org's viewer has no need
of) nor its secret, which no record carries. The delivery records are JSON the notifier
writes (notify/deliveries.py); they are read here field by field, and a record that does
not read is skipped, as the notifier itself would refuse it.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from admin.errors import ApiError
from schemas.codec import ALERT
from schemas.errors import ContractError
from schemas.ids import decompose

#: the kinds of alert the aggregator writes (schemas/avro/Alert.avsc)
ALERT_KINDS: Final = ("threshold", "unpriced_model", "forecast")
#: alerts held (the newest kept): the alert topic is a log, not compacted
MAX_ALERTS_KEPT: Final = 100_000
_SINCE_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def _iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def parse_since(text: str, now: datetime) -> datetime:
    """``since``: an ISO 8601 time with its zone, or a duration back from now (``6h``)."""
    text = text.strip()
    if text[:-1].isdigit() and text[-1:] in _SINCE_UNITS:
        return now - timedelta(seconds=int(text[:-1]) * _SINCE_UNITS[text[-1]])
    try:
        since = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        since = None
    if since is None or since.tzinfo is None:
        raise ApiError(
            422,
            f"query 'since': {text!r} is neither a time with its zone "
            "(2026-12-07T18:00:00Z) nor a duration back from now (90s, 30m, 6h, 2d)",
            "since",
        )
    return since.astimezone(UTC)


def delivery_json(value: bytes) -> dict[str, Any] | None:
    """A finished delivery as shown (no URL), or None if the record does not read."""
    try:
        v = json.loads(value)
        return {
            "webhook": str(v["webhook"]),
            "status": str(v["status"]),
            "attempts": int(v["attempts"]),
            "http_status": None if v["http_status"] is None else int(v["http_status"]),
            "error": str(v["error"]),
            "finished_at": _iso(datetime.fromisoformat(str(v["finished_at"]))),
        }
    except (ValueError, KeyError, TypeError):
        return None


@dataclass
class AlertLog:
    """Every alert seen on the topic (by alert id: a repeat is one alert) and every
    finished delivery of each, as the view reads them."""

    #: alert id -> the decoded Alert record
    alerts: OrderedDict[str, dict[str, Any]] = field(default_factory=OrderedDict)
    #: alert id -> webhook id -> the delivery as shown
    deliveries: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)

    def add_alert(self, value: bytes) -> None:
        try:
            alert: dict[str, Any] = dict(ALERT.decode(value))
        except ContractError:  # what the notifier skips too
            return
        alert_id = str(alert["alert_id"])
        self.alerts[alert_id] = alert
        self.alerts.move_to_end(alert_id)
        while len(self.alerts) > MAX_ALERTS_KEPT:
            gone, _ = self.alerts.popitem(last=False)
            self.deliveries.pop(gone, None)

    def add_delivery(self, key: bytes, value: bytes | None) -> None:
        try:
            parts = decompose(key.decode())
        except (ContractError, UnicodeDecodeError):
            return
        if len(parts) != 2:  # a webhook's start offsets, not a delivery
            return
        webhook, alert_id = parts
        shown = None if value is None else delivery_json(value)
        if shown is None:
            self.deliveries.get(alert_id, {}).pop(webhook, None)
        else:
            self.deliveries.setdefault(alert_id, {})[webhook] = shown


def alert_scope_values(alert: dict[str, Any]) -> list[str]:
    """The counter's scope values (its org first); [] for an alert of no counter."""
    try:
        return decompose(alert["counter_key"])[1:]
    except ContractError:
        return []


def alert_json(alert: dict[str, Any], deliveries: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "alert_id": alert["alert_id"],
        "kind": alert["kind"],
        "budget_id": alert["budget_id"],
        "scope_values": alert_scope_values(alert),
        "period": alert["period"],
        "threshold": alert["threshold"],
        "state": str(alert["state"]),
        "spent_nanos": alert["spent_nanos"],
        "spent_tokens": alert["spent_tokens"],
        "spent_requests": alert["spent_requests"],
        "limit_nanos": alert["limit_nanos"],
        "limit_tokens": alert["limit_tokens"],
        "limit_requests": alert["limit_requests"],
        "model": alert["model"],
        "as_of": _iso(alert["as_of"]),
        "exhausts_at": _iso(alert.get("exhausts_at")),
        "deliveries": [deliveries[w] for w in sorted(deliveries)],
    }
