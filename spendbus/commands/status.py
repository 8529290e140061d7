"""`spendbus status`: the pipeline's health on one screen, or as JSON for scripts.

It asks Kafka (aiokafka's admin client and a group-less consumer: no Kafka CLI
jars), the aggregator workers' web pages and ClickHouse, each within a bounded
time, and reports what it saw; it changes nothing. With the embedded store
(``chdb://``) a running worker holds the engine's lock, so ClickHouse is asked
through the worker's ``/sql`` page, as ``spendbus sql`` does.

``--json`` prints one object; these keys are stable (new keys may be added)::

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
                     members = the replicas counted) has counts_enforcers, no lag
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
                     cluster: schemas/replication.py), error (str|null),
                     under_replicated: [{topic, replicas, min_insync_replicas,
                     wanted_replicas, wanted_min_insync}]  (contract topics and the
                     counters' changelogs below the plan; `spendbus topics fix-replication`)
    problems         [str]: what a person should look at; empty when all is well

Exit status: 0 when Kafka answered (whatever the problems), 2 when it could not
be reached within ``--timeout`` (the report is still printed).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from aggregator.clickhouse_access import ClickHouseAccess, redact_dsn
from schemas.codec import VERDICT
from schemas.errors import ConfigError
from schemas.kafka import PLAINTEXT, KafkaSecurity, preflight
from schemas.replication import FOLLOW_CLUSTER, ReplicationPolicy, ReplicationProblem
from schemas.topics import Topics
from spendbus.settings import Settings, load_settings
from spendbus.stack.local import local_broker, worker_process
from spendbus.stack.topics import FIX_COMMAND, replication_report
from spendbus.stack.web_token import client_token

console = Console()
err_console = Console(stderr=True)
T = TypeVar("T")

#: with usage waiting to be counted, a newest verdict older than this is worth a look
STALE_VERDICT_S = 60.0


class HttpError(Exception):
    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"HTTP {code}: {detail}")
        self.code = code


class KafkaUnreachable(Exception):
    """No broker answered within the time given."""


@dataclass(frozen=True)
class Probe:
    """What to ask and how long each question may take."""

    settings: Settings
    workers: tuple[str, ...]
    timeout: float


# ------------------------------------------------------------------------------------------
# Kafka: brokers, topics, offsets, groups, the newest verdict
# ------------------------------------------------------------------------------------------


async def kafka_report(
    bootstrap: str,
    topics: Topics,
    timeout: float,
    *,
    security: KafkaSecurity = PLAINTEXT,
    replication: ReplicationPolicy = FOLLOW_CLUSTER,
) -> dict[str, Any]:
    """Everything status reads from Kafka; raises KafkaUnreachable after ``timeout`` seconds
    (or at once, with the setting to look at, when the cluster refuses the security settings)."""
    try:
        await preflight(bootstrap, security, timeout_s=timeout)
    except ConfigError as exc:
        raise KafkaUnreachable(str(exc)) from None
    try:
        return await asyncio.wait_for(
            _kafka_report(bootstrap, topics, timeout, security=security, replication=replication),
            timeout,
        )
    except TimeoutError:
        raise KafkaUnreachable(f"no answer from {bootstrap} within {timeout:g}s") from None
    except KafkaUnreachable:
        raise
    except Exception as exc:
        from aiokafka.errors import KafkaConnectionError, KafkaError

        if isinstance(exc, KafkaConnectionError | KafkaError | OSError):
            raise KafkaUnreachable(f"{bootstrap}: {exc}") from None
        raise


async def _kafka_report(
    bootstrap: str,
    topics: Topics,
    timeout: float,
    *,
    security: KafkaSecurity = PLAINTEXT,
    replication: ReplicationPolicy = FOLLOW_CLUSTER,
) -> dict[str, Any]:
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient

    request_ms = max(1000, int(timeout * 1000))
    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap, request_timeout_ms=request_ms, **security.client_kwargs()
    )
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        request_timeout_ms=request_ms,
        **security.client_kwargs(),
    )
    try:
        await admin.start()
        cluster = await admin.describe_cluster()
        names = [spec.name for spec in topics.specs()]
        # the counters' changelogs of every generation: their state, replicated like the ledger
        changelogs = sorted(
            n
            for n in await admin.list_topics()
            if n.startswith(f"{topics.prefix}spendbus-aggregator") and n.endswith("-changelog")
        )
        described = {t["topic"]: t for t in await admin.describe_topics(names)}
        partitions = [
            TopicPartition(name, p["partition"])
            for name in names
            if described.get(name, {}).get("error_code") == 0
            for p in described[name]["partitions"]
        ]
        await consumer.start()
        starts = await consumer.beginning_offsets(partitions) if partitions else {}
        ends = await consumer.end_offsets(partitions) if partitions else {}
        groups = await _groups(admin, set(names), starts, ends, counting=topics.enforcer_group)
        newest = await _newest_verdict(consumer, topics.budget_verdicts, starts, ends)
    finally:
        with contextlib.suppress(Exception):
            await consumer.stop()
        with contextlib.suppress(Exception):
            await admin.close()

    topic_rows = []
    for name in names:
        tps = [tp for tp in partitions if tp.topic == name]
        topic_rows.append(
            {
                "name": name,
                "exists": bool(tps),
                "partitions": len(tps),
                "records": sum(ends[tp] - starts[tp] for tp in tps),
            }
        )
    by_name = {row["name"]: row for row in topic_rows}
    return {
        "replication": await _replication(bootstrap, names + changelogs, security, replication),
        "cluster_id": cluster.get("cluster_id"),
        "controller_id": cluster.get("controller_id"),
        "brokers": sorted(
            (
                {"node_id": b["node_id"], "host": b["host"], "port": b["port"]}
                for b in cluster.get("brokers", [])
            ),
            key=lambda b: b["node_id"],
        ),
        "topics": topic_rows,
        "consumer_groups": groups,
        "verdicts": {
            "topic": topics.budget_verdicts,
            "records": by_name[topics.budget_verdicts]["records"],
            **newest,
        },
        "dlq": {"topic": topics.usage_dlq, "letters": by_name[topics.usage_dlq]["records"]},
    }


async def _groups(
    admin: Any,
    ours: set[str],
    starts: dict[Any, int],
    ends: dict[Any, int],
    *,
    counting: str | None = None,
) -> list[dict[str, Any]]:
    """Groups that subscribe to or committed offsets on ``ours``: members and lag per topic.
    ``counting``: the enforcers' group, whose members count themselves and read nothing
    (no lag: ``enforcer/membership.py``)."""
    listed = sorted({g[0] for g in await admin.list_consumer_groups()})
    views = await asyncio.gather(*(_group_if_allowed(admin, g) for g in listed))
    groups = []
    for group, view in zip(listed, views, strict=True):
        if view is None:
            continue
        described, committed = view
        mine = {tp: meta.offset for tp, meta in committed.items() if tp.topic in ours}
        subscribed = described.pop("subscribed") & ours
        if not mine and not subscribed:
            continue
        if group == counting:
            groups.append(
                {"group": group, "lag": 0, "topics": [], "counts_enforcers": True, **described}
            )
            continue
        per_topic = []
        for topic in sorted({tp.topic for tp in mine} | subscribed):
            done = end = 0
            for tp in (tp for tp in ends if tp.topic == topic):
                # no commit yet on a partition: its records from the start are unread
                position = mine.get(tp, -1)
                position = starts[tp] if position < 0 else position
                done += position
                end += ends[tp]
            per_topic.append({"topic": topic, "committed": done, "end": end, "lag": end - done})
        groups.append(
            {
                "group": group,
                "lag": sum(t["lag"] for t in per_topic),
                "topics": per_topic,
                **described,
            }
        )
    return groups


async def _group_if_allowed(admin: Any, group: str) -> tuple[dict[str, Any], Any] | None:
    """(members, committed offsets) of a group; None for a group this principal may not
    describe (another stack's, on a shared cluster with ACLs: not ours to report)."""
    from aiokafka.errors import GroupAuthorizationFailedError

    try:
        return await _members(admin, group), await admin.list_consumer_group_offsets(group)
    except GroupAuthorizationFailedError:
        return None


async def _members(admin: Any, group: str) -> dict[str, Any]:
    """State, members and subscribed topics of a classic consumer group (DescribeGroups)."""
    from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata

    state, clients, subscribed = "unknown", [], set()
    for response in await admin.describe_consumer_groups([group]):
        for described in response.to_object()["groups"]:
            if described["group"] != group:
                continue
            state = described["state"]
            for member in described["members"]:
                clients.append(f"{member['client_id']}@{member['client_host']}")
                with contextlib.suppress(Exception):  # a protocol other than "consumer"
                    metadata = ConsumerProtocolMemberMetadata.decode(member["member_metadata"])
                    subscribed.update(metadata.subscription)
    return {
        "state": state,
        "members": len(clients),
        "clients": sorted(clients),
        "subscribed": subscribed,
    }


async def _newest_verdict(
    consumer: Any, topic: str, starts: dict[Any, int], ends: dict[Any, int]
) -> dict[str, Any]:
    """The newest verdict: the last record of each partition, the latest ``emitted_at``."""
    last = [tp for tp in ends if tp.topic == topic and ends[tp] > starts[tp]]
    newest: dict[str, Any] | None = None
    if last:
        consumer.assign(last)
        for tp in last:
            consumer.seek(tp, ends[tp] - 1)
        pending = set(last)
        while pending:
            batches = await consumer.getmany(*pending, timeout_ms=1000)
            for messages in batches.values():
                for message in messages:
                    newest = _later(newest, message)
            for tp in list(pending):
                if await consumer.position(tp) >= ends[tp]:
                    pending.discard(tp)
    if newest is None:
        return {"newest_emitted_at": None, "newest_as_of": None, "age_seconds": None}
    emitted, as_of = newest["emitted_at"], newest["as_of"]
    return {
        "newest_emitted_at": emitted.isoformat(),
        "newest_as_of": as_of.isoformat(),
        "age_seconds": round(max(0.0, (datetime.now(UTC) - emitted).total_seconds()), 3),
    }


async def _replication(
    bootstrap: str, names: list[str], security: KafkaSecurity, policy: ReplicationPolicy
) -> dict[str, Any]:
    try:
        plan, under = await replication_report(
            bootstrap, names, security=security, replication=policy
        )
    except ConfigError as exc:  # the settings ask what this cluster cannot hold
        return {"error": str(exc), "under_replicated": []}
    return {
        "replication_factor": plan.replication_factor,
        "min_insync_replicas": plan.min_insync_replicas,
        "brokers": plan.brokers,
        "error": None,
        "under_replicated": [p.model_dump() for p in under],
    }


def _later(newest: dict[str, Any] | None, message: Any) -> dict[str, Any] | None:
    try:
        verdict = VERDICT.decode(message.value)
    except Exception:  # a record status cannot read says nothing about freshness
        return newest
    if newest is None or verdict["emitted_at"] > newest["emitted_at"]:
        return verdict  # type: ignore[no-any-return]
    return newest


# ------------------------------------------------------------------------------------------
# Workers and ClickHouse
# ------------------------------------------------------------------------------------------


def _http_json(url: str, body: Any, timeout: float, token: str | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    auth = {} if token is None else {"authorization": f"Bearer {token}"}
    request = urllib.request.Request(
        url,
        data=data,
        headers={"content-type": "application/json", **auth},
        method="GET" if body is None else "POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")
        with contextlib.suppress(ValueError):
            detail = json.loads(detail).get("error", detail)
        raise HttpError(exc.code, detail) from None


def worker_report(url: str, timeout: float, token: str | None = None) -> dict[str, Any]:
    """One worker's /stats page: does it answer, does it serve (own partitions, reference read)."""
    try:
        stats = _http_json(f"{url}/stats", None, timeout, token)
    except Exception as exc:
        return {"url": url, "answering": False, "serving": None, "error": _reason(exc)}
    return {
        "url": url,
        "answering": True,
        "serving": bool(stats.get("serving")),
        "assigned_partitions": stats.get("assigned_partitions"),
        "stats": stats,
        "error": None,
    }


def clickhouse_report(
    dsn: str,
    worker_url: str | None,
    timeout: float,
    worker_pid: int | None = None,
    *,
    token: str | None = None,
    access: ClickHouseAccess | None = None,
) -> dict[str, Any]:
    """Can ClickHouse answer a query? Through the worker's /sql when it owns the embedded store."""
    report: dict[str, Any] = {"dsn": redact(dsn), "reachable": None, "usage_events": None}
    query = "SELECT count() FROM usage_events"
    if dsn.startswith("chdb://") and worker_url is not None:
        report["via"] = "worker"
        try:
            rows = _http_json(f"{worker_url}/sql", {"sql": query}, timeout, token)["rows"]
        except HttpError as exc:
            if exc.code == 401:  # the token sent is not the worker's: the store is not asked
                report.update(
                    reachable=None,
                    error=f"the worker's /sql refused the web token ({exc}); "
                    "SPENDBUS_WEB_TOKEN_FILE names the worker's token file",
                )
                return report
            if exc.code != 404:  # the store answered; the query failed (a missing table)
                report.update(reachable=True, error=str(exc))
                return report
            # a worker without a sink (--no-sink) leaves the store to whoever opens it
        except Exception as exc:
            report.update(reachable=False, error=f"the worker's /sql: {_reason(exc)}")
            return report
        else:
            report.update(reachable=True, usage_events=int(rows[0][0]), error=None)
            return report
    report["via"] = "direct"
    path = urlparse(dsn).path if dsn.startswith("chdb://") else None
    if path is not None and worker_pid is not None:
        # never a second engine on a path a live worker owns (chdb does not always lock it)
        report.update(
            reachable=False,
            error=f"the worker (pid {worker_pid}) owns the store and its web page did not answer",
        )
        return report
    if path is not None and not Path(path).is_dir():
        report.update(reachable=False, error=f"no embedded store at {path} yet")
        return report
    try:
        count = _bounded(lambda: _count_direct(dsn, query, access), timeout)
    except Exception as exc:
        report.update(reachable=False, error=_reason(exc))
        return report
    report.update(reachable=True, usage_events=count, error=None)
    return report


def _count_direct(dsn: str, query: str, access: ClickHouseAccess | None) -> int:
    from aggregator.sink import open_client, run_query

    _, rows = run_query(open_client(dsn, access=access), query)
    return int(rows[0][0])


def _bounded(call: Callable[[], T], timeout: float) -> T:
    """``call()`` in a daemon thread, given up after ``timeout`` (a hung connect cannot hold exit)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"no answer within {timeout:g}s")
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


def _reason(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.URLError):
        return f"unreachable ({exc.reason})"
    if isinstance(exc, TimeoutError):
        return str(exc) or "timed out"
    return str(exc) or type(exc).__name__


#: the DSN with its password shown as *** (the one helper: aggregator/clickhouse_access.py)
redact = redact_dsn


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
            settings.dsn,
            answering,
            probe.timeout,
            report["worker"]["pid"],
            token=token,
            access=access,
        )

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
            for key in ("topics", "consumer_groups", "verdicts", "dlq", "replication"):
                report[key] = seen[key]
    if kafka_failed is not None:
        report["kafka"]["error"] = kafka_failed
        report.update(topics=[], consumer_groups=[], verdicts=None, dlq=None, replication=None)
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
    for group in report["consumer_groups"]:
        if group["lag"] and not group["members"]:
            found.append(f"group {group['group']}: {group['lag']:,} records waiting, no member")
    raw_lag = sum(
        t["lag"]
        for g in report["consumer_groups"]
        for t in g["topics"]
        if t["topic"] == topics.usage_raw
    )
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
        + (f"  ({escape(kafka['security'])})" if kafka["security"] != "PLAINTEXT" else ""),
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
            for i, t in enumerate(g["topics"]):
                groups.add_row(
                    g["group"] if i == 0 else "",
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
