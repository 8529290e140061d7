"""ClickHouse over HTTPS: the CA file, verification and the password reach the client, and
the password shows up nowhere.

The server is a real ClickHouse (Debian's ``clickhouse-server`` package, 18.16) behind
real TLS, with a CA and a server certificate made here. clickhouse-connect 1.12 cannot
finish its connect-time probe on a server that old (it reads a ``readonly`` column that
18.16's ``system.settings`` lacks), so these tests prove the TLS and authentication
steps, which come first: a verified handshake with the right password gets that SQL
answer from the server; the wrong CA fails the handshake; the wrong password gets the
server's 401. Running queries over HTTPS needs a current server (the docker compose
file's). The test skips when the package is not installed.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from aggregator.sink.errors import SinkRejected
from aggregator.sink.store import open_client
from runtime.clickhouse_access import ClickHouseAccess
from schemas.errors import ConfigError
from spendbus.commands.status_services import clickhouse_report
from spendbus.settings import load_settings
from spendbus.stack.broker_probe import free_port
from spendbus.stack.worker import WorkerError, WorkerProcess
from spendbus.stack.worker import _alive as worker_alive
from tests.pipeline_kit import poll

pytestmark = pytest.mark.integration

SERVER = shutil.which("clickhouse-server")
PASSWORD = "pw-that-must-never-show-4e1f"
USER = "spendbus"


@dataclass(frozen=True)
class TlsServer:
    port: int
    ca_file: Path
    other_ca_file: Path

    def dsn(self, *, password: str | None = None, host: str = "localhost") -> str:
        auth = USER if password is None else f"{USER}:{password}"
        return f"https://{auth}@{host}:{self.port}/default"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _make_certificates(folder: Path) -> None:
    """A CA, a server certificate it signs for localhost only, and an unrelated CA."""
    for ca in ("ca", "other-ca"):
        _openssl(
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-subj", f"/CN=spendbus test {ca}",
            cwd=folder,
        )  # fmt: skip
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key",
        "-out", "server.csr", "-subj", "/CN=localhost",
        cwd=folder,
    )  # fmt: skip
    (folder / "san.cnf").write_text("subjectAltName=DNS:localhost\n")
    _openssl(
        "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "2", "-out", "server.pem", "-extfile", "san.cnf",
        cwd=folder,
    )  # fmt: skip


def _write_config(folder: Path, port: int) -> Path:
    (folder / "data").mkdir()
    (folder / "tmp").mkdir()
    (folder / "users.xml").write_text(
        f"""<?xml version="1.0"?>
<yandex>
  <profiles><default></default></profiles>
  <users>
    <{USER}>
      <password>{PASSWORD}</password>
      <networks><ip>127.0.0.1</ip></networks>
      <profile>default</profile>
      <quota>default</quota>
    </{USER}>
  </users>
  <quotas><default><interval><duration>3600</duration><queries>0</queries><errors>0</errors>
    <result_rows>0</result_rows><read_rows>0</read_rows><execution_time>0</execution_time>
  </interval></default></quotas>
</yandex>
"""
    )
    config = folder / "config.xml"
    config.write_text(
        f"""<?xml version="1.0"?>
<yandex>
  <logger><level>warning</level><log>{folder}/server.log</log>
    <errorlog>{folder}/server.err.log</errorlog><console>0</console></logger>
  <https_port>{port}</https_port>
  <listen_host>127.0.0.1</listen_host>
  <openSSL><server>
    <certificateFile>{folder}/server.pem</certificateFile>
    <privateKeyFile>{folder}/server.key</privateKeyFile>
    <verificationMode>none</verificationMode>
    <loadDefaultCAFile>false</loadDefaultCAFile>
    <disableProtocols>sslv2,sslv3</disableProtocols>
  </server></openSSL>
  <max_concurrent_queries>10</max_concurrent_queries>
  <mark_cache_size>53687091</mark_cache_size>
  <path>{folder}/data/</path>
  <tmp_path>{folder}/tmp/</tmp_path>
  <users_config>{folder}/users.xml</users_config>
  <default_profile>default</default_profile>
  <default_database>default</default_database>
