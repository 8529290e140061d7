"""The worker's /sql against hostile statements: none reads, writes or truncates a file.

``SPENDBUS_FUZZ_EXAMPLES`` statements, each made of a harmless query, a separator the
engine and a naive scanner read differently (``#`` and ``--`` comments, ``/* */``,
``$$`` and ``$tag$`` strings, quotes, escapes, line breaks) and an attack (the scalar and
table ``file()`` on a secret, ``INTO OUTFILE`` on a script in each mode, on every
statement kind, ``INSERT INTO FUNCTION file``, ``url()``, ``executable()``,
``SETTINGS readonly = 0``, ``FORMAT``), are sent with the web token to a worker as
``spendbus aggregator run`` runs it (its engine in a process of its own). Then: no
answer is 500 or more, no answer holds the secret, every file the run aimed at reads
back unchanged and no file appeared beside them, and the worker still answers a query.
"""

from __future__ import annotations

import http.client
import json
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.kit import EXAMPLES, FUZZ, GUARD_S
from tests.pipeline_kit import Pipeline

pytestmark = [pytest.mark.integration, pytest.mark.fuzz, pytest.mark.timeout(GUARD_S)]

SCRIPT = "#!/bin/sh\necho untouched\n"

HARMLESS = st.sampled_from(
    [
        "SELECT 1",
        "SELECT count() FROM usage_events",
        "SHOW TABLES",
        "DESCRIBE TABLE usage_events",
        "SELECT 'a' AS x",
        "WITH 1 AS x SELECT x",
    ]
)
#: what a scanner of our own and the engine may read differently
SEPARATORS = st.sampled_from(
    [
        ";",
        " # ;\n;",
        " -- ;\n;",
        " /* ; */ ;",
        " /* /* */ ;",
        ", $$;$$;",
        ", $t$ ' ; $t$;",
        ", $a$;$b$;$a$;",
        ", 'x\\';' ;",
        ", `a;b` ;",
        ', "a;b";',
        "\n;\n",
        " ;\u00a0",
        "",
        " ",
        "#\n",
    ]
)
ATTACKS = [
    "SELECT file('{secret}')",
    "SELECT * FROM file('{secret}', 'LineAsString')",
    "SELECT file('/proc/self/environ')",
    "SELECT 1 INTO OUTFILE '{script}' APPEND",
    "SELECT 1 INTO OUTFILE '{script}' TRUNCATE",
    "SELECT 1 INTO OUTFILE '{new}'",
    "SELECT 1 INTO OUTFILE '{new}' AND STDOUT",
    "SHOW TABLES INTO OUTFILE '{script}' TRUNCATE",
    "DESCRIBE (SELECT 1) INTO OUTFILE '{script}' TRUNCATE",
    "INSERT INTO FUNCTION file('{new}', 'CSV', 'a UInt8') VALUES (1)",
    "SELECT * FROM url('http://127.0.0.1:9/x', 'CSV', 'a String')",
    "SELECT * FROM executable('id', 'TSV', 'a String')",
    "SELECT count() FROM usage_events SETTINGS readonly = 0",
    "SELECT 1 FORMAT TSV",
    "SYSTEM SHUTDOWN",
]


@st.composite
def statements(draw: st.DrawFn) -> str:
    attack = draw(st.sampled_from(ATTACKS))
    shape = draw(st.integers(0, 2))
    if shape == 0:  # the attack alone
        return attack
    harmless, separator = draw(HARMLESS), draw(SEPARATORS)
    if shape == 1:  # hidden behind a harmless query
        return f"{harmless}{separator} {attack}"
    return f"{attack}{separator} {harmless}"  # the harmless one behind it


def _post(port: int, token: str, sql: str) -> tuple[int, bytes]:
    """(status, body) of /sql for ``sql``."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request(
            "POST",
            "/sql",
            body=json.dumps({"sql": sql}),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


def test_no_hostile_statement_reaches_a_file(pipeline: Pipeline, tmp_path: Path) -> None:
    worker = pipeline.worker
    assert worker.token_file is not None
    token = worker.token_file.read_text().strip()
    targets = tmp_path / "targets"
    targets.mkdir()
    secret = targets / "keys.secret"
    marker = f"not-for-analysts-{os.getpid()}"
    secret.write_text(marker)
    script = targets / "run.sh"
    script.write_text(SCRIPT)
    new = targets / "dropped.csv"
    statuses: list[int] = []

    @FUZZ
    @given(statements())
    def one(template: str) -> None:
        sql = template.format(secret=secret, script=script, new=new)
        status, answer = _post(worker.web_port, token, sql)
        statuses.append(status)
        assert status < 500, (status, sql)
        assert marker.encode() not in answer, sql

    one()
    assert len(statuses) >= EXAMPLES
    assert sorted(p.name for p in targets.iterdir()) == ["keys.secret", "run.sh"]
    assert script.read_text() == SCRIPT and secret.read_text() == marker
    status, answer = _post(worker.web_port, token, "SELECT 1 AS one")
    assert (status, json.loads(answer)) == (200, {"columns": ["one"], "rows": [[1]]})
