"""Background Responses: estimated when created, metered when fetched.

``POST /v1/responses`` with ``background: true`` answers a ``queued`` response whose
usage is null, and the model goes on generating. The call is charged at once, like
any call whose usage is missing: the server-state floor plus the output cap
(ingest/taps/estimate.py), published as the call's UsageEvent and settled against its
hold. The gateway remembers the response (:class:`BackgroundResponses`: its id, who
created it, that estimate). When the client fetches it through the gateway
(``GET /v1/responses/{id}``) and the provider reports its usage, the real usage is
charged **without charging twice**: the aggregator counts each ``event_id`` once and
never replaces an event, and UsageEvents carry no negative counts, so the estimate
stands as the call's charge and the fetched usage adds only what exceeds it, per token
class (:func:`top_up_fields`): one event naming the call (``charge_of``, counting no
request) whose ``event_id`` is the call's plus ``.final``, so fetching the result again,
from this gateway or after a restart, publishes the same id, counted once. The call then
costs ``max(estimate, real)`` per class, never less than what the provider billed.

Only the principal that created a response may fetch it through the gateway: the
gateway's credential can read every response of the operator's account, so a response
this gateway did not create (or has forgotten: a restart, another replica, past
``max_entries`` or ``ttl_s``) is answered 404 and never fetched.
"""

from __future__ import annotations

import json
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from ingest.taps import RequestInfo, TapResult
from schemas.usage import TOKEN_FIELDS

from .usage_events import CHARGE_COPIED

#: responses remembered at most, and for how long (seconds)
MAX_BACKGROUND_RESPONSES: Final = 100_000
BACKGROUND_TTL_S: Final = 7 * 24 * 3600.0


@dataclass(slots=True)
class BackgroundResponse:
    """A background response this gateway created: who, and what it was charged."""

    org_id: str
    secret_id: str
    info: RequestInfo
    #: the call's UsageEvent (the estimate charged when it was created)
    event: Mapping[str, Any]
    created: float
    #: the real usage is charged (a later fetch charges nothing more)
    settled: bool = field(default=False)


class BackgroundResponses:
    """Background responses by id, oldest forgotten first (bounded in count and age)."""

    def __init__(
        self,
        max_entries: int = MAX_BACKGROUND_RESPONSES,
        ttl_s: float = BACKGROUND_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self.clock = clock
        self._entries: OrderedDict[str, BackgroundResponse] = OrderedDict()
        #: forgotten for room or age before being fetched with usage
        self.forgotten = 0

    def __len__(self) -> int:
        return len(self._entries)

    def add(
        self,
        response_id: str,
        *,
        org_id: str,
        secret_id: str,
        info: RequestInfo,
        event: Mapping[str, Any],
    ) -> None:
        entries = self._entries
        now = self.clock()
        self._expire(now)
        while len(entries) >= self.max_entries:
            _, dropped = entries.popitem(last=False)
            self.forgotten += not dropped.settled
        # an answer that already carried its usage was charged it: nothing left to meter
        settled = event.get("usage_source") == "reported"
        entries[response_id] = BackgroundResponse(org_id, secret_id, info, event, now, settled)

    def get(self, response_id: str, *, org_id: str, secret_id: str) -> BackgroundResponse | None:
        """The response, when this principal created it (else None: not to be fetched)."""
        self._expire(self.clock())
        entry = self._entries.get(response_id)
        if entry is None or entry.org_id != org_id or entry.secret_id != secret_id:
            return None
        return entry

    def _expire(self, now: float) -> None:
        entries = self._entries
        while entries:
            oldest = next(iter(entries.values()))
            if now - oldest.created <= self.ttl_s:
                return
            entries.popitem(last=False)
            self.forgotten += not oldest.settled


def response_id_of(body: bytes, *, streamed: bool = False) -> str | None:
    """The id of the response a Responses body is (``streamed``: the response its
    first events carry, ``response.created`` / ``queued``), else None."""
    if streamed:
        return _streamed_response_id(body)
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return _id_of(obj)


def _streamed_response_id(body: bytes) -> str | None:
    """The response id of the first SSE event that carries the response."""
    for event in re.split(rb"\r\n\r\n|\n\n|\r\r", body)[:-1]:  # whole events only
        data = b"\n".join(
            line[5:].lstrip(b" ")
            for line in re.split(rb"\r\n|\n|\r", event)
            if line.startswith(b"data:")
        )
        try:
            obj = json.loads(data)
        except (ValueError, RecursionError):
            continue
        if isinstance(obj, dict) and obj.get("type") in _CARRYING:
            return _id_of(obj.get("response"))
    return None


#: the stream's events that carry the response object
_CARRYING: Final = frozenset({"response.created", "response.queued", "response.in_progress"})


def _id_of(obj: Any) -> str | None:
    if not isinstance(obj, dict):
        return None
    response_id = obj.get("id")
    if not isinstance(response_id, str) or not response_id.startswith("resp_"):
        return None
    return response_id if len(response_id) <= 200 else None


def top_up_fields(estimate: Mapping[str, Any], result: TapResult) -> dict[str, Any] | None:
    """The fields of the charge that brings the estimate up to the reported usage (for
    ``new_usage_event(**fields)``), or None when the estimate already covers it."""
    excess = {name: max(0, getattr(result, name) - estimate[name]) for name in TOKEN_FIELDS}
    # parts within their totals, as every event's are
    excess["reasoning_tokens"] = min(excess["reasoning_tokens"], excess["output_tokens"])
    excess["cache_write_1h_tokens"] = min(
        excess["cache_write_1h_tokens"], excess["cache_write_tokens"]
    )
    charged_units = estimate.get("units") or {}
    units = {
        name: count - charged_units.get(name, 0)
        for name, count in result.units
        if count > charged_units.get(name, 0)
    }
    if not any(excess.values()) and not units:
        return None
    return {
        **{k: estimate[k] for k in CHARGE_COPIED},
        "event_id": f"{estimate['event_id']}.final",
        "model": result.model or estimate["model"],
        **excess,
        "units": units,
        "service_tier": result.service_tier or estimate["service_tier"],
        "usage_source": "reported",
        "charge_of": estimate["event_id"],
    }
