"""`spendbus status`: the pipeline's health on one screen, or as JSON for scripts.

It asks Kafka (aiokafka's admin client and a group-less consumer: no Kafka CLI
jars), the aggregator workers' web pages and ClickHouse, each within a bounded
time, and reports what it saw; it changes nothing. With the embedded store
(``chdb://``) a running worker holds the engine's lock, so ClickHouse is asked
through the worker's ``/sql`` page, as ``spendbus sql`` does.

``--json`` prints one object; these keys are stable (new keys may be added)::

    generation       the current generation ("" = the default; after `spendbus replay
                     --cutover` its name): topics, verdicts and groups are its own
    kafka            bootstrap, managed, running   (as before: where Kafka is, and
                                                    whether `spendbus up` runs it)
                     security (protocol, mechanism, user, CA; never the password)
                     reachable (bool), error (str|null), cluster_id, controller_id,
                     brokers: [{node_id, host, port}]
    topics           [{name, exists, partitions, records}]   records = end - start
                                                              offsets, summed
    consumer_groups  [{group, state, members, clients: [str], lag,
                       topics: [{topic, committed, end, lag}]}]
                     every group with committed offsets on this stack's topics;
                     lag = records not yet committed (a partition without a commit
                     counts from its start offset); the enforcers' group (membership:
                     members = the replicas counted) has counts_enforcers, no lag;
                     an aggregator group has generation_current (false: a generation
                     retired by a cutover or being built: its lag is no problem)
    worker           pid, web_port, stats | error   (as before: the local worker)
                     url, answering (bool), serving (bool|null)
    workers          [{url, answering, serving, assigned_partitions, error}]
                     every web page probed (--worker, default the local one)
    verdicts         topic, records, newest_emitted_at, newest_as_of (ISO 8601|null),
                     age_seconds (now - newest emitted_at; null when none)
    dlq              topic, letters
    clickhouse       dsn (password hidden), reachable (bool|null), via
                     ("worker" | "direct"), usage_events (int|null), error
    replication      replication_factor, min_insync_replicas, brokers (the plan for this
                     cluster: runtime/replication.py), error (str|null),
                     under_replicated: [{topic, replicas, min_insync_replicas,
                     wanted_replicas, wanted_min_insync}]  (contract topics and the
                     counters' changelogs below the plan; `spendbus topics fix-replication`)
    problems         [str]: what a person should look at; empty when all is well

Exit status: 0 when Kafka answered (whatever the problems), 2 when it could not
be reached within ``--timeout`` (the report is still printed).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from aggregator import generation_dsn
from runtime.clickhouse_access import ClickHouseAccess
from runtime.replication import ReplicationProblem
from schemas.errors import ConfigError
from schemas.topics import Topics
from spendbus.commands.status_kafka import STALE_VERDICT_S, KafkaUnreachable, kafka_report
from spendbus.commands.status_services import clickhouse_report, redact, worker_report
from spendbus.settings import Settings, load_settings
from spendbus.stack.local import local_broker, worker_process
from spendbus.stack.topics import FIX_COMMAND
from spendbus.stack.web_token import client_token

console = Console()
err_console = Console(stderr=True)


@dataclass(frozen=True)
class Probe:
    """What to ask and how long each question may take."""

    settings: Settings
    workers: tuple[str, ...]
    timeout: float


# ------------------------------------------------------------------------------------------
# The report
# ------------------------------------------------------------------------------------------


def _web_token(settings: Settings) -> str | None:
    """The workers' web token (/sql needs it; every page off loopback); None when unusable."""
    try:
        token = client_token(settings)
    except ConfigError:  # the pages then answer 401, which the report shows
        return None
    return None if token is None else token.get_secret_value()


