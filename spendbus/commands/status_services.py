"""What `spendbus status` asks the aggregator workers' web pages and ClickHouse, each
within a bounded time (with the embedded store, through the worker's ``/sql`` page)."""

from __future__ import annotations

import contextlib
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

from runtime.clickhouse_access import ClickHouseAccess, redact_dsn

T = TypeVar("T")


class HttpError(Exception):
    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"HTTP {code}: {detail}")
        self.code = code


def _http_json(url: str, body: Any, timeout: float, token: str | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    auth = {} if token is None else {"authorization": f"Bearer {token}"}
    request = urllib.request.Request(
        url,
        data=data,
        headers={"content-type": "application/json", **auth},
        method="GET" if body is None else "POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")
        with contextlib.suppress(ValueError):
            detail = json.loads(detail).get("error", detail)
        raise HttpError(exc.code, detail) from None


def worker_report(url: str, timeout: float, token: str | None = None) -> dict[str, Any]:
    """One worker's /stats page: does it answer, does it serve (own partitions, reference read)."""
    try:
        stats = _http_json(f"{url}/stats", None, timeout, token)
    except Exception as exc:
        return {"url": url, "answering": False, "serving": None, "error": _reason(exc)}
    return {
        "url": url,
        "answering": True,
        "serving": bool(stats.get("serving")),
        "assigned_partitions": stats.get("assigned_partitions"),
        "stats": stats,
        "error": None,
    }


def clickhouse_report(
    dsn: str,
    worker_url: str | None,
    timeout: float,
    worker_pid: int | None = None,
    *,
    token: str | None = None,
    access: ClickHouseAccess | None = None,
) -> dict[str, Any]:
    """Can ClickHouse answer a query? Through the worker's /sql when it owns the embedded store."""
    report: dict[str, Any] = {"dsn": redact(dsn), "reachable": None, "usage_events": None}
    query = "SELECT count() FROM usage_events"
    if dsn.startswith("chdb://") and worker_url is not None:
        report["via"] = "worker"
        try:
            rows = _http_json(f"{worker_url}/sql", {"sql": query}, timeout, token)["rows"]
        except HttpError as exc:
            if exc.code == 401:  # the token sent is not the worker's: the store is not asked
                report.update(
                    reachable=None,
                    error=f"the worker's /sql refused the web token ({exc}); "
                    "SPENDBUS_WEB_TOKEN_FILE names the worker's token file",
                )
                return report
            if exc.code != 404:  # the store answered; the query failed (a missing table)
                report.update(reachable=True, error=str(exc))
                return report
            # a worker without a sink (--no-sink) leaves the store to whoever opens it
        except Exception as exc:
            report.update(reachable=False, error=f"the worker's /sql: {_reason(exc)}")
            return report
        else:
            report.update(reachable=True, usage_events=int(rows[0][0]), error=None)
            return report
    report["via"] = "direct"
    path = urlparse(dsn).path if dsn.startswith("chdb://") else None
    if path is not None and worker_pid is not None:
        # never a second engine on a path a live worker owns (chdb does not always lock it)
        report.update(
            reachable=False,
            error=f"the worker (pid {worker_pid}) owns the store and its web page did not answer",
        )
        return report
    if path is not None and not Path(path).is_dir():
        report.update(reachable=False, error=f"no embedded store at {path} yet")
        return report
    try:
        count = _bounded(lambda: _count_direct(dsn, query, access), timeout)
    except Exception as exc:
        report.update(reachable=False, error=_reason(exc))
        return report
    report.update(reachable=True, usage_events=count, error=None)
    return report


def _count_direct(dsn: str, query: str, access: ClickHouseAccess | None) -> int:
    from aggregator import open_client, run_query

    _, rows = run_query(open_client(dsn, access=access), query)
    return int(rows[0][0])


def _bounded(call: Callable[[], T], timeout: float) -> T:
    """``call()`` in a daemon thread, given up after ``timeout`` (a hung connect cannot hold exit)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"no answer within {timeout:g}s")
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]  # the box holds what call() returned: a T


def _reason(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.URLError):
        return f"unreachable ({exc.reason})"
    if isinstance(exc, TimeoutError):
        return str(exc) or "timed out"
    return str(exc) or type(exc).__name__


#: the DSN with its password shown as *** (the one helper: aggregator/sink/access.py)
redact = redact_dsn
