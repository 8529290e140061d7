"""The bound on new session ids per key (``max_sessions_per_key``): :class:`SessionBound`.

A session no verdict knows yet would get a counter of its own for every id a client
makes up, each escaping the session budget: a key may open at most the bound of them
per UTC day. Per enforcer process.
"""

from __future__ import annotations

from typing import Final, final

from enforcer.context import Context

#: the period of the bound on new session ids per key: a UTC day (µs)
SESSION_BOUND_US: Final = 86_400_000_000


@final
class SessionBound:
    """The new session ids each key (org, secret) opened today (UTC) on this enforcer."""

    def __init__(self, max_sessions: int | None) -> None:
        #: new session ids a key may open per UTC day (None: no bound)
        self.max_sessions = max_sessions
        self._sessions: dict[tuple[str, str], set[str]] = {}
        self._day = -1

    def admits(self, ctx: Context, now_us: int, reserve: bool) -> bool:
        """May ``ctx``'s session, which no verdict knows, have a counter of its own? Yes
        while its key opened fewer than ``max_sessions_per_key`` sessions today (UTC);
        a reserving check counts it (a peek only asks)."""
        limit = self.max_sessions
        if limit is None:
            return True
        day = now_us // SESSION_BOUND_US
        if day != self._day:
            self._sessions = {}
            self._day = day
        key = (ctx.org, ctx.secret)
        seen = self._sessions.get(key)
        if seen is None:
            if not reserve:
                return True
            seen = self._sessions[key] = set()
        session = ctx.session
        if session in seen:
            return True
        if len(seen) >= limit:
            return False
        if reserve:
            seen.add(session)
        return True