def collect(probe: Probe) -> dict[str, Any]:
    """The whole report (see the module docstring for its keys)."""
    settings = probe.settings
    report = _stack(settings)

    token = _web_token(settings)
    workers = [worker_report(url, probe.timeout, token) for url in probe.workers]
    local = workers[0] if workers else None
    if local is not None:
        report["worker"].update(url=local["url"], answering=local["answering"])
        report["worker"]["serving"] = local["serving"]
        if local["answering"]:
            report["worker"]["stats"] = local["stats"]
        else:
            report["worker"]["error"] = local["error"]
    report["workers"] = [{k: v for k, v in w.items() if k != "stats"} for w in workers]

    kafka_failed: str | None = None
    bootstrap = report["kafka"]["bootstrap"]
    if bootstrap is None:
        kafka_failed = "no Kafka: set KAFKA_BOOTSTRAP, or run `spendbus up`"
    else:
        try:
            seen = asyncio.run(
                kafka_report(
                    bootstrap,
                    settings.topics,
                    probe.timeout,
                    security=settings.kafka_security,
                    replication=settings.replication,
                )
            )
        except KafkaUnreachable as exc:
            kafka_failed = f"Kafka unreachable: {exc}"
        else:
            report["kafka"].update(
                reachable=True,
                cluster_id=seen["cluster_id"],
                controller_id=seen["controller_id"],
                brokers=seen["brokers"],
            )
            for key in (
                "generation",
                "topics",
                "consumer_groups",
                "verdicts",
                "dlq",
                "replication",
            ):
                report[key] = seen[key]
    if kafka_failed is not None:
        report["kafka"]["error"] = kafka_failed
        report.update(
            generation=None,
            topics=[],
            consumer_groups=[],
            verdicts=None,
            dlq=None,
            replication=None,
        )
    answering = next((w["url"] for w in workers if w["answering"]), None)
    try:
        access: ClickHouseAccess | None = settings.clickhouse_access
    except ConfigError as exc:  # unusable CLICKHOUSE_* settings: say so, ask nothing
        access = None
        report["clickhouse"].update(
            reachable=False, via="direct", usage_events=None, error=str(exc)
        )
    if access is not None:
        report["clickhouse"] = clickhouse_report(
            # after a cutover the store is the current generation's (docs/replay.md)
            generation_dsn(settings.dsn, report.get("generation") or ""),
            answering,
            probe.timeout,
            report["worker"]["pid"],
            token=token,
            access=access,
        )
    report["problems"] = problems(report, settings.topics)
    return report


def _stack(settings: Settings) -> dict[str, Any]:
    """The keys `status` always had: where Kafka is and who runs it, the DSN, the local worker."""
    managed = not settings.kafka_bootstrap
    running = not managed or local_broker(settings).is_running()
    bootstrap = settings.kafka_bootstrap or (local_broker(settings).bootstrap if running else None)
    return {
        "kafka": {
            "bootstrap": bootstrap,
            "security": settings.kafka_security.describe(),
            "managed": managed,
            "running": running,
            "reachable": False,
            "error": None,
            "brokers": [],
        },
        "clickhouse": {"dsn": redact(settings.dsn)},
        "worker": {"pid": worker_process(settings).pid(), "web_port": settings.web_port},
    }


def problems(report: dict[str, Any], topics: Topics) -> list[str]:
    found = []
    kafka = report["kafka"]
    if not kafka["reachable"]:
        found.append(kafka["error"])
    for topic in report["topics"]:
        if not topic["exists"]:
            found.append(f"topic {topic['name']} is missing (spendbus up creates the topics)")
    replication = report.get("replication") or {}
    if replication.get("error"):
        found.append(f"replication settings: {replication['error']}")
    for under in replication.get("under_replicated", []):
        found.append(f"topic {ReplicationProblem(**under)} (fix: {FIX_COMMAND})")
    workers = report["workers"]
    if workers and not any(w["answering"] for w in workers):
        found.append("no aggregator worker answers on " + ", ".join(w["url"] for w in workers))
    for w in workers:
        if w["answering"] and not w["serving"]:
            found.append(f"the worker at {w['url']} answers but does not serve yet")
    # a group of another generation (retired by a cutover) is left behind on purpose
    serving = [g for g in report["consumer_groups"] if g.get("generation_current", True)]
    for group in serving:
        if group["lag"] and not group["members"]:
            found.append(f"group {group['group']}: {group['lag']:,} records waiting, no member")
    raw_lag = sum(t["lag"] for g in serving for t in g["topics"] if t["topic"] == topics.usage_raw)
    verdicts = report["verdicts"]
    age = verdicts and verdicts["age_seconds"]
    if raw_lag and age is not None and age > STALE_VERDICT_S:
        found.append(
            f"{raw_lag:,} usage records wait to be counted and the newest verdict is {age:.0f}s old"
        )
    if report["dlq"] and report["dlq"]["letters"]:
        found.append(f"{report['dlq']['letters']:,} dead letters (spendbus dlq list)")
    clickhouse = report["clickhouse"]
    if clickhouse["reachable"] is False:
        found.append(f"ClickHouse unreachable: {clickhouse['error']}")
    elif clickhouse["reachable"] is None and clickhouse.get("error"):
        found.append(f"ClickHouse not checked: {clickhouse['error']}")
    return found


# ------------------------------------------------------------------------------------------
# The command
# ------------------------------------------------------------------------------------------


