"""Alert delivery: the shared alert topic to webhooks, each alert once per webhook.

``Notifier`` (``service.py``) follows budget.alerts and delivers each alert to every
webhook that wants it (``webhooks.py``), signed (``payload.py``), each delivery's state
in ClickHouse (``deliveries.py``), its figures in ``metrics.py``. See README.md here.
These names are the public surface: code outside the room imports nothing else of it.
"""

from notify.deliveries import Delivery, DeliveryState
from notify.metrics import NotifyMetrics
from notify.payload import verify_signature
from notify.service import Notifier, read_topic
from notify.webhooks import RetryPolicy, load_webhooks

__all__ = [
    "Delivery",
    "DeliveryState",
    "Notifier",
    "NotifyMetrics",
    "RetryPolicy",
    "load_webhooks",
    "read_topic",
    "verify_signature",
]
