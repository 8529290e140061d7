"""Fetching a provider's usage and cost reports from its admin API, every page of them.

OpenAI: ``GET {base}/v1/organization/usage/completions?start_time=<unix>&bucket_width=1d
&group_by[]=project_id&group_by[]=api_key_id&group_by[]=model&group_by[]=batch&limit=31``
with ``Authorization: Bearer <admin key>``. Anthropic: ``GET
{base}/v1/organizations/usage_report/messages?starting_at=<RFC 3339>&bucket_width=1d
&group_by[]=api_key_id&group_by[]=workspace_id&group_by[]=model&group_by[]=service_tier
&limit=31`` with ``x-api-key`` and ``anthropic-version``. The cost reports: OpenAI ``/v1/organization/costs`` grouped by ``project_id`` and
``line_item``, Anthropic ``/v1/organizations/cost_report`` grouped by ``workspace_id``
and ``description``. ``next_page`` is followed while
``has_more``; the pages come back as they were sent, for :func:`read_report` (and a file).
The admin key goes in a header only: never in a URL, a message or a log.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from datetime import UTC, date, datetime, time
from typing import Any
from urllib.parse import urlencode

from .provider_reports import PROVIDERS, ReportError

DEFAULT_BASE_URLS = {"openai": "https://api.openai.com", "anthropic": "https://api.anthropic.com"}
#: (provider, report) -> path and grouping
PATHS = {
    ("openai", "usage"): "/v1/organization/usage/completions",
    ("openai", "costs"): "/v1/organization/costs",
    ("anthropic", "usage"): "/v1/organizations/usage_report/messages",
    ("anthropic", "costs"): "/v1/organizations/cost_report",
}
GROUP_BY = {
    ("openai", "usage"): ("project_id", "api_key_id", "model", "batch"),
    ("openai", "costs"): ("project_id", "line_item"),
    ("anthropic", "usage"): ("api_key_id", "workspace_id", "model", "service_tier"),
    ("anthropic", "costs"): ("workspace_id", "description"),
}
REPORTS = ("usage", "costs")
ANTHROPIC_VERSION = "2023-06-01"
#: the most pages one fetch follows (a year of daily buckets at 31 a page is 12)
MAX_PAGES = 100
TIMEOUT_S = 30.0


def report_url(
    provider: str, base_url: str, since: date, page: str | None, report: str = "usage"
) -> str:
    start = datetime.combine(since, time(), UTC)
    query: list[tuple[str, str]] = [("bucket_width", "1d"), ("limit", "31")]
    if provider == "openai":
        query.insert(0, ("start_time", str(int(start.timestamp()))))
    else:
        query.insert(0, ("starting_at", start.strftime("%Y-%m-%dT%H:%M:%SZ")))
    query += [("group_by[]", name) for name in GROUP_BY[(provider, report)]]
    if page is not None:
        query.append(("page", page))
    return f"{base_url.rstrip('/')}{PATHS[(provider, report)]}?{urlencode(query)}"


def fetch_pages(
    provider: str,
    admin_key: str,
    since: date,
    base_url: str | None = None,
    report: str = "usage",
) -> list[Any]:
    """Every page of ``provider``'s ``report`` (usage or costs) from ``since`` (a UTC day)
    to now.

    Raises ReportError for a refusal (naming the status and the provider's message), an
    answer that is not a page, or a report that never ends.
    """
    if provider not in PROVIDERS or report not in REPORTS:
        raise ReportError(f"no {report!r} report of provider {provider!r}")
    base = base_url or DEFAULT_BASE_URLS[provider]
    headers = (
        {"Authorization": f"Bearer {admin_key}"}
        if provider == "openai"
        else {"x-api-key": admin_key, "anthropic-version": ANTHROPIC_VERSION}
    )
    pages: list[Any] = []
    page_token: str | None = None
    for _ in range(MAX_PAGES):
        url = report_url(provider, base, since, page_token, report)
        page = _get_json(url, headers, f"{provider} {report} report page {len(pages) + 1}")
        pages.append(page)
        if not isinstance(page, dict) or page.get("has_more") is not True:
            return pages
        page_token = page.get("next_page")
        if not isinstance(page_token, str) or not page_token:
            raise ReportError(
                f"{provider} {report} report page {len(pages)}: has_more without a next_page"
            )
    raise ReportError(f"{provider} {report} report: still has_more after {MAX_PAGES} pages")


def _get_json(url: str, headers: dict[str, str], what: str) -> Any:
    request = urllib.request.Request(url, headers={**headers, "Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        detail = _error_message(exc.read())
        raise ReportError(f"{what}: the provider answered {exc.code}{detail}") from None
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ReportError(f"{what}: cannot reach the provider ({reason})") from None
    try:
        return json.loads(body)
    except ValueError:
        raise ReportError(f"{what}: the answer is not JSON") from None


def _error_message(body: bytes) -> str:
    try:
        error = json.loads(body).get("error", {})
        message = error.get("message") if isinstance(error, dict) else None
    except (ValueError, AttributeError):
        return ""
    return f" ({message})" if isinstance(message, str) and message else ""
