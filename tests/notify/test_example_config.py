"""infra/notify/notify.example.yaml, the documented `notify run --config` format, loads as
shipped (with its secret file made) and means what its comments say."""

from __future__ import annotations

from pathlib import Path

import pytest

from notify import load_webhooks

EXAMPLE = Path(__file__).resolve().parents[2] / "infra" / "notify" / "notify.example.yaml"


def test_the_example_config_loads_as_documented(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    secret = tmp_path / "slack.secret"
    secret.write_text("a-signing-secret-0123456789\n")
    secret.chmod(0o600)
    slack, local = load_webhooks(EXAMPLE, [])
    assert slack.id == "slack-finops" and slack.secret is not None
    assert slack.budgets == ("acme-*",) and slack.scopes == ("org", "project")
    assert slack.kinds == ("threshold", "forecast")
    assert slack.retry.max_attempts == 0 and local.retry.max_attempts == 5
    assert local.retry.max_seconds == 300 and local.secret is None
