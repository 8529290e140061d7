"""One SELECT of a console page through the spend reports' query function
(admin/reports.py: the worker's ``/sql`` or the current store), run off the event loop;
when the store is missing or fails, the reason to show instead, so the page shows the rest."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from admin.reports import SpendQuery

log = logging.getLogger("spendbus.admin.console")


async def page_rows(
    run: SpendQuery | None,
    sql: str,
    what: str,
    unconfigured: str = "no ClickHouse store is configured",
) -> Sequence[Sequence[Any]] | str:
    """The rows of ``sql`` (``what`` names it in the log), or why there are none."""
    if run is None:
        return unconfigured
    try:
        return await asyncio.to_thread(run, sql)
    except Exception as exc:  # the store away or refusing: the page shows the rest
        log.warning("%s: the store did not answer (%s)", what, type(exc).__name__)
        return f"ClickHouse did not answer ({type(exc).__name__}); reload to retry"
