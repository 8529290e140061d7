"""After `spendbus budgets apply`: wait until the workers count each applied budget from its
period's start (a budget applied mid-period takes the spend already in it, from the
ledger: aggregator/counting/backfill.py), then say what each has spent this period.

A worker's /stats page lists ``budgets_counting`` (budget id -> counting fingerprint) once
every partition it owns has counted the budget's current period; the fingerprint says it
is the definition just applied, not an older one."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from schemas.budgets import Budget
from schemas.errors import ConfigError
from schemas.money import format_usd
from spendbus.commands.status_services import worker_report
from spendbus.settings import Settings
from spendbus.stack.web_token import client_token

#: how often the workers' pages are asked while waiting (seconds)
POLL_SECONDS = 0.3

StatsReader = Callable[[str], dict[str, Any]]


@dataclass(frozen=True)
class Loading:
    """What the workers said within the wait."""

    #: budget ids every answering worker counts from their period's start
    counted: set[str]
    #: worker urls that did not answer (their budgets are not known to be counted)
    silent: list[str]


def worker_stats(settings: Settings, timeout_s: float = 5.0) -> StatsReader:
    """Reads a worker's /stats page with the workers' web token; raises when it does not
    answer."""
    try:
        secret = client_token(settings)
    except ConfigError:  # the page then answers 401 off loopback: the worker is named silent
        secret = None
    token = None if secret is None else secret.get_secret_value()

    def read(url: str) -> dict[str, Any]:
        report = worker_report(url.rstrip("/"), timeout_s, token)
        if not report["answering"]:
            raise ConnectionError(report["error"])
        stats: dict[str, Any] = report["stats"]
        return stats

    return read


def wait_counted(
    budgets: list[Budget], workers: list[str], read_stats: StatsReader, wait_s: float
) -> Loading:
    """Ask each worker's /stats until every budget of ``budgets`` is counted with its
    current definition by all of them, or ``wait_s`` has passed."""
    wanted = {b.budget_id: b.counting_fingerprint for b in budgets}
    deadline = time.monotonic() + wait_s
    while True:
        counted = set(wanted)
        silent = []
        for url in workers:
            try:
                stats = read_stats(url)
            except Exception:  # a worker away: named in the summary, never a traceback
                silent.append(url)
                continue
            counting = stats.get("budgets_counting") or {}
            counted &= {b for b, fp in wanted.items() if counting.get(b) == fp}
        if len(silent) == len(workers):
            return Loading(set(), silent)  # no worker runs: nothing to wait for
        if (counted == set(wanted) and not silent) or time.monotonic() >= deadline:
            return Loading(counted, silent)
        time.sleep(POLL_SECONDS)


def spent_lines(
    budgets: list[Budget], loading: Loading, counters: list[dict[str, Any]]
) -> list[str]:
    """One line per budget: what its live counters spent this period, or why it is unknown."""
    lines = []
    for budget in budgets:
        if budget.budget_id not in loading.counted:
            lines.append(
                f"{budget.budget_id}: not counted yet by every worker; its spend this period "
                f"shows in `spendbus usage --budget {budget.budget_id}` once it is"
            )
            continue
        mine = [c for c in counters if c["budget_id"] == budget.budget_id]
        lines.append(f"{budget.budget_id}: {_spent_text(budget, mine)}")
    return lines


def _spent_text(budget: Budget, counters: list[dict[str, Any]]) -> str:
    where = "this period" if budget.window.kind != "total" else "in total"
    if not counters:
        return f"nothing spent {where}"
    parts = []
    if budget.limit_nanos is not None or not (budget.limit_tokens or budget.limit_requests):
        parts.append(format_usd(sum(c["spent_nanos"] for c in counters)))
    if budget.limit_tokens is not None:
        parts.append(f"{sum(c['spent_tokens'] for c in counters):,} tokens")
    if budget.limit_requests is not None:
        parts.append(f"{sum(c['spent_requests'] for c in counters):,} requests")
    many = f" over {len(counters)} counters" if len(counters) > 1 else ""
    return f"{', '.join(parts)} already spent {where}{many}"
