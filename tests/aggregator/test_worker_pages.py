"""The worker's pages on a real worker, real broker and real engine (chdb): where the web
server listens, the bearer token of /sql, and the read-only guard of /sql, refusal by
refusal, with the store checked unchanged after each."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import socket
import struct
import subprocess
import sys
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from aggregator.config import AggregatorConfig
from aggregator.sink.query import EXAMPLE_QUERIES, ROLLUP_DRIFT
from ingest.publisher import PublisherConfig, UsagePublisher
from schemas.usage import new_usage_event
from spendbus.demo import ANALYST_QUERIES
from spendbus.stack.broker_probe import free_port
from spendbus.stack.worker import WorkerProcess
from tests.pipeline_kit import Pipeline

pytestmark = pytest.mark.integration

EVENTS = 40
STORE_TABLES = (
    "SELECT name, engine FROM system.tables WHERE database = currentDatabase() ORDER BY name"
)
#: what the refused statements could change, exactly: the sink has written every event
#: (budget_state last: the verdict sink may still add rows, never remove any)
COUNTS = (
    "SELECT (SELECT count() FROM usage_events), (SELECT sum(cost_nanos) FROM usage_events), "
    "(SELECT sum(events) FROM spend_daily), (SELECT sum(events) FROM spend_hourly), "
    "(SELECT count() FROM budget_state)"
)


def request(
    port: int,
    path: str,
    body: bytes | None = None,
    token: str | None = None,
    host: str = "127.0.0.1",
) -> tuple[int, Any]:
    """(status, decoded body) of one request; JSON bodies decoded, others as text."""
    headers = {"content-type": "application/json"}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    req = urllib.request.Request(
        f"http://{host}:{port}{path}",
        data=body,
        headers=headers,
        method="GET" if body is None else "POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as response:
            status, raw, kind = response.status, response.read(), response.headers["content-type"]
    except urllib.error.HTTPError as exc:
        status, raw, kind = exc.code, exc.read(), exc.headers["content-type"] or ""
    return status, json.loads(raw) if "json" in kind else raw.decode()


def sql(pipeline: Pipeline, query: str, token: str | None) -> tuple[int, Any]:
    return request(pipeline.worker.web_port, "/sql", json.dumps({"sql": query}).encode(), token)


def token_of(pipeline: Pipeline) -> str:
    assert pipeline.worker.token_file is not None
    return pipeline.worker.token_file.read_text().strip()


def publish(pipeline: Pipeline, spool: Path) -> None:
    async def run() -> None:
        config = PublisherConfig(
            bootstrap=pipeline.bootstrap, topic_prefix=pipeline.topics.prefix, spool_dir=spool
        )
        async with UsagePublisher(config) as publisher:
            for i in range(EVENTS):
                await publisher.publish(
                    new_usage_event(
                        provider="anthropic",
                        api="anthropic-messages",
                        model="claude-sonnet-4-5",
                        secret_id=f"sk-{i % 3}",
                        org_id="acme",
                        gateway_id="pages",
                        input_tokens=100 + i,
                        output_tokens=10,
                        occurred_at=datetime.now(UTC),
                    )
                )
            await publisher.flush()

    asyncio.run(run())


def test_the_token_file_is_private_and_sql_needs_it(pipeline: Pipeline) -> None:
    token_file = pipeline.worker.token_file
    assert token_file is not None and token_file.exists()
    assert token_file.stat().st_mode & 0o777 == 0o600
    token = token_of(pipeline)
    assert len(token) >= 40

    before = sql(pipeline, STORE_TABLES, token)
    assert before[0] == 200
    for given in (None, "wrong", token + "x", ""):
        status, body = sql(pipeline, "CREATE TABLE pwned (a Int8) ENGINE = Memory", given)
        assert status == 401, body
        assert body["refused"] == "unauthorized"
        status, body = sql(pipeline, "SELECT count() FROM usage_events", given)
        assert status == 401
    assert sql(pipeline, STORE_TABLES, token) == before
    # the token never comes back in an answer or the log
    assert token not in json.dumps(before[1])
    assert token not in pipeline.worker.log_tail(10_000)

    # /stats and /metrics stay open on loopback
    status, stats = request(pipeline.worker.web_port, "/stats")
    assert status == 200 and stats["serving"]
    status, metrics = request(pipeline.worker.web_port, "/metrics")
    assert status == 200 and "spendbus_aggregator" in metrics
    # Faust's own pages are off
    assert request(pipeline.worker.web_port, "/table/")[0] == 404
    assert request(pipeline.worker.web_port, "/router/")[0] == 404


#: more table functions that reach files, hosts, processes or other stores (in a subquery)
OUTSIDE_TABLE_FUNCTIONS = [
    "remoteSecure",
    "s3Cluster",
    "hdfs",
    "mysql",
    "postgresql",
    "jdbc",
    "odbc",
    "azureBlobStorage",
    "cluster",
    "merge",
    "sqlite",
    "iceberg",
    "deltaLake",
    "mongodb",
    "redis",
    "python",
    "fileCluster",
    "urlCluster",
    "dictionary",
]

REFUSED = [
    # (what, query, reason)
    (
        "file table function",
        "SELECT * FROM file('{secret}', 'LineAsString')",
        "table_function",
    ),
    ("scalar file()", "SELECT file('{secret}')", "function"),
    ("scalar file() upper case", "SELECT FILE('{secret}')", "function"),
    (
        "url() in an IN subquery",
        "SELECT count() FROM usage_events WHERE org_id IN "
        "(SELECT * FROM url('http://127.0.0.1:9/x', 'CSV', 'a String'))",
        "table_function",
    ),
    (
        "s3() in a CTE",
        "WITH x AS (SELECT * FROM s3('http://127.0.0.1:9/b/k', 'CSV', 'a String')) SELECT * FROM x",
        "table_function",
    ),
    (
        "remote() in a JOIN",
        "SELECT * FROM usage_events AS u JOIN remote('127.0.0.1:9', system.one) AS r ON 1",
        "table_function",
    ),
    (
        "file() in a scalar subquery",
        "SELECT (SELECT file('{secret}')) AS h",
        "function",
    ),
    (
        "executable()",
        "SELECT * FROM executable('id', 'TSV', 'a String')",
        "table_function",
    ),
    ("input()", "SELECT * FROM input('a String')", "table_function"),
    (
        "file() as a view's parameter",
        "SELECT * FROM budget_history_of(budget_id = file('{secret}'))",
        "function",
    ),
    ("APPLY(file)", "SELECT * APPLY(file) FROM (SELECT '{secret}' AS x)", "syntax"),
    ("a dictionary", "SELECT dictGet('d', 'a', toUInt64(1))", "function"),
    ("an AI function", "SELECT aiGenerate('hello')", "function"),
    ("sleep()", "SELECT sleep(3)", "function"),
    ("CREATE TABLE", "CREATE TABLE pwned (a Int8) ENGINE = Memory", "statement"),
    (
        "CREATE TABLE with a File engine",
        "CREATE TABLE f (a String) ENGINE = File(CSV)",
        "statement",
    ),
    ("DROP TABLE", "DROP TABLE usage_events", "statement"),
    ("ALTER TABLE", "ALTER TABLE usage_events DELETE WHERE 1", "statement"),
    ("TRUNCATE", "TRUNCATE TABLE usage_events", "statement"),
    ("INSERT", "INSERT INTO usage_events SELECT * FROM usage_events", "statement"),
    ("SET", "SET readonly = 0", "statement"),
    ("SETTINGS readonly=0", "SELECT count() FROM usage_events SETTINGS readonly = 0", "settings"),
    ("SETTINGS in a subquery", "SELECT * FROM (SELECT 1 SETTINGS max_threads = 1)", "settings"),
    ("two statements", "SELECT 1; DROP TABLE usage_events", "multiple_statements"),
    (
        "two statements, a comment between",
        "SELECT 1 /* ; */ ; TRUNCATE budget_state",
        "multiple_statements",
    ),
    ("FORMAT", "SELECT 1 FORMAT JSONEachRow", "format"),
    ("SHOW TABLES FORMAT", "SHOW TABLES FORMAT CSV", "format"),
    (
        "an alias that prints a node of its own",
        "SELECT 'x' AS `a\n      Function file (children 1)`",
        "unreadable",
    ),
    # what the engine reads as two statements, and a scanner of our own read as one
    (
        "a second statement after a # comment",
        "SELECT 1 # ;\n; SELECT file('{secret}')",
        "multiple_statements",
    ),
    (
        "a second statement after a $$ string",
        "SELECT $$;$$; SELECT 1 INTO OUTFILE '{victim}' APPEND",
        "multiple_statements",
    ),
    (
        "a second statement after a $tag$ string",
        "SELECT $t$ ' $t$; SELECT 1 INTO OUTFILE '{victim}' TRUNCATE",
        "multiple_statements",
    ),
    # INTO OUTFILE on every statement kind, and in each of its modes
    ("SHOW TABLES INTO OUTFILE", "SHOW TABLES INTO OUTFILE '{victim}' TRUNCATE", "into_outfile"),
    (
        "DESCRIBE INTO OUTFILE",
        "DESCRIBE (SELECT 1) INTO OUTFILE '{victim}' TRUNCATE",
        "into_outfile",
    ),
    ("INTO OUTFILE APPEND", "SELECT 'x' INTO OUTFILE '{victim}' APPEND", "into_outfile"),
    ("INTO OUTFILE AND STDOUT", "SELECT 1 INTO OUTFILE '{victim}' AND STDOUT", "into_outfile"),
    ("EXPLAIN", "EXPLAIN SELECT 1", "statement"),
    *(
        (f"{name}()", f"SELECT * FROM (SELECT * FROM {name}('x', 'y'))", "table_function")
        for name in OUTSIDE_TABLE_FUNCTIONS
    ),
]


def test_every_refusal_leaves_the_store_as_it_was(pipeline: Pipeline, tmp_path: Path) -> None:
    publish(pipeline, tmp_path / "spool")
    token = token_of(pipeline)
    rows = pipeline.sql_until(COUNTS, lambda rows: int(rows[0][2] or 0) >= EVENTS)
    assert [int(rows[0][0]), int(rows[0][2]), int(rows[0][3])] == [EVENTS] * 3
    tables = sql(pipeline, STORE_TABLES, token)
    assert tables[0] == 200 and ["usage_events", "MergeTree"] in tables[1]["rows"]

    def unchanged(what: str) -> None:
        now = pipeline.sql(COUNTS)[0]
        assert now[:4] == rows[0][:4], what
        assert int(now[4]) >= int(rows[0][4]), what
        assert sql(pipeline, STORE_TABLES, token) == tables, what

    secret = tmp_path / "secret.txt"
    marker = f"not-for-analysts-{os.getpid()}"
    secret.write_text(marker)
    outfile = tmp_path / "stolen.csv"
    victim = tmp_path / "victim.sh"
    victim.write_text("#!/bin/sh\necho untouched\n")
    cases = [*REFUSED, ("INTO OUTFILE", f"SELECT 1 INTO OUTFILE '{outfile}'", "into_outfile")]
    answers = []
    for what, template, reason in cases:
        query = template.replace("{secret}", str(secret)).replace("{victim}", str(victim))
        status, body = sql(pipeline, query, token)
        answers.append(body)
        assert status == 403, (what, status, body)
        assert body["refused"] == reason, (what, body)
        assert body["error"], what
        unchanged(what)
    assert not outfile.exists()
    assert victim.read_text() == "#!/bin/sh\necho untouched\n"
    assert marker not in json.dumps(answers)

    # bodies that are not a query: 400, nothing runs
    port = pipeline.worker.web_port
    for raw in (b"not json", b'{"sql": 5}', b'["SELECT 1"]', b'{"sql": ""}', b'{"sql": " ; "}'):
        status, body = request(port, "/sql", raw, token)
        assert status == 400, (raw, body)
    # an answer past the session's limits (READ_ONLY_SESSION): 400, named
    status, body = sql(pipeline, "SELECT number FROM numbers(200000)", token)
    assert status == 400 and body["refused"] == "limit", body
    assert "max_result_rows" in body["error"]
    # a cancelled endless query leaves nothing behind for the next one (chdb can hand the
    # rest of its rows to the next query on the same connection: about 1 time in 10)
    for _ in range(10):
        assert sql(pipeline, "SELECT 1 AS one", token)[0] == 200
        status, body = sql(pipeline, "SELECT * FROM system.numbers", token)
        assert status == 400 and body["refused"] == "limit", body
        assert sql(pipeline, "SELECT count() FROM usage_events", token) == (
            200,
            {"columns": ["count()"], "rows": [[EVENTS]]},
        )
    # the analyst's own mistake: 400 with the engine's reason
    status, body = sql(pipeline, "SELECT no_such_column FROM usage_events", token)
    assert status == 400 and "no_such_column" in body["error"]
    unchanged("after the bad bodies")


def test_the_documented_queries_still_run(pipeline: Pipeline, tmp_path: Path) -> None:
    publish(pipeline, tmp_path / "spool")
    pipeline.sql_until(COUNTS, lambda rows: int(rows[0][0]) >= EVENTS)
    token = token_of(pipeline)
    queries = {
        **EXAMPLE_QUERIES,
        "rollup_drift": ROLLUP_DRIFT,
        **ANALYST_QUERIES,
        "with, join, window, lambda, combinators": (
            "WITH s AS (SELECT secret_id, sum(cost_nanos) AS nanos FROM usage_events "
            "GROUP BY secret_id) "
            "SELECT u.secret_id, any(s.nanos), countIf(u.output_tokens > 5), "
            "arrayMap(x -> x + 1, [1, 2]), row_number() OVER (ORDER BY u.secret_id), "
            "toDecimal128(1, 9) / 3, formatReadableSize(1024), CAST(1 AS String), 1::UInt8 "
            "FROM usage_events AS u JOIN s ON u.secret_id = s.secret_id "
            "WHERE u.org_id IN (SELECT org_id FROM usage_events) "
            "GROUP BY u.secret_id ORDER BY u.secret_id"
        ),
        "numbers": "SELECT number FROM numbers(3) UNION ALL SELECT 7",
        "a parameterized view of the schema": (
            "SELECT period, spent_nanos FROM budget_history_of(budget_id = 'b') ORDER BY period"
        ),
        "describe": "DESCRIBE TABLE usage_events",
        "show tables": "SHOW TABLES",
    }
    for name, query in queries.items():
        status, body = sql(pipeline, query, token)
        assert status == 200, (name, body)
        assert body["columns"], name
    status, body = sql(pipeline, "SELECT count() FROM usage_events", token)
    assert body["rows"] == [[EVENTS]]
    status, body = sql(pipeline, queries["with, join, window, lambda, combinators"], token)
    assert [row[0] for row in body["rows"]] == ["sk-0", "sk-1", "sk-2"]


def non_loopback_addresses() -> list[str]:
    """This machine's own IPv4 addresses other than loopback (SIOCGIFADDR per interface)."""
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(
                    probe.fileno(), 0x8915, struct.pack("256s", name.encode()[:15])
                )
            except OSError:  # no IPv4 address on this interface
                continue
            address = socket.inet_ntoa(packed[20:24])
            if not address.startswith("127."):
                found.append(address)
    return found


