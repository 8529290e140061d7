"""Alerts: each threshold crossed, unpriced model and forecast once, on budget.alerts.

``AlertPublisher`` (``publisher.py``) sends what the store's ``alerts`` view found and
the shared topic lacks; ``forecasts.py`` adds the forecast alerts; ``RaiseAudit``
(``raise_audit.py``) copies every raise into the store's ``budget_raises``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime.faces import lazy_names

if TYPE_CHECKING:
    from aggregator.alerts.forecasts import forecast_alerts_found
    from aggregator.alerts.publisher import AlertPublisher, alerts_found, generation_is_current
    from aggregator.alerts.raise_audit import RaiseAudit

#: each public name and the module that defines it
_HOMES: dict[str, str] = {
    "AlertPublisher": "aggregator.alerts.publisher",
    "RaiseAudit": "aggregator.alerts.raise_audit",
    "alerts_found": "aggregator.alerts.publisher",
    "forecast_alerts_found": "aggregator.alerts.forecasts",
    "generation_is_current": "aggregator.alerts.publisher",
}

__all__ = [
    "AlertPublisher",
    "RaiseAudit",
    "alerts_found",
    "forecast_alerts_found",
    "generation_is_current",
]

__getattr__, __dir__ = lazy_names(__name__, _HOMES)
