"""`spendbus admin tokens | serve` as a user runs them: a token printed once and kept
only as a keyed digest in a private file; the server on SPENDBUS_ADMIN_PORT, loopback,
taking that token (a process of its own, on the real broker)."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from schemas.topics import Topics
from spendbus.cli import cli
from spendbus.stack.broker_probe import free_port

pytestmark = pytest.mark.integration

#: a guard against a server that never listens (never a measured threshold)
GUARD_S = 60.0


def run(env: dict[str, str], *args: str) -> Any:
    return CliRunner().invoke(cli, list(args), env=env)


def test_a_token_is_shown_once_and_kept_as_a_keyed_digest(tmp_path: Path) -> None:
    env = {"SPENDBUS_HOME": str(tmp_path / "home")}
    made = run(env, "admin", "tokens", "new", "--role", "org-admin", "--org", " acme ")
    assert made.exit_code == 0, made.output
    token = made.stdout.strip()
    assert token.startswith("sbadm_")
    tokens_file = tmp_path / "home" / "admin.tokens"
    for private in (tokens_file, tmp_path / "home" / "admin.secret"):
        assert stat.S_IMODE(private.stat().st_mode) == 0o600
    kept = tokens_file.read_text()
    secret_part = token.rsplit("_", 1)[1]
    assert secret_part not in kept and token not in kept
    listed = run(env, "admin", "tokens", "list", "--json")
    (record,) = json.loads(listed.stdout)
    assert (record["role"], record["org_id"], record["revoked_at"]) == ("org-admin", "acme", None)
    assert "digest" not in record and token not in listed.stdout
    # roles and orgs go together
    for args in (
        ("--role", "org-admin"),
        ("--role", "platform-admin", "--org", "acme"),
        ("--role", "root"),
    ):
        refused = run(env, "admin", "tokens", "new", *args)
        assert refused.exit_code != 0 and not refused.stdout.startswith("sbadm_")
    assert run(env, "admin", "tokens", "revoke", record["token_id"]).exit_code == 0
    (record,) = json.loads(run(env, "admin", "tokens", "list", "--json").stdout)
    assert record["revoked_at"] is not None
    # a tokens file others can read is refused, never used
    tokens_file.chmod(0o644)
    refused = run(env, "admin", "tokens", "list")
    assert refused.exit_code != 0 and "chmod 600" in refused.output


def get(
    url: str, token: str | None = None, method: str = "GET", body: Any = None
) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_admin_serve_listens_on_its_port_and_takes_the_tokens(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    port = free_port()
    env = {
        "SPENDBUS_HOME": str(tmp_path / "home"),
        "KAFKA_BOOTSTRAP": kafka_bootstrap,
        "SPENDBUS_TOPIC_PREFIX": topics.prefix,
        "SPENDBUS_ADMIN_PORT": str(port),
    }
    token = run(env, "admin", "tokens", "new", "--role", "platform-admin").stdout.strip()
    server = subprocess.Popen(
        [sys.executable, "-m", "spendbus", "admin", "serve"],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + GUARD_S
        while True:
            try:
                status, document = get(f"{url}/openapi.json")
                break
            except (urllib.error.URLError, ConnectionError):
                assert server.poll() is None, server.communicate()[0]
                assert time.monotonic() < deadline, "the admin API never listened"
                time.sleep(0.2)
        assert status == 200 and document["openapi"].startswith("3.1")
        assert get(f"{url}/v1/admin/budgets")[0] == 401
        assert get(f"{url}/v1/admin/budgets", token) == (200, {"budgets": []})
        # a token made while it runs counts at once; the README's session
        initech = run(env, "admin", "tokens", "new", "--role", "org-admin", "--org", "initech")
        org_token, api = initech.stdout.strip(), f"{url}/v1/admin"
        status, key = get(
            f"{api}/keys",
            org_token,
            "POST",
            {"name": "initech.customer-42", "secret_id": "sk-openai", "project_id": "c42"},
        )
        assert status == 201 and key["org_id"] == "initech"
        status, made = get(
            f"{api}/budgets/initech.c42",
            org_token,
            "PUT",
            {
                "scope": "project",
                "window": "month",
                "limit_usd": "25",
                "match": {"project_id": "c42"},
            },
        )
        assert status == 201
        assert made["match"] == {"project_id": "c42", "org_id": "initech"}
        assert get(f"{api}/counters?budget_id=initech.c42", org_token) == (200, {"counters": []})
    finally:
        server.send_signal(signal.SIGINT)
        output = server.communicate(timeout=GUARD_S)[0]
    assert token not in output
