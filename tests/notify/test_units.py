"""notify without a broker: webhook config and filters, redaction, the payload and its
signature, the backoff, the notifier's ACL role."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from notify.payload import body, distinct_usd, signature, summary, verify_signature
from notify.webhooks import RetryPolicy, load_webhooks, redact_url
from runtime.acls import role_bindings
from schemas.errors import ConfigError
from schemas.topics import Topics
from tests.notify.kit import threshold_alert, unpriced


def test_redact_url_keeps_scheme_and_host_only() -> None:
    url = "https://hooks.slack.com:8443/services/T000/B000/XXXXSECRET?token=abc"
    assert redact_url(url) == "https://hooks.slack.com:8443/…"
    assert "SECRET" not in redact_url(url) and "abc" not in redact_url(url)


def test_config_file_filters_secrets_and_errors(tmp_path: Path) -> None:
    secret = tmp_path / "s"
    secret.write_text("hmac-key-1\n")
    secret.chmod(0o600)  # a secret: private (runtime/private_files.py)
    config = tmp_path / "notify.yaml"
    config.write_text(
        f"""
webhooks:
  - url: https://example.com/hook/TOKEN1
    id: finance
    secret_file: {secret}
    budgets: [acme-*]
    scopes: org
  - url: http://127.0.0.1:9/local
    kinds: [unpriced_model]
