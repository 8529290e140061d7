"""The drift alert: a day whose residual (what no cause explains) passes a threshold is an
Alert of kind ``reconciliation`` on ``budget.alerts``, beside the budgets' own.

One per (provider, day, thresholds): ``counter_key`` is the counter key of budget
``reconciliation`` scoped to the provider, ``period`` the day (``d:YYYY-MM-DD``),
``spent_tokens`` / ``spent_nanos`` the day's token and cost residuals and ``limit_tokens``
/ ``limit_nanos`` the thresholds they passed; the alert id is deterministic, so a
re-run that finds the same drift repeats no alert (notify delivers each id once).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from schemas.ids import counter_key
from schemas.records import Alert

from .matching import DaySummary

ALERT_KIND = "reconciliation"
#: the budget id the alerts name (no budget of that id exists: a reconciliation is no budget)
ALERT_BUDGET = "reconciliation"


def drift_alerts(
    days: Iterable[DaySummary],
    *,
    residual_tokens: int | None = None,
    residual_nanos: int | None = None,
    now: datetime | None = None,
) -> list[Alert]:
    """The alerts of the days whose token residual exceeds ``residual_tokens`` or whose
    cost residual exceeds ``residual_nanos`` (None: that side never alerts)."""
    if residual_tokens is None and residual_nanos is None:
        return []
    as_of = now or datetime.now(UTC)
    alerts: list[Alert] = []
    for day in days:
        over_tokens = residual_tokens is not None and day.residual > residual_tokens
        over_nanos = residual_nanos is not None and day.cost_residual > residual_nanos
        if not (over_tokens or over_nanos):
            continue
        key = counter_key(ALERT_BUDGET, [day.provider])
        period = f"d:{day.day.isoformat()}"
        limits = f"{residual_tokens}|{residual_nanos}"
        alerts.append(
            {
                "alert_id": f"{ALERT_KIND}|{key}|{period}|{limits}",
                "kind": ALERT_KIND,
                "counter_key": key,
                "budget_id": ALERT_BUDGET,
                "period": period,
                "threshold": 1.0,
                "state": "alert",
                "spent_nanos": day.cost_residual,
                "spent_tokens": day.residual,
                "spent_requests": 0,
                "limit_nanos": residual_nanos,
                "limit_tokens": residual_tokens,
                "limit_requests": None,
                "model": None,
                "as_of": as_of,
                "exhausts_at": None,
            }
        )
    return alerts
