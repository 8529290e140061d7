"""Where the worker's web token comes from (spendbus/stack/web_token.py), without a broker."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from pydantic import SecretStr

from schemas.errors import ConfigError
from spendbus.settings import load_settings
from spendbus.stack.web_token import client_token, worker_token
from spendbus.stack.worker import WorkerProcess


def test_on_loopback_the_home_file_is_made_once_private_and_random(tmp_path: Path) -> None:
    settings = load_settings({"SPENDBUS_HOME": str(tmp_path)})
    assert client_token(settings) is None  # nothing made yet: a client never makes one
    first = worker_token(settings)
    token_file = tmp_path / "web.token"
    assert token_file.stat().st_mode & 0o777 == 0o600
    assert token_file.read_text().strip() == first.get_secret_value()
    assert len(first.get_secret_value()) >= 40
    assert worker_token(settings) == first  # kept: a restart serves the same token
    assert client_token(settings) == first
    other_home = load_settings({"SPENDBUS_HOME": str(tmp_path / "other")})
    assert worker_token(other_home) != first


def test_workers_starting_at_once_agree_on_one_token(tmp_path: Path) -> None:
    settings = load_settings({"SPENDBUS_HOME": str(tmp_path)})
    seen: list[SecretStr] = []
    threads = [
        threading.Thread(target=lambda: seen.append(worker_token(settings))) for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({token.get_secret_value() for token in seen}) == 1


def test_off_loopback_a_token_must_be_configured(tmp_path: Path) -> None:
    settings = load_settings({"SPENDBUS_HOME": str(tmp_path), "SPENDBUS_WEB_HOST": "0.0.0.0"})
    with pytest.raises(ConfigError, match="SPENDBUS_WEB_TOKEN_FILE") as raised:
        worker_token(settings)
    assert "0.0.0.0" in str(raised.value)
    assert not (tmp_path / "web.token").exists()

    token_file = tmp_path / "token"
    token_file.write_text("configured-token\n")
    token_file.chmod(0o600)  # a secret: private (runtime/private_files.py)
    configured = load_settings(
        {
            "SPENDBUS_HOME": str(tmp_path),
            "SPENDBUS_WEB_HOST": "0.0.0.0",
            "SPENDBUS_WEB_TOKEN_FILE": str(token_file),
        }
    )
    assert worker_token(configured).get_secret_value() == "configured-token"
    assert client_token(configured).get_secret_value() == "configured-token"  # type: ignore[union-attr]  # a token is configured: not None


def test_configured_tokens_are_checked_and_never_shown(tmp_path: Path) -> None:
    env = {"SPENDBUS_HOME": str(tmp_path), "SPENDBUS_WEB_TOKEN": "value-from-the-env"}
    settings = load_settings(env)
    assert worker_token(settings).get_secret_value() == "value-from-the-env"
    assert "value-from-the-env" not in repr(settings) + str(settings)
    worker = WorkerProcess(run_dir=tmp_path, env={}, web_port=1, token=settings.web_token)
    assert "value-from-the-env" not in repr(worker)

    both = load_settings({**env, "SPENDBUS_WEB_TOKEN_FILE": str(tmp_path / "t")})
    with pytest.raises(ConfigError, match="both set"):
        worker_token(both)
    missing = load_settings(
        {"SPENDBUS_HOME": str(tmp_path), "SPENDBUS_WEB_TOKEN_FILE": str(tmp_path / "nope")}
    )
    with pytest.raises(ConfigError, match="SPENDBUS_WEB_TOKEN_FILE"):
        worker_token(missing)
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "empty").chmod(0o600)  # a secret: private (runtime/private_files.py)
    empty = load_settings(
        {"SPENDBUS_HOME": str(tmp_path), "SPENDBUS_WEB_TOKEN_FILE": str(tmp_path / "empty")}
    )
    with pytest.raises(ConfigError, match="empty"):
        client_token(empty)


def test_a_worker_process_sends_the_token_its_child_serves(tmp_path: Path) -> None:
    home = WorkerProcess(run_dir=tmp_path, env={"SPENDBUS_HOME": str(tmp_path)}, web_port=1)
    assert home.token_file == tmp_path / "web.token"
    named = tmp_path / "named"
    configured = WorkerProcess(
        run_dir=tmp_path,
        env={"SPENDBUS_HOME": str(tmp_path), "SPENDBUS_WEB_TOKEN_FILE": str(named)},
        web_port=1,
    )
    assert configured.token_file == named
    assert configured.base_url == "http://127.0.0.1:1"
    assert WorkerProcess(tmp_path, {}, 1, web_host="0.0.0.0").base_url == "http://127.0.0.1:1"
    assert WorkerProcess(tmp_path, {}, 1, web_host="::1").base_url == "http://[::1]:1"