retry: {{base_seconds: 0.5, max_attempts: 7}}
"""
    )
    finance, local = load_webhooks(config, ["https://other.example/x?key=K"])[:2]
    assert finance.id == "finance" and finance.scopes == ("org",)
    assert finance.secret is not None and finance.secret.get_secret_value() == "hmac-key-1"
    assert finance.retry.max_attempts == 7 and local.retry.base_seconds == 0.5
    assert local.id.startswith("wh-")
    # nothing secret in the repr or in how a webhook is shown
    for w in load_webhooks(config, ["https://other.example/x?key=K"]):
        for text in (repr(w), w.shown):
            assert "TOKEN1" not in text and "hmac-key-1" not in text and "key=K" not in text

    a = threshold_alert("acme-monthly", "acme")
    assert finance.wants(a, "org")
    assert not finance.wants(a, "project")
    assert not finance.wants(threshold_alert("beta-monthly", "beta"), "org")
    assert not finance.wants(unpriced("m"), None)  # no budget: not for a budget filter
    assert local.wants(unpriced("m"), None) and not local.wants(a, "org")

    with pytest.raises(ConfigError, match="plain http:// off loopback"):
        load_webhooks(None, ["http://hooks.example.com/x"])
    with pytest.raises(ConfigError, match="expected an http"):
        load_webhooks(None, ["ftp://hooks.example.com/x"])
    with pytest.raises(ConfigError, match="given twice"):
        load_webhooks(None, ["https://a.example/x", "https://a.example/x"])
    with pytest.raises(ConfigError, match=r"secret_file.*cannot read"):
        bad = tmp_path / "bad.yaml"
        bad.write_text(f"webhooks: [{{url: 'https://a.example/', secret_file: {tmp_path}/none}}]")
        load_webhooks(bad, [])
    with pytest.raises(ConfigError, match="no webhook"):
        load_webhooks(None, [])
    typo = tmp_path / "typo.yaml"
    typo.write_text("webhooks: [{url: 'https://a.example/T0K', budget: [x]}]")
    with pytest.raises(ConfigError, match="budget") as caught:
        load_webhooks(typo, [])
    assert "T0K" not in str(caught.value)


def test_payload_sentence_text_and_signature() -> None:
    alert = threshold_alert("acme-monthly", "acme", 0.8)
    data = body(alert, "org")
    doc = json.loads(data)
    for name in ("alert_id", "kind", "counter_key", "budget_id", "period", "threshold", "state"):
        assert doc[name] == alert[name]
    assert doc["as_of"] == "2026-12-02T08:00:00+00:00"
    assert doc["scope"] == "org" and doc["scope_values"] == ["acme"]
    assert doc["spent_usd"] == "320" and doc["limit_usd"] == "400"
    assert doc["summary"] == (
        "Budget acme-monthly (org acme) passed 80% of its limit in period 2026-12: "
        "$320.00 of $400.00."
    )
    assert doc["summary"] in doc["text"]
    assert "is exhausted" in summary(threshold_alert("acme-monthly", "acme", 1.0), "org")
    refused = {**threshold_alert("acme-monthly", "acme", 1.0), "kind": "exhausted"}
    assert summary(refused, "org").startswith(
        "Budget acme-monthly (org acme) is exhausted: a request was refused for it in period"
    )
    assert "without a price" in summary(unpriced("gpt-9"), None)

    header = signature("k", data)
    assert header.startswith("sha256=") and len(header) == 7 + 64
    assert verify_signature("k", data, header)
    assert not verify_signature("other", data, header)
    assert not verify_signature("k", data + b" ", header)


@pytest.mark.parametrize(
    ("spent", "limit", "shown"),
    [
        (5_100_000, 10_000_000, ("$0.005", "$0.01")),  # half a cent: not "$0.01 of $0.01"
        (9_999_999_999, 10_000_000_000, ("$9.999999999", "$10.00")),
        (320_000_000_000, 400_000_000_000, ("$320.00", "$400.00")),
        (10_000_000, 10_000_000, ("$0.01", "$0.01")),  # equal amounts stay equal
        (12_345_678, 10_000_000, ("$0.012", "$0.01")),
    ],
)
def test_alert_amounts_are_shown_as_precisely_as_tells_them_apart(
    spent: int, limit: int, shown: tuple[str, str]
) -> None:
    assert distinct_usd(spent, limit) == shown
    alert = {**threshold_alert("tiny", "acme", 0.5), "spent_nanos": spent, "limit_nanos": limit}
    assert f"{shown[0]} of {shown[1]}" in summary(alert, "org")


def test_backoff_grows_and_is_capped() -> None:
    policy = RetryPolicy(base_seconds=1, max_seconds=10)
    assert [policy.delay(n, 0.999999) for n in (1, 2, 3)] == pytest.approx([1, 2, 4], rel=1e-3)
    assert policy.delay(10, 0.999999) == pytest.approx(10, rel=1e-3)
    assert policy.delay(3, 0.0) == 2  # jitter keeps at least half


def test_the_notifier_role_reads_alerts_and_budgets_and_writes_only_its_records() -> None:
    topics = Topics("p.")
    granted = {
        (b.resource_name, b.operation.name)
        for b in role_bindings("notifier", "User:notify", topics)
    }
    assert granted == {
        (topics.shared_alerts, "READ"),
        (topics.shared_alerts, "DESCRIBE"),
        (topics.budget_policies, "READ"),
        (topics.budget_policies, "DESCRIBE"),
        (topics.notify_deliveries, "READ"),
        (topics.notify_deliveries, "WRITE"),
        (topics.notify_deliveries, "DESCRIBE"),
    }


def test_a_forecast_alert_says_when_the_budget_runs_out() -> None:
    from datetime import UTC, datetime

    alert = {
        **threshold_alert("acme-monthly", "acme", 0.8),
        "threshold": 0.0,
        "alert_id": "forecast|12:acme-monthly,4:acme,|2026-12",
        "kind": "forecast",
        "state": "ok",
        "exhausts_at": datetime(2026, 12, 20, 14, 30, tzinfo=UTC),
    }
    doc = json.loads(body(alert, "org"))
    assert doc["exhausts_at"] == "2026-12-20T14:30:00+00:00"
    assert doc["summary"] == (
        "Budget acme-monthly (org acme) is forecast to run out at 2026-12-20T14:30Z, before "
        "period 2026-12 ends, at its burn over the last hour: $320.00 of $400.00."
    )
