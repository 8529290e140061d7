"""Console sessions: a login with an admin token becomes a random session id in an
HttpOnly, SameSite=Strict cookie; the server keeps, in memory only, the token's id (never
the token), a per-session CSRF token and an expiry. Every request looks the token up
again, so a revoked token's sessions end at once."""

from __future__ import annotations

import hmac
import secrets
import time
from dataclasses import dataclass
from typing import Final

from admin.tokens import TokenBook, TokenRecord

COOKIE: Final = "spendbus_console"
#: seconds a session lives from its login (then the token is asked for again)
SESSION_TTL_S: Final = 8 * 3600
#: the most sessions kept at once (a login past it ends the oldest)
MAX_SESSIONS: Final = 10_000


@dataclass(frozen=True, slots=True)
class Session:
    session_id: str
    token_id: str
    csrf: str
    expires_at: float


class SessionBook:
    def __init__(self, tokens: TokenBook, ttl_s: float = SESSION_TTL_S) -> None:
        self.tokens = tokens
        self.ttl_s = ttl_s
        self._sessions: dict[str, Session] = {}

    def login(self, token: str) -> Session | None:
        """A new session for a live ``token``; None for an unknown or revoked one."""
        record = self.tokens.verify(token)
        if record is None:
            return None
        now = time.monotonic()
        self._sessions = {k: s for k, s in self._sessions.items() if s.expires_at > now}
        while len(self._sessions) >= MAX_SESSIONS:
            del self._sessions[next(iter(self._sessions))]
        session = Session(
            secrets.token_urlsafe(32), record.token_id, secrets.token_urlsafe(32), now + self.ttl_s
        )
        self._sessions[session.session_id] = session
        return session

    def find(self, session_id: str | None) -> tuple[Session, TokenRecord] | None:
        """The live session of a cookie and its token's live record, or None (no such
        session, expired, or its token revoked since: then the session ends)."""
        if not session_id:
            return None
        session = self._sessions.get(session_id)
        if session is None:
            return None
        record = next((r for r in self.tokens.records() if r.token_id == session.token_id), None)
        if session.expires_at <= time.monotonic() or record is None or record.revoked_at:
            self._sessions.pop(session_id, None)
            return None
        return session, record

    def logout(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)


def csrf_matches(session: Session, given: str | None) -> bool:
    return given is not None and hmac.compare_digest(session.csrf.encode(), given.encode())
