"""The embedded engine's process (aggregator/sink/engine_host.py, engine_link.py): the
second wall of /sql, tested without the first.

Every statement here goes to the engine directly, as if the guard had let it through:
the process still cannot read a file outside the store, write one anywhere but the
store, or hold a query past its limit (it is killed, and the next call starts it again),
and the sink's inserts go on beside an analyst's query. The worker's /sql through it:
tests/aggregator/test_worker_pages.py (the engine process is the worker's default).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import cast

import pytest
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import DatabaseError

from aggregator.sink.engine_link import EngineKilled, EngineLink
from aggregator.sink.errors import QueryRefused
from aggregator.sink.guard import READ_ONLY_SESSION, QueryGuard
from aggregator.sink.landlock import abi_version

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(abi_version() < 1, reason="the kernel has no Landlock"),
]

SECRET = "not-for-the-engine"


@pytest.fixture
def link(tmp_path: Path) -> Iterator[EngineLink]:
    store = tmp_path / "store"
    spool = tmp_path / "spool"
    spool.mkdir()
    engine = EngineLink(f"chdb://{store}", str(store), str(spool), kill_grace=1.0)
    yield engine
    engine.close()


@pytest.fixture
def outside(tmp_path: Path) -> dict[str, Path]:
    """Files beside the store, as keys.secret and a script beside $SPENDBUS_HOME's store."""
    secret = tmp_path / "keys.secret"
    secret.write_text(SECRET)
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\necho untouched\n")
    return {"secret": secret, "script": script, "new": tmp_path / "dropped.csv"}


def guard_on(link: EngineLink) -> QueryGuard:
    """/sql's guard on the engine's process, as ClickHouseWriter makes it."""
    return QueryGuard(lambda: cast(Client, link.client(**READ_ONLY_SESSION)))


def refused_by_the_kernel(link: EngineLink, statement: str) -> str:
    client = link.client()  # not even read-only: the kernel refuses, not the engine
    with pytest.raises(DatabaseError) as raised:
        client.query(statement)
    return str(raised.value)


def test_no_file_outside_the_store_can_be_read(link: EngineLink, outside: dict[str, Path]) -> None:
    secret = outside["secret"]
    for statement in (
        f"SELECT file('{secret}')",
        f"SELECT * FROM file('{secret}', 'LineAsString')",
        "SELECT file('/proc/self/environ')",
        "SELECT * FROM file('/etc/passwd', 'LineAsString')",
    ):
        message = refused_by_the_kernel(link, statement)
        assert "Permission denied" in message, (statement, message)
        assert SECRET not in message
    assert link.landlock_abi >= 1


def test_no_file_outside_the_store_can_be_written(
    link: EngineLink, outside: dict[str, Path]
) -> None:
    writer = link.client()
    for statement in (
        f"SELECT 1 INTO OUTFILE '{outside['script']}' APPEND",
        f"SELECT 1 INTO OUTFILE '{outside['script']}' TRUNCATE",
        f"SHOW TABLES INTO OUTFILE '{outside['new']}'",
        f"INSERT INTO FUNCTION file('{outside['new']}', 'CSV', 'a UInt8') VALUES (1)",
    ):
        with pytest.raises(DatabaseError) as raised:
            writer.command(statement)
        assert "Permission denied" in str(raised.value) or "Cannot open" in str(raised.value)
    assert outside["script"].read_text() == "#!/bin/sh\necho untouched\n"
    assert not outside["new"].exists()


def test_the_engines_environment_holds_no_secret(
    link: EngineLink, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAFKA_SASL_PASSWORD", SECRET)
    monkeypatch.setenv("SPENDBUS_WEB_TOKEN", SECRET)
    assert link.client().query("SELECT 1").result_rows == [(1,)]
    assert link.pid is not None
    environment = Path(f"/proc/{link.pid}/environ").read_bytes()
    assert SECRET.encode() not in environment


def test_a_query_past_its_limit_is_killed_and_the_next_call_starts_again(
    link: EngineLink,
) -> None:
    writer = link.client()
    writer.command("CREATE TABLE t (x UInt64) ENGINE = MergeTree ORDER BY x")
    first = link.pid
    # a query the engine does not stop at the session's limit (here it was told a longer
    # one, as a query outliving the engine's own check would): the process is killed
    stuck = link.client(max_execution_time=1)
    with pytest.raises(EngineKilled) as raised:
        stuck.query("SELECT sleep(3) SETTINGS max_execution_time = 10")
    assert "max_execution_time=1" in str(raised.value)
    assert link.kills == 1
    writer.insert("t", [[1], [2]], column_names=["x"])
    assert writer.query("SELECT sum(x) FROM t").result_rows == [(3,)]
    assert link.starts == 2 and link.pid not in (None, first)


def test_the_sink_writes_beside_an_analyst_query(link: EngineLink) -> None:
    writer = link.client()
    writer.command("CREATE TABLE t (x UInt64) ENGINE = MergeTree ORDER BY x")
    analyst = link.client(**READ_ONLY_SESSION)
    answered: Future[object] = Future()

    def long_query() -> None:
        try:
            answered.set_result(
                analyst.query("SELECT sum(sleepEachRow(0.5)) FROM numbers(4)").result_rows
            )
        except Exception as exc:  # the answer or the error: either ends the wait
            answered.set_exception(exc)

    started = threading.Thread(target=long_query)
    started.start()
    try:
        while not answered.done():
            processes = writer.query(
                "SELECT count() FROM system.processes WHERE query LIKE '%sleepEachRow%' "
                "AND query NOT LIKE '%system.processes%'"
            ).result_rows
            if processes[0][0]:
                break
        assert not answered.done(), "the analyst query ended before it was seen running"
        writer.insert("t", [[5]], column_names=["x"])
        assert writer.query("SELECT sum(x) FROM t").result_rows == [(5,)]
        assert not answered.done()  # stored while the analyst's query still ran
    finally:
        started.join()
    assert answered.result() == [(0,)]


def test_a_query_past_its_memory_bound_is_refused_and_the_engine_lives_on(
    link: EngineLink,
) -> None:
    guard = guard_on(link)
    with pytest.raises(QueryRefused) as raised:
        guard.run("SELECT length(groupArray(number)) FROM numbers_mt(2000000000)")
    assert raised.value.reason == "limit"
    assert guard.run("SELECT 1 AS one") == (["one"], [(1,)])
    assert link.kills == 0


def test_the_guard_on_the_engine_refuses_what_the_wall_would_stop_too(
    link: EngineLink, outside: dict[str, Path]
) -> None:
    guard = guard_on(link)
    hidden = f"SELECT 1 # ;\n; SELECT 1 INTO OUTFILE '{outside['script']}' APPEND"
    with pytest.raises(QueryRefused) as raised:
        guard.run(hidden)
    assert raised.value.reason == "multiple_statements"
    assert outside["script"].read_text() == "#!/bin/sh\necho untouched\n"
    assert os.stat(outside["secret"]).st_size == len(SECRET)
