"""`spendbus demo` ends with the spend console's address; with ``--keep`` (its stack left
running) also the command serving it over that stack and a login made for it."""

from __future__ import annotations

from pathlib import Path

from spendbus.commands.admin_api import token_book
from spendbus.demo import console_login
from spendbus.settings import Settings


def test_the_demo_prints_the_console_and_with_keep_a_login_for_it(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "demo", topic_prefix="demo-ab12.", web_port=8123)
    stopped = console_login(settings, "127.0.0.1:9092", keep=False)
    assert len(stopped) == 1 and "http://127.0.0.1:6070/" in stopped[0]
    assert "sbadm_" not in stopped[0] and not (tmp_path / "demo").exists()

    kept = console_login(settings, "127.0.0.1:9092", keep=True)
    serve, login = kept[0], kept[1]
    for part in (
        f"SPENDBUS_HOME={tmp_path / 'demo'}",
        "KAFKA_BOOTSTRAP=127.0.0.1:9092",
        "SPENDBUS_TOPIC_PREFIX=demo-ab12.",
        "SPENDBUS_WEB_PORT=8123",
        "spendbus admin serve",
    ):
        assert part in serve
    token = login.rsplit(" ", 1)[1]
    record = token_book(settings).verify(token)
    assert record is not None and record.role == "platform-admin" and record.token_id in login
