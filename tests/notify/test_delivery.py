"""`spendbus notify run` on the real broker, POSTing to a real receiver on 127.0.0.1:
signed bodies with their Idempotency-Key, each alert once per webhook (a repeat on the
topic, a restart, a kill -9 mid-delivery), retries, a failing webhook beside a working
one, the YAML config's filters, and the ClickHouse delivery log."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from notify.webhooks import derived_webhook_id
from schemas.topics import Topics
from spendbus.stack.broker_probe import free_port
from tests.notify.kit import (
    NotifierProcess,
    Received,
    Receiver,
    deliveries,
    publish_alerts,
    publish_budgets,
    start_receiver,
    threshold_alert,
    unpriced,
    verify,
)

pytestmark = pytest.mark.integration

SECRET = "whsec-test-0123456789"
FAST = ["--retry-base-seconds", "0.05", "--retry-max-seconds", "0.2"]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    yield from start_receiver(Receiver())


def _secret(tmp_path: Path) -> Path:
    path = tmp_path / "webhook-secret"
    path.write_text(SECRET + "\n")
    path.chmod(0o600)
    return path


def _metrics(port: int) -> dict[tuple[str, str], float]:
    """(sample name, webhook label) -> value, from the notifier's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, sample.labels.get("webhook", "")): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _per_key(received: list[Received]) -> collections.Counter[str | None]:
    return collections.Counter(r.idempotency_key for r in received)