@click.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object (keys: spendbus status -h).")
@click.option(
    "--worker",
    "workers",
    multiple=True,
    metavar="HOST:PORT",
    help="An aggregator worker's web address; repeatable (default: the local worker's).",
)
@click.option(
    "--timeout",
    default=10.0,
    show_default=True,
    type=click.FloatRange(min=0.5),
    help="Seconds each part (Kafka, a worker, ClickHouse) may take to answer.",
)
def status(as_json: bool, workers: tuple[str, ...], timeout: float) -> None:
    """Brokers, topics, consumer lag, workers, verdict freshness, DLQ and ClickHouse.

    JSON keys (stable; new ones may be added): kafka, topics, consumer_groups,
    worker, workers, verdicts, dlq, clickhouse, problems. Exit status 2 when
    Kafka cannot be reached within --timeout, else 0.
    """
    settings = load_settings()
    # the local worker where it listens (SPENDBUS_WEB_HOST; a wildcard bind: loopback)
    urls = tuple(_url(w) for w in workers) or (worker_process(settings).base_url,)
    report = collect(Probe(settings, urls, timeout))
    if as_json:
        click.echo(json.dumps(report, default=str))
    else:
        render(report)
    if not report["kafka"]["reachable"]:
        err_console.print(f"[red]error:[/red] {report['kafka']['error']}", highlight=False)
        raise SystemExit(2)


def _url(address: str) -> str:
    return address.rstrip("/") if "://" in address else f"http://{address}"


def render(report: dict[str, Any]) -> None:
    kafka = report["kafka"]
    brokers = ", ".join(
        f"{b['node_id']}@{b['host']}:{b['port']}"
        + ("*" if b["node_id"] == kafka.get("controller_id") else "")
        for b in kafka["brokers"]
    )
    console.print(
        f"[bold]Kafka[/bold] {kafka['bootstrap'] or '-'}  "
        + (f"brokers: {brokers}" if kafka["reachable"] else "[red]unreachable[/red]")
        + ("  (local, spendbus up)" if kafka["managed"] else "")
        + (f"  ({escape(kafka['security'])})" if kafka["security"] != "PLAINTEXT" else "")
        + (f"  generation: {report['generation']}" if report.get("generation") else ""),
        highlight=False,
    )

    if report["topics"]:
        topics = Table("topic", "partitions", "records", title="topics", title_justify="left")
        for t in report["topics"]:
            topics.add_row(
                t["name"],
                str(t["partitions"]) if t["exists"] else "[red]missing[/red]",
                f"{t['records']:,}",
            )
        console.print(topics)

    if report["consumer_groups"]:
        groups = Table(
            "group",
            "state",
            "members",
            "topic",
            "committed",
            "end",
            "lag",
            title="consumer groups",
            title_justify="left",
        )
        for g in report["consumer_groups"]:
            name = g["group"] + ("" if g.get("generation_current", True) else " (other generation)")
            for i, t in enumerate(g["topics"]):
                groups.add_row(
                    name if i == 0 else "",
                    g["state"] if i == 0 else "",
                    str(g["members"]) if i == 0 else "",
                    t["topic"],
                    f"{t['committed']:,}",
                    f"{t['end']:,}",
                    f"[yellow]{t['lag']:,}[/yellow]" if t["lag"] else "0",
                )
        console.print(groups)

    workers = Table(title="aggregator workers", title_justify="left")
    workers.add_column("worker", no_wrap=True)
    for name in ("pid", "answering", "serving", "partitions", "charged", "sink failures"):
        workers.add_column(name)
    local_pid = report["worker"].get("pid")
    for i, w in enumerate(report["workers"]):
        stats = report["worker"].get("stats", {}) if i == 0 else {}
        workers.add_row(
            w["url"],
            str(local_pid or "-") if i == 0 else "-",
            _yes(w["answering"]),
            _yes(w["serving"]),
            str(w.get("assigned_partitions", "-")),
            f"{stats['charged']:,}" if "charged" in stats else "-",
            str(stats.get("sink_failures", "-")),
        )
    console.print(workers)

    facts = Table(show_header=False, box=None)
    verdicts, dlq, clickhouse = report["verdicts"], report["dlq"], report["clickhouse"]
    if verdicts is not None:
        age = verdicts["age_seconds"]
        facts.add_row(
            "newest verdict",
            "none yet"
            if age is None
            else f"{age:,.1f}s ago (emitted {verdicts['newest_emitted_at']}, "
            f"as of {verdicts['newest_as_of']})",
        )
    if dlq is not None:
        facts.add_row("dead letters", f"{dlq['letters']:,}")
    facts.add_row(
        "ClickHouse",
        f"{clickhouse['dsn']} via {clickhouse['via']}: "
        + (
            f"[green]reachable[/green], {clickhouse['usage_events']:,} usage events"
            if clickhouse["reachable"]
            else f"[red]unreachable[/red] ({clickhouse['error']})"
        ),
    )
    console.print(facts)
    for problem in report["problems"]:
        console.print(f"[yellow]![/yellow] {problem}", highlight=False)
    if not report["problems"]:
        console.print("[green]no problems seen[/green]")


def _yes(value: bool | None) -> str:
    return "-" if value is None else ("[green]yes[/green]" if value else "[red]no[/red]")
