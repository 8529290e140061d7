"""infra/grafana/spendbus.json queries only metrics that the real processes expose: a running
aggregator worker's /metrics and a running enforcer sidecar's /metrics, scraped here."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from schemas.codec import USAGE_EVENT
from schemas.usage import new_usage_event
from spendbus.stack.broker_probe import free_port
from spendbus.stack.compacted import publish
from tests.pipeline_kit import Pipeline

pytestmark = pytest.mark.integration

GRAFANA = Path(__file__).resolve().parents[2] / "infra" / "grafana"
#: the panels issue #7 asks for, by title
REQUIRED_PANELS = {
    "Spend rate",
    "Verdict latency",
    "Consumer lag",
    "Refusals by decision",
    "DLQ rate",
    "Sink failures",
    "Enforcer staleness",
}
METRIC = re.compile(r"\bspendbus_[a-z0-9_]+")
#: series names a family of each type exposes besides its own name
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("_sum", "_count", "_created"),
}


def exposed(text: str) -> set[str]:
    """Every series name the exposition offers, samples or not (a family without samples yet,
    such as decisions before the first check, still names its series)."""
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(f"{family.name}{suffix}" for suffix in SUFFIXES.get(family.type, ()))
        names.update(sample.name for sample in family.samples)
    return names


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # panels inside a collapsed row
    return [p for p in out if p["type"] != "row"]


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()  # type: ignore[no-any-return]  # urlopen's response is Any in typeshed


@pytest.fixture
def sidecar(pipeline: Pipeline, tmp_path: Path) -> Iterator[str]:
    """`spendbus enforcer serve` on a free port, following the pipeline's topics."""
    port = free_port()
    log = (tmp_path / "sidecar.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "spendbus", "enforcer", "serve", "--port", str(port)],
        env={
            **os.environ,
            "KAFKA_BOOTSTRAP": pipeline.bootstrap,
            "SPENDBUS_TOPIC_PREFIX": pipeline.topics.prefix,
            "SPENDBUS_HOME": str(tmp_path / "sidecar-home"),  # its token file is made there
        },
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                scrape(f"{url}/readyz")
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(
                        f"the sidecar did not become ready:\n{(tmp_path / 'sidecar.log').read_text()}"
                    ) from None
                time.sleep(0.3)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def test_every_dashboard_query_names_exposed_metrics(pipeline: Pipeline, sidecar: str) -> None:
    dashboard = json.loads((GRAFANA / "spendbus.json").read_text())
    shown = panels(dashboard)
    assert {p["title"] for p in shown} >= REQUIRED_PANELS
    assert dashboard["__inputs"][0]["name"] == "DS_PROMETHEUS"

    # traffic, so that the metrics a process only has once it has seen some are there too
    # (the enforcer's verdict lag exists once it applied a verdict)
    event = new_usage_event(
        provider="openai",
        api="openai-chat",
        model="gpt-4o-mini",
        secret_id="sk-1",
        org_id="acme",
        gateway_id="dashboard-test",
        input_tokens=1000,
        output_tokens=100,
    )
    asyncio.run(
        publish(
            pipeline.bootstrap, pipeline.topics.usage_raw, [(b"acme", USAGE_EVENT.encode(event))]
        )
    )
    deadline = time.monotonic() + 90
    enforcer = scrape(f"{sidecar}/metrics")
    while "spendbus_enforcer_verdict_lag_seconds" not in enforcer and time.monotonic() < deadline:
        time.sleep(0.3)
        enforcer = scrape(f"{sidecar}/metrics")
    worker = scrape(f"http://127.0.0.1:{pipeline.worker.web_port}/metrics")
    available = exposed(worker) | exposed(enforcer)

    queried: dict[str, set[str]] = {}
    for panel in shown:
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        for target in panel["targets"]:
            names = set(METRIC.findall(target["expr"]))
            assert names, f"{panel['title']!r}: {target['expr']!r} names no spendbus metric"
            for name in names:
                queried.setdefault(name, set()).add(panel["title"])
    missing = {name: sorted(titles) for name, titles in queried.items() if name not in available}
    print(f"dashboard queries {len(queried)} metrics over {len(shown)} panels; missing: {missing}")
    assert not missing, f"queried but exposed by neither process: {missing}"

    # the README documents every panel, and the scrape example is valid YAML naming both jobs
    readme = (GRAFANA / "README.md").read_text()
    assert all(f"| {p['title']} |" in readme for p in shown), "a panel is not in README.md"
    scrape_config = yaml.safe_load((GRAFANA / "prometheus.yml").read_text())
    assert {job["job_name"] for job in scrape_config["scrape_configs"]} == {
        "spendbus-aggregator",
        "spendbus-enforcer",
    }
