"""Private files (issue 32): every secret file spendbus reads is refused when group or
others can read it (a message naming the file and `chmod 600 FILE`, exit status 2 from
the CLI); standard input and environment variables are unaffected; `$SPENDBUS_HOME` is made
0700 and an older 0755 one tightened (logged), its logs 0600."""

from __future__ import annotations

import io
import logging
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from notify.webhooks import read_secret_file
from schemas.errors import ConfigError
from spendbus.cli import cli
from spendbus.settings import load_settings
from spendbus.stack.key_secret import key_secret
from spendbus.stack.private_home import open_private_log, secure_home
from spendbus.stack.web_token import client_token, configured_token

SECRET = "a-secret-of-0123456789abcdef"


def _secret(tmp_path: Path, mode: int) -> Path:
    path = tmp_path / "secret"
    path.write_text(SECRET + "\n")
    path.chmod(mode)
    return path


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


READERS: dict[str, Callable[[Path, Path], object]] = {
    "CLICKHOUSE_PASSWORD_FILE": lambda f, h: (
        load_settings(
            {"CLICKHOUSE_PASSWORD_FILE": str(f), "SPENDBUS_HOME": str(h)}
        ).clickhouse_access
    ),
    "KAFKA_SASL_PASSWORD_FILE": lambda f, h: (
        load_settings(
            {
                "KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                "KAFKA_SASL_USERNAME": "u",
                "KAFKA_SASL_PASSWORD_FILE": str(f),
                "SPENDBUS_HOME": str(h),
            }
        ).kafka_security
    ),
    "SPENDBUS_WEB_TOKEN_FILE": lambda f, h: configured_token(
        load_settings({"SPENDBUS_WEB_TOKEN_FILE": str(f), "SPENDBUS_HOME": str(h)})
    ),
    "SPENDBUS_KEY_SECRET_FILE": lambda f, h: key_secret(
        load_settings({"SPENDBUS_KEY_SECRET_FILE": str(f), "SPENDBUS_HOME": str(h)})
    ),
    "secret_file": lambda f, h: read_secret_file(f, "secret_file"),
}


@pytest.mark.parametrize("setting", sorted(READERS))
@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_a_secret_file_others_can_read_is_refused(tmp_path: Path, setting: str, mode: int) -> None:
    path = _secret(tmp_path, mode)
    with pytest.raises(ConfigError) as refused:
        READERS[setting](path, tmp_path / "home")
    message = str(refused.value)
    assert str(path) in message and f"chmod 600 {path}" in message
    assert f"{mode:04o}" in message
    assert SECRET not in message
    path.chmod(0o600)  # the fix the message gives
    READERS[setting](path, tmp_path / "home")


def test_the_default_files_in_home_are_refused_too(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    settings = load_settings({"SPENDBUS_HOME": str(home)})
    key_secret(settings)  # made 0600
    (home / "keys.secret").chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        key_secret(settings)
    (home / "web.token").write_text(SECRET + "\n")
    (home / "web.token").chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        client_token(settings)


def test_the_cli_stops_with_status_2_naming_the_fix(tmp_path: Path) -> None:
    path = _secret(tmp_path, 0o644)
    runner = CliRunner()
    env = {"SPENDBUS_HOME": str(tmp_path / "home")}
    for args in (["ingest", "serve", "--token-file", str(path)],):
        result = runner.invoke(cli, args, env=env)
        assert result.exit_code == 2, (args, result.output)
        assert f"chmod 600 {path}" in result.output.replace("\n", " ").replace("  ", " ")
        assert SECRET not in result.output


def test_standard_input_and_the_environment_are_unaffected(tmp_path: Path) -> None:
    import sys

    from spendbus.secret_input import read_secret

    sys_stdin = sys.stdin
    try:
        sys.stdin = io.StringIO(SECRET + "\n")
        assert read_secret("-", "bearer token") == SECRET
    finally:
        sys.stdin = sys_stdin
    settings = load_settings({"SPENDBUS_WEB_TOKEN": SECRET, "SPENDBUS_HOME": str(tmp_path)})
    token = configured_token(settings)
    assert token is not None and token.get_secret_value() == SECRET


def test_a_new_home_is_private_and_an_old_one_is_tightened(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fresh = tmp_path / "fresh" / "home"
    assert secure_home(fresh) == []
    assert _mode(fresh) == 0o700
    old = tmp_path / "old"
    for folder in ("kafka/logs", "clickhouse", "run"):
        (old / folder).mkdir(parents=True)
    for path in (old, old / "kafka", old / "kafka" / "logs", old / "clickhouse", old / "run"):
        path.chmod(0o755)
    for log in (old / "run" / "aggregator.log", old / "kafka" / "broker.log"):
        log.write_text("usage of user-1\n")
        log.chmod(0o644)
    (old / "kafka" / "logs" / "server.log").write_text("x\n")
    with caplog.at_level(logging.WARNING, logger="spendbus.stack.private_home"):
        changed = secure_home(old)
    assert _mode(old) == _mode(old / "kafka") == _mode(old / "clickhouse") == 0o700
    assert _mode(old / "run" / "aggregator.log") == _mode(old / "kafka" / "broker.log") == 0o600
    assert old / "run" / "aggregator.log" in changed
    assert f"{old} was readable by other users" in caplog.text
    assert secure_home(old) == []  # nothing left to tighten


def test_a_log_spendbus_opens_for_a_process_is_0600(tmp_path: Path) -> None:
    path = tmp_path / "run" / "aggregator.log"
    with open_private_log(path) as log:
        log.write(b"x\n")
    assert _mode(path) == 0o600
    path.chmod(0o644)  # made by an older spendbus
    with open_private_log(path) as log:
        log.write(b"y\n")
    assert _mode(path) == 0o600
    assert path.read_bytes() == b"x\ny\n"
