"""Delivery records: the notifier's durable state, on the compacted ``notify.deliveries``.

Two kinds of record, JSON values (the topic is this room's own; nothing else reads it):

- key ``compose([webhook_id, alert_id])``: one (alert, webhook) finished, written after a
  2xx (``status: delivered``) or on giving up (``status: failed``: a 4xx other than
  408/429, or ``max_attempts`` spent); with ``attempts``, ``http_status``, ``error``,
  ``finished_at`` and the webhook's redacted URL, never the URL itself;
- key ``compose([webhook_id])``: where a webhook started on the alert topic
  (``start_offsets``, per partition), written once when the notifier first sees the webhook.

Read back whole at each start, they say what not to send again: an alert id finished for
a webhook is never sent to it again, whatever offset carries it (a publisher handover can
repeat an alert on the topic).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final

from schemas.errors import ContractError
from schemas.ids import compose, decompose

DELIVERED: Final = "delivered"
FAILED: Final = "failed"


def delivery_key(webhook_id: str, alert_id: str) -> bytes:
    return compose([webhook_id, alert_id]).encode()


def start_key(webhook_id: str) -> bytes:
    return compose([webhook_id]).encode()


@dataclass(frozen=True)
class Delivery:
    webhook: str
    webhook_url: str
    alert_id: str
    kind: str
    budget_id: str
    status: str
    attempts: int
    http_status: int | None
    error: str
    finished_at: datetime
    alert_offset: int

    def encode(self) -> bytes:
        return json.dumps(
            {
                "webhook": self.webhook,
                "webhook_url": self.webhook_url,
                "alert_id": self.alert_id,
                "kind": self.kind,
                "budget_id": self.budget_id,
                "status": self.status,
                "attempts": self.attempts,
                "http_status": self.http_status,
                "error": self.error,
                "finished_at": self.finished_at.isoformat(),
                "alert_offset": self.alert_offset,
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def decode(cls, data: bytes) -> Delivery:
        try:
            v = json.loads(data)
            return cls(
                webhook=str(v["webhook"]),
                webhook_url=str(v["webhook_url"]),
                alert_id=str(v["alert_id"]),
                kind=str(v["kind"]),
                budget_id=str(v["budget_id"]),
                status=str(v["status"]),
                attempts=int(v["attempts"]),
                http_status=None if v["http_status"] is None else int(v["http_status"]),
                error=str(v["error"]),
                finished_at=datetime.fromisoformat(v["finished_at"]).astimezone(UTC),
                alert_offset=int(v["alert_offset"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ContractError(f"unreadable delivery record: {exc}") from None


@dataclass
class DeliveryState:
    """What the topic says: the finished (webhook, alert id)s and each webhook's start."""

    finished: dict[tuple[str, str], Delivery] = field(default_factory=dict)
    #: per webhook, per alert-topic partition: the first offset it takes
    starts: dict[str, dict[int, int]] = field(default_factory=dict)

    def add(self, key: bytes, value: bytes | None) -> None:
        if value is None:
            return
        parts = decompose(key.decode())
        if len(parts) == 1:
            offsets = json.loads(value)["start_offsets"]
            self.starts[parts[0]] = {int(p): int(o) for p, o in offsets.items()}
        elif len(parts) == 2:
            self.finished[(parts[0], parts[1])] = Delivery.decode(value)

    def is_finished(self, webhook_id: str, alert_id: str) -> bool:
        return (webhook_id, alert_id) in self.finished


def start_value(webhook_id: str, webhook_url: str, offsets: dict[int, int]) -> bytes:
    return json.dumps(
        {
            "webhook": webhook_id,
            "webhook_url": webhook_url,
            "start_offsets": {str(p): o for p, o in offsets.items()},
            "registered_at": datetime.now(UTC).isoformat(),
        },
        sort_keys=True,
    ).encode()
