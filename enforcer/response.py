"""What the proxy answers: the :class:`Response` tuple, the ``X-Spend-Budget``
header of a counter, and the time and header-value formats both use.

Shared by decisions (an allowed answer, its warnings) and refusals (every
refusal style), so neither imports the other for them.
"""

from __future__ import annotations

from datetime import datetime
from functools import lru_cache
from typing import Any, Final, NamedTuple
from urllib.parse import quote

from enforcer.plans import Plan
from schemas.periods import from_micros

SPEND_HEADER: Final = "X-Spend-Budget"
# RFC 9110 token characters other than alphanumerics, minus the header's own separators
_HEADER_SAFE: Final = "!#$%&'*+-.^_`|~:@/()[]{}<>?="


class Response(NamedTuple):
    """What the proxy answers (immutable; a tuple: built once per check, it must be cheap)."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: dict[str, Any] | None
    retry_after: int | None


def iso(ts: datetime | None) -> str | None:
    return None if ts is None else ts.isoformat().replace("+00:00", "Z")


@lru_cache(maxsize=4096)  # period ends repeat across requests
def iso_us(us: int | None) -> str | None:
    return None if us is None else iso(from_micros(us))


@lru_cache(maxsize=4096)  # budget ids and scopes repeat
def header_text(value: str) -> str:
    """A value safe inside a header parameter (no CR/LF, no ``;`` or ``,``)."""
    return quote(value, safe=_HEADER_SAFE)


def spend_header_of(
    plan: Plan, state: str, end_us: int | None, used_fraction: float
) -> tuple[str, str]:
    """The X-Spend-Budget header of one counter (``state``: a CounterStatus state name)."""
    state = "exceeded" if state in ("exceeded", "in_flight") else state
    reset = iso_us(end_us) or ("rolling" if plan.window.kind == "rolling" else "never")
    used = int(used_fraction * 100)
    return (
        SPEND_HEADER,
        f"{header_text(plan.budget_id)}; scope={header_text(plan.scope)}; "
        f"used={used}%; state={state}; reset={reset}",
    )
