"""Console sessions (admin/console/sessions.py): a live token signs in, a session ends at
its expiry or with its token, and the CSRF token is the session's own."""

from __future__ import annotations

from pathlib import Path

from admin import TokenBook
from admin.console.sessions import SessionBook, csrf_matches
from tests.admin.kit import ADMIN_SECRET


def test_a_session_lives_until_its_expiry_or_its_token_is_revoked(tmp_path: Path) -> None:
    tokens = TokenBook(tmp_path / "admin.tokens", ADMIN_SECRET)
    token, record = tokens.mint("org-admin", "acme")
    book = SessionBook(tokens)
    assert book.login("sbadm_nope_nope") is None and book.login(token + "x") is None
    session = book.login(token)
    assert session is not None and token not in (session.session_id, session.csrf)
    found = book.find(session.session_id)
    assert found is not None and found[1].token_id == record.token_id
    assert book.find("not-a-session") is None and book.find(None) is None
    assert csrf_matches(session, session.csrf)
    assert not csrf_matches(session, None) and not csrf_matches(session, session.csrf[:-1])
    other = book.login(token)
    assert other is not None and not csrf_matches(other, session.csrf)

    book.logout(other.session_id)
    assert book.find(other.session_id) is None
    tokens.revoke(record.token_id)
    assert book.find(session.session_id) is None  # ended with its token

    fresh, _ = tokens.mint("org-viewer", "acme")
    lasting, short = SessionBook(tokens), SessionBook(tokens, ttl_s=0)
    kept, expired = lasting.login(fresh), short.login(fresh)
    assert kept is not None and expired is not None
    assert lasting.find(kept.session_id) is not None
    assert short.find(expired.session_id) is None  # its expiry passed at once