def listening_addresses(port: int) -> set[str]:
    """The local addresses of the sockets listening on ``port`` (/proc/net/tcp{,6})."""
    found = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A = LISTEN
                raw = bytes.fromhex(address)
                if width == 8:
                    found.add(socket.inet_ntop(socket.AF_INET, raw[::-1]))
                else:
                    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                    found.add(socket.inet_ntop(socket.AF_INET6, words))
    return found


def test_the_worker_listens_on_loopback_only_by_default(pipeline: Pipeline) -> None:
    port = pipeline.worker.web_port
    assert listening_addresses(port) == {"127.0.0.1"}
    for address in non_loopback_addresses():  # this machine's own interface
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((address, port), timeout=5).close()


def test_a_non_loopback_bind_without_a_token_is_refused(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="without a token"):
        AggregatorConfig(bootstrap=kafka_bootstrap, web_host="0.0.0.0")
    port = free_port()
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP": kafka_bootstrap,
        "SPENDBUS_HOME": str(tmp_path),
        "SPENDBUS_WEB_HOST": "0.0.0.0",
        "SPENDBUS_WEB_PORT": str(port),
        "CLICKHOUSE_DSN": f"chdb://{tmp_path / 'clickhouse'}",
    }
    for name in ("SPENDBUS_WEB_TOKEN", "SPENDBUS_WEB_TOKEN_FILE"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-m", "spendbus", "aggregator", "run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "SPENDBUS_WEB_TOKEN_FILE" in done.stderr + done.stdout
    assert "0.0.0.0" in done.stderr + done.stdout
    assert not (tmp_path / "web.token").exists()  # never made up off loopback
    assert listening_addresses(port) == set()


def test_off_loopback_every_page_needs_the_token(
    kafka_bootstrap: str, topics: Any, tmp_path: Path, clickhouse_dsn: str
) -> None:
    token_file = tmp_path / "secrets" / "web-token"
    token_file.parent.mkdir()
    token_file.write_text("a-configured-token-of-this-deployment\n")
    token_file.chmod(0o600)  # a secret: private (runtime/private_files.py)
    port = free_port()
    worker = WorkerProcess(
        run_dir=tmp_path / "run",
        env={
            "KAFKA_BOOTSTRAP": kafka_bootstrap,
            "CLICKHOUSE_DSN": clickhouse_dsn,
            "SPENDBUS_TOPIC_PREFIX": topics.prefix,
            "SPENDBUS_HOME": str(tmp_path),
            "SPENDBUS_WEB_HOST": "0.0.0.0",
            "SPENDBUS_WEB_PORT": str(port),
            "SPENDBUS_WEB_TOKEN_FILE": str(token_file),
        },
        web_port=port,
        web_host="0.0.0.0",
    )
    worker.start(timeout=180)  # its readiness probe sends the token: /stats needs it here
    try:
        assert listening_addresses(port) == {"0.0.0.0"}
        token = "a-configured-token-of-this-deployment"
        for path in ("/stats", "/metrics"):
            assert request(port, path)[0] == 401
            assert request(port, path, token="nope")[0] == 401
            assert request(port, path, token=token)[0] == 200
        query = json.dumps({"sql": "SELECT count() FROM usage_events"}).encode()
        assert request(port, "/sql", query)[0] == 401
        assert request(port, "/sql", query, token=token) == (
            200,
            {"columns": ["count()"], "rows": [[0]]},
        )
        assert worker.post("/sql", {"sql": "SELECT 1 AS one"})["rows"] == [[1]]
        assert not (tmp_path / "web.token").exists()
        assert token not in worker.log_tail(10_000)
    finally:
        worker.stop()


def test_a_body_nested_too_deeply_is_400_not_500(pipeline: Pipeline) -> None:
    """Issue 21: json.loads raised RecursionError, which the page answered with a 500."""
    for body in (b"[" * 200_000, b'{"sql":' * 100_000):
        status, answer = request(pipeline.worker.web_port, "/sql", body, token_of(pipeline))
        assert status == 400, answer
        assert "must be JSON" in answer["error"]
    assert sql(pipeline, "SELECT 1", token_of(pipeline))[0] == 200