</yandex>
"""
    )
    return config


def _wait_for_tls(port: int, ca_file: Path, process: subprocess.Popen[bytes]) -> None:
    context = ssl.create_default_context(cafile=str(ca_file))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"clickhouse-server exited with {process.returncode}")
        try:
            with (
                socket.create_connection(("127.0.0.1", port), timeout=2) as raw,
                context.wrap_socket(raw, server_hostname="localhost"),
            ):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("clickhouse-server did not answer TLS within 60 s")


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsServer]:
    if SERVER is None:
        pytest.skip("no clickhouse-server binary (Debian: apt-get install clickhouse-server)")
    folder = tmp_path_factory.mktemp("clickhouse-tls")
    _make_certificates(folder)
    port = free_port()
    config = _write_config(folder, port)
    process = subprocess.Popen(
        [SERVER, f"--config-file={config}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    try:
        _wait_for_tls(port, folder / "ca.pem", process)
        yield TlsServer(port, folder / "ca.pem", folder / "other-ca.pem")
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _connect_error(dsn: str, access: ClickHouseAccess) -> str:
    with pytest.raises(SinkRejected) as raised:
        open_client(dsn, access=access)
    message = str(raised.value)
    assert PASSWORD not in message
    assert PASSWORD not in repr(raised.value)
    return message


# what 18.16 answers clickhouse-connect's settings probe: reached only after a verified
# handshake and an accepted password
PAST_AUTHENTICATION = "Unknown identifier: readonly"


def test_the_ca_file_and_the_password_get_through_tls(tls_server: TlsServer) -> None:
    access = ClickHouseAccess(ca_file=tls_server.ca_file, password=SecretStr(PASSWORD))
    message = _connect_error(tls_server.dsn(), access)
    assert PAST_AUTHENTICATION in message
    # the password may also sit in the DSN (then it is redacted in every message)
    message = _connect_error(
        tls_server.dsn(password=PASSWORD), ClickHouseAccess(ca_file=tls_server.ca_file)
    )
    assert PAST_AUTHENTICATION in message and ":***@" in message


def test_a_certificate_from_another_ca_fails_the_handshake(tls_server: TlsServer) -> None:
    for access in (
        ClickHouseAccess(ca_file=tls_server.other_ca_file, password=SecretStr(PASSWORD)),
        ClickHouseAccess(password=SecretStr(PASSWORD)),  # the system CAs do not know the test CA
    ):
        message = _connect_error(tls_server.dsn(), access)
        assert "did not verify" in message and "CLICKHOUSE_CA_FILE" in message
        assert PAST_AUTHENTICATION not in message
    # verification off (a test server only): the handshake passes without the CA
    message = _connect_error(
        tls_server.dsn(), ClickHouseAccess(verify=False, password=SecretStr(PASSWORD))
    )
    assert PAST_AUTHENTICATION in message


def test_the_host_name_is_verified(tls_server: TlsServer) -> None:
    # the certificate names localhost only: the same server asked as 127.0.0.1 is refused
    access = ClickHouseAccess(ca_file=tls_server.ca_file, password=SecretStr(PASSWORD))
    message = _connect_error(tls_server.dsn(host="127.0.0.1"), access)
    assert "did not verify" in message


def test_a_wrong_password_is_refused_and_shown_nowhere(tls_server: TlsServer) -> None:
    access = ClickHouseAccess(ca_file=tls_server.ca_file, password=SecretStr("not-" + PASSWORD))
    message = _connect_error(tls_server.dsn(), access)
    assert "Wrong password" in message
    assert "not-" + PASSWORD not in message


def test_status_reports_an_https_server_without_its_password(tls_server: TlsServer) -> None:
    report = clickhouse_report(
        tls_server.dsn(),
        None,
        timeout=30,
        access=ClickHouseAccess(ca_file=tls_server.other_ca_file, password=SecretStr(PASSWORD)),
    )
    assert report["reachable"] is False and "did not verify" in report["error"]
    assert PASSWORD not in repr(report)


def test_the_settings_read_the_password_from_a_file(tmp_path: Path) -> None:
    secret = tmp_path / "clickhouse-password"
    secret.write_text(PASSWORD + "\n")
    secret.chmod(0o600)  # a secret: private (runtime/private_files.py)
    ca_file = tmp_path / "ca.pem"
    ca_file.write_text("not read here\n")
    env = {
        "CLICKHOUSE_DSN": "https://spendbus@clickhouse.internal:8443/default",
        "CLICKHOUSE_PASSWORD_FILE": str(secret),
        "CLICKHOUSE_CA_FILE": str(ca_file),
        "CLICKHOUSE_VERIFY": "true",
    }
    settings = load_settings(env)
    access = settings.clickhouse_access
    assert access.password is not None and access.password.get_secret_value() == PASSWORD
    assert access.ca_file == ca_file and access.verify
    for shown in (repr(settings), str(settings), repr(access), settings.model_dump_json()):
        assert PASSWORD not in shown

    both = load_settings({**env, "CLICKHOUSE_PASSWORD": PASSWORD})
    with pytest.raises(ConfigError, match="both set") as raised:
        _ = both.clickhouse_access
    assert PASSWORD not in str(raised.value)
    missing = load_settings({**env, "CLICKHOUSE_PASSWORD_FILE": str(tmp_path / "nope")})
    with pytest.raises(ConfigError, match="CLICKHOUSE_PASSWORD_FILE"):
        _ = missing.clickhouse_access


def test_access_options_that_do_not_fit_the_dsn_are_refused(tmp_path: Path) -> None:
    ca_file = tmp_path / "ca.pem"
    ca_file.write_text("-----BEGIN CERTIFICATE-----\n")
    with pytest.raises(ConfigError, match="plain http://"):
        open_client("http://spendbus@127.0.0.1:9/default", access=ClickHouseAccess(ca_file=ca_file))
    with pytest.raises(ConfigError, match="keep one") as raised:
        open_client(
            f"https://spendbus:{PASSWORD}@127.0.0.1:9/default",
            access=ClickHouseAccess(password=SecretStr("other")),
        )
    assert PASSWORD not in str(raised.value)
    with pytest.raises(ConfigError, match="CLICKHOUSE_CA_FILE"):
        open_client(
            "https://spendbus@127.0.0.1:9/default",
            access=ClickHouseAccess(ca_file=tmp_path / "missing.pem"),
        )
    with pytest.raises(ValueError, match="CLICKHOUSE_CLIENT_CERT"):
        ClickHouseAccess(client_key=ca_file)


def test_a_password_in_the_dsn_stays_out_of_reprs_and_printed_dsns() -> None:
    from aggregator.config import AggregatorConfig
    from runtime.clickhouse_access import redact_dsn

    dsn = f"https://{USER}:{PASSWORD}@clickhouse.internal:8443/default"
    settings = load_settings({"CLICKHOUSE_DSN": dsn})
    config = AggregatorConfig(bootstrap="127.0.0.1:9092", clickhouse_dsn=dsn)
    for shown in (repr(settings), str(settings), repr(config), str(config), redact_dsn(dsn)):
        assert PASSWORD not in shown
    assert redact_dsn(dsn) == f"https://{USER}:***@clickhouse.internal:8443/default"
    assert settings.dsn == dsn and config.clickhouse_dsn == dsn  # still there to be used


def test_a_worker_on_an_unverified_server_stops_saying_why_never_the_password(
    tls_server: TlsServer, kafka_bootstrap: str, topics: Any, tmp_path: Path
) -> None:
    secret = tmp_path / "clickhouse-password"
    secret.write_text(PASSWORD + "\n")
    secret.chmod(0o600)  # a secret: private (runtime/private_files.py)
    port = free_port()
    worker = WorkerProcess(
        run_dir=tmp_path / "run",
        env={
            "KAFKA_BOOTSTRAP": kafka_bootstrap,
            "SPENDBUS_TOPIC_PREFIX": topics.prefix,
            "SPENDBUS_HOME": str(tmp_path),
            "SPENDBUS_WEB_PORT": str(port),
            "CLICKHOUSE_DSN": tls_server.dsn(),
            "CLICKHOUSE_PASSWORD_FILE": str(secret),
            "CLICKHOUSE_CA_FILE": str(tls_server.other_ca_file),
        },
        web_port=port,
    )
    try:
        with contextlib.suppress(WorkerError):  # it may stop before it serves
            worker.start(timeout=180)
        pid = int(worker.pid_file.read_text())
        # not retriable: the worker stops (it does not retry the same CA forever)
        assert poll(lambda: worker_alive(pid), lambda alive: not alive, 120) is False
        log = worker.log_tail(100_000)
    finally:
        worker.stop()
    assert "did not verify against CLICKHOUSE_CA_FILE" in log
    assert PASSWORD not in log