def test_signed_once_each_retried_and_logged(
    kafka_bootstrap: str, topics: Topics, receiver: Receiver, tmp_path: Path, clickhouse_dsn: str
) -> None:
    receiver.fail_first["/flaky"] = 3
    alerts = [threshold_alert("acme-monthly", org) for org in ("acme", "beta")] + [
        unpriced("gpt-9")
    ]
    # the first alert twice on the topic (as a publisher handover can repeat one)
    publish_alerts(kafka_bootstrap, topics, [*alerts, alerts[0]])
    log = tmp_path / "notify.log"
    args = [
        "--webhook",
        receiver.url("/hook"),
        "--webhook",
        receiver.url("/flaky"),
        "--secret-file",
        str(_secret(tmp_path)),
        *FAST,
    ]
    env = {"CLICKHOUSE_DSN": clickhouse_dsn}
    notifier = NotifierProcess(kafka_bootstrap, topics, log, args, env).start()
    try:
        receiver.until(
            lambda: len(receiver.accepted("/hook")) >= 3 and len(receiver.accepted("/flaky")) >= 3,
            log=log,
        )
        receiver.until(lambda: len(deliveries(kafka_bootstrap, topics)) >= 6, log=log)
    finally:
        notifier.stop()

    ids = {a["alert_id"] for a in alerts}
    for path in ("/hook", "/flaky"):
        accepted = receiver.accepted(path)
        assert _per_key(accepted) == {i: 1 for i in ids}
        for r in accepted:
            assert verify(r, SECRET), "the receiver recomputes the HMAC over the raw body"
            assert r.idempotency_key == r.json["alert_id"]
            assert r.json["text"] and r.json["summary"] in r.json["text"]
    # the flaky receiver: 3 failures then a success, the same key every time
    first = receiver.attempts("/flaky")[:4]
    assert [r.status for r in first] == [503, 503, 503, 200]
    assert len({r.idempotency_key for r in first}) == 1
    records = {(d.webhook, d.alert_id): d for d in deliveries(kafka_bootstrap, topics)}
    assert len(records) == 6 and all(d.status == "delivered" for d in records.values())
    flaky = [d for d in records.values() if d.alert_id == first[0].idempotency_key]
    assert sorted(d.attempts for d in flaky) == [1, 4]
    text = log.read_text()
    assert "tok-secret-123" not in text and SECRET not in text

    # a restart sends nothing again, even an alert repeated on the topic after it
    new = threshold_alert("acme-monthly", "gamma")
    publish_alerts(kafka_bootstrap, topics, [alerts[1], new])
    notifier = NotifierProcess(kafka_bootstrap, topics, log, args, env).start()
    try:
        receiver.until(lambda: len(receiver.accepted("/flaky")) >= 4, log=log)
        receiver.until(lambda: len(receiver.accepted("/hook")) >= 4, log=log)
        receiver.until(lambda: len(deliveries(kafka_bootstrap, topics)) >= 8, log=log)
    finally:
        notifier.stop()
    for path in ("/hook", "/flaky"):
        assert _per_key(receiver.accepted(path)) == {i: 1 for i in {*ids, new["alert_id"]}}

    # the delivery log in ClickHouse: one row per (alert, webhook), attempts as recorded
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "spendbus",
            "sql",
            "--json",
            "SELECT webhook_url, alert_id, status, attempts FROM alert_deliveries "
            "ORDER BY webhook_url, alert_id LIMIT 1 BY webhook, alert_id",
        ],
        env={
            **os.environ,
            "KAFKA_BOOTSTRAP": kafka_bootstrap,
            "SPENDBUS_TOPIC_PREFIX": topics.prefix,
            "CLICKHOUSE_DSN": clickhouse_dsn,
            "SPENDBUS_HOME": str(tmp_path / "home"),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads(done.stdout)
    assert len(rows) == 8
    assert {r["webhook_url"] for r in rows} == {f"http://127.0.0.1:{receiver.port}/…"}
    assert all(r["status"] == "delivered" for r in rows)
    assert sorted(r["attempts"] for r in rows) == [1] * 7 + [4]


def test_kill9_mid_delivery_delivers_each_alert_once(
    kafka_bootstrap: str, topics: Topics, receiver: Receiver, tmp_path: Path
) -> None:
    alerts = [threshold_alert("acme-monthly", f"org-{n}") for n in range(12)]
    publish_alerts(kafka_bootstrap, topics, alerts)
    log = tmp_path / "notify.log"
    args = ["--webhook", receiver.url("/slow"), *FAST]
    # the receiver takes four, then fails: the notifier is retrying the fifth when killed
    receiver.fail_after["/slow"] = 4
    notifier = NotifierProcess(kafka_bootstrap, topics, log, args).start()
    try:
        receiver.until(lambda: len(receiver.accepted("/slow")) >= 4, log=log)
        receiver.until(
            lambda: sum(r.status == 503 for r in receiver.attempts("/slow")) >= 3, log=log
        )
        notifier.kill9()
    finally:
        notifier.stop()
    delivered_before = {r.idempotency_key for r in receiver.accepted("/slow")}
    assert 4 <= len(delivered_before) < len(alerts)
    receiver.failing.clear()
    notifier = NotifierProcess(kafka_bootstrap, topics, log, args).start()
    try:
        receiver.until(lambda: len(receiver.accepted("/slow")) >= len(alerts), log=log)
        receiver.until(lambda: len(deliveries(kafka_bootstrap, topics)) >= len(alerts), log=log)
    finally:
        notifier.stop()
    assert _per_key(receiver.accepted("/slow")) == {a["alert_id"]: 1 for a in alerts}
    retried = [d for d in deliveries(kafka_bootstrap, topics) if d.attempts > 1]
    assert not retried or all(d.alert_id not in delivered_before for d in retried)


def test_failing_webhook_does_not_hold_the_others(
    kafka_bootstrap: str, topics: Topics, receiver: Receiver, tmp_path: Path
) -> None:
    receiver.failing.add("/down")
    receiver.status_for["/gone"] = 404
    alerts = [threshold_alert("acme-monthly", f"org-{n}") for n in range(5)]
    publish_alerts(kafka_bootstrap, topics, alerts)
    log = tmp_path / "notify.log"
    metrics_port = free_port()
    args = [
        "--webhook",
        receiver.url("/down"),
        "--webhook",
        receiver.url("/up"),
        "--webhook",
        receiver.url("/gone"),
        "--metrics-port",
        str(metrics_port),
        *FAST,
    ]
    notifier = NotifierProcess(kafka_bootstrap, topics, log, args).start()
    try:
        receiver.until(lambda: len(receiver.accepted("/up")) >= 5, log=log)
        # every alert reached /up while /down still fails its first one
        assert receiver.accepted("/down") == []
        assert {r.idempotency_key for r in receiver.attempts("/down")} == {alerts[0]["alert_id"]}
        receiver.until(
            lambda: sum(d.status == "failed" for d in deliveries(kafka_bootstrap, topics)) >= 5,
            log=log,
        )
        # the metrics, per webhook id (never its URL): /down waits with all five queued
        down, up, gone = (derived_webhook_id(receiver.url(p)) for p in ("/down", "/up", "/gone"))
        samples = _metrics(metrics_port)
        assert samples[("spendbus_notify_delivered_total", up)] == 5
        assert samples[("spendbus_notify_failed_total", gone)] == 5
        assert samples[("spendbus_notify_retries_total", down)] >= 1
        assert samples[("spendbus_notify_queued", down)] >= 4
        assert not any(receiver.url("/") in name for name, _ in samples)
    finally:
        notifier.stop()
    # a 404 is not retried: one attempt each, recorded failed
    attempts_gone = _per_key(receiver.attempts("/gone"))
    assert attempts_gone == {a["alert_id"]: 1 for a in alerts}
    failed = [d for d in deliveries(kafka_bootstrap, topics) if d.status == "failed"]
    assert {(d.attempts, d.http_status) for d in failed} == {(1, 404)}


def test_config_filters_by_budget_scope_and_kind(
    kafka_bootstrap: str, topics: Topics, receiver: Receiver, tmp_path: Path
) -> None:
    publish_budgets(
        kafka_bootstrap,
        topics,
        [
            {"id": "acme-monthly", "scope": "org", "window": "month", "limit_usd": "400"},
            {"id": "acme-projects", "scope": "project", "window": "month", "limit_usd": "400"},
            {"id": "other-monthly", "scope": "org", "window": "month", "limit_usd": "400"},
        ],
    )
    secret = _secret(tmp_path)
    config = tmp_path / "notify.yaml"
    config.write_text(
        f"""
webhooks:
  - {{url: "{receiver.url("/acme")}", id: acme, secret_file: {secret}, budgets: ["acme-*"]}}
  - {{url: "{receiver.url("/projects")}", id: projects, scopes: [project]}}
  - {{url: "{receiver.url("/models")}", id: models, kinds: [unpriced_model]}}
"""
    )
    other = threshold_alert("other-monthly", "beta")
    monthly = threshold_alert("acme-monthly", "acme")
    model = unpriced("gpt-9")
    projects = threshold_alert("acme-projects", "acme")  # last: taken by acme and projects
    publish_alerts(kafka_bootstrap, topics, [other, monthly, model, projects])
    log = tmp_path / "notify.log"
    notifier = NotifierProcess(kafka_bootstrap, topics, log, ["--config", str(config), *FAST])
    notifier.start()
    try:
        # dispatch is in topic order to every webhook at once: when /projects has the last
        # alert, every earlier one was offered to every webhook
        receiver.until(lambda: len(receiver.accepted("/projects")) >= 1, log=log)
        receiver.until(lambda: len(receiver.accepted("/acme")) >= 2, log=log)
        receiver.until(lambda: len(receiver.accepted("/models")) >= 1, log=log)
    finally:
        notifier.stop()
    got = {p: set(_per_key(receiver.accepted(p))) for p in ("/acme", "/projects", "/models")}
    assert got == {
        "/acme": {monthly["alert_id"], projects["alert_id"]},
        "/projects": {projects["alert_id"]},
        "/models": {model["alert_id"]},
    }
    assert all(verify(r, SECRET) for r in receiver.accepted("/acme"))
    assert all(r.signature is None for r in receiver.accepted("/projects"))
    assert receiver.accepted("/projects")[0].json["scope"] == "project"
