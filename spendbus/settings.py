"""Settings for the command line: the one place that reads the environment.

=========================  ===============================================  ==========================
variable                   meaning                                          default
=========================  ===============================================  ==========================
SPENDBUS_HOME              local state: broker data, embedded ClickHouse,   ./.spendbus
                           worker logs and pid files
KAFKA_BOOTSTRAP            an existing Kafka cluster (host:port,...)        the local broker
CLICKHOUSE_DSN             chdb:///abs/path or http(s)://user:pw@host:8123  chdb://$SPENDBUS_HOME/clickhouse
SPENDBUS_TOPIC_PREFIX      prefix of every topic name                       (none)
SPENDBUS_PARTITIONS        partitions of the data topics, set at creation   4
SPENDBUS_WEB_PORT          the aggregator worker's web port (sql, stats)    6066
SPENDBUS_WEB_HOST          the address the worker's web server binds        127.0.0.1
SPENDBUS_ADMIN_PORT        the admin API's port (``spendbus admin serve``)  6070
SPENDBUS_WEB_TOKEN_FILE    a file holding the worker's web bearer token     $SPENDBUS_HOME/web.token
SPENDBUS_SINK_PROCESS      the worker's sink in a process of its own        false
SPENDBUS_WEB_TOKEN         the token itself (prefer the _FILE form)         (none)
SPENDBUS_WEB_BODY_TIMEOUT  seconds a /sql body may take after its head      60
SPENDBUS_SESSION_IDLE_SECONDS  a session counter idle this long is pruned  86400
SPENDBUS_PRUNE_SECONDS     how often the worker looks for counters to prune 60
SPENDBUS_KEY_SECRET_FILE   the secret virtual-key digests are keyed with    $SPENDBUS_HOME/keys.secret
SPENDBUS_KEY_SECRET        the key secret itself (prefer the _FILE form)    (none)
CLICKHOUSE_CA_FILE         https:// DSN: PEM CA(s) of the server's cert     the system CAs
CLICKHOUSE_VERIFY          https:// DSN: verify the server's certificate    true
CLICKHOUSE_CLIENT_CERT     https:// DSN, mutual TLS: the client's cert      (none)
CLICKHOUSE_CLIENT_KEY      https:// DSN, mutual TLS: the client's key       (none)
CLICKHOUSE_PASSWORD        the ClickHouse user's password (not in the DSN)  (none)
CLICKHOUSE_PASSWORD_FILE   a file holding that password (one line)          (none)
SPENDBUS_CACHE_DIR         where the Kafka broker jars are cached           ~/.cache/spendbus
KAFKA_SECURITY_PROTOCOL    PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL       PLAINTEXT
KAFKA_SASL_MECHANISM       PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512            PLAIN
KAFKA_SASL_USERNAME        the SASL user (required with SASL_*)             (none)
KAFKA_SASL_PASSWORD        its password (prefer the _FILE form)             (none)
KAFKA_SASL_PASSWORD_FILE   a file holding the password (one line)           (none)
KAFKA_SSL_CAFILE           PEM CA(s) that signed the brokers' certificates  the system CAs
KAFKA_SSL_CERTFILE         mutual TLS: the client's certificate chain       (none)
KAFKA_SSL_KEYFILE          mutual TLS: the client's private key             (none)
SPENDBUS_REPLICATION_FACTOR  replicas of each new topic                     min(3, brokers)
SPENDBUS_MIN_INSYNC_REPLICAS min.insync.replicas of each new topic          RF - 1 from RF 3, else 1
SPENDBUS_ALLOW_UNDER_REPLICATION  allow fewer replicas than the cluster has false
SPENDBUS_CONFIG            a YAML file with any of the keys below           (none)
=========================  ===============================================  ==========================

A config file uses the lower-case names without the prefix (``home``,
``kafka_bootstrap``, ``clickhouse_dsn``, ``topic_prefix``, ``partitions``,
``web_port``, ``web_host``, ``admin_port``, ``web_body_timeout_s``, ``session_idle_seconds``, ``prune_seconds``, ``sink_process``, ``engine_process``, ``cache_dir``,
``kafka_security_protocol``, ``kafka_sasl_mechanism``, ``kafka_sasl_username``,
``kafka_sasl_password``, ``kafka_sasl_password_file``,
``kafka_ssl_cafile``, ``kafka_ssl_certfile``, ``kafka_ssl_keyfile``, ``replication_factor``,
``min_insync_replicas``, ``allow_under_replication``); environment variables
win over the file. Every Kafka client of every command and stage connects with the
``KAFKA_*`` security settings (``Settings.kafka_security``); the password is held as a
secret and never printed. A password in both forms is refused: one source of truth.

The worker's web token and an https:// ClickHouse server take ``web_token``,
``web_token_file``, ``clickhouse_ca_file``, ``clickhouse_verify``,
``clickhouse_client_cert``, ``clickhouse_client_key``, ``clickhouse_password`` and
``clickhouse_password_file`` in the file too (``Settings.clickhouse_access``; the
token: ``spendbus.stack.web_token``), and so do the virtual keys' digest secret
(``key_secret``, ``key_secret_file``: ``spendbus.stack.key_secret``). Secrets are
``SecretStr``: never printed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from runtime.clickhouse_access import ClickHouseAccess
from runtime.kafka import KafkaSecurity, SaslMechanism, SecurityProtocol
from runtime.private_files import check_secret_file
from runtime.replication import ReplicationPolicy
from schemas.budgets import SESSION_IDLE_SECONDS
from schemas.errors import ConfigError
from schemas.topics import Topics


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    home: Path = Path(".spendbus")
    kafka_bootstrap: str | None = None
    #: kept out of repr: a DSN may carry a password (prefer CLICKHOUSE_PASSWORD_FILE)
    clickhouse_dsn: str | None = Field(default=None, repr=False)
    topic_prefix: str = ""
    partitions: int = Field(default=4, ge=1, le=256)
    web_port: int = Field(default=6066, ge=1, le=65535)
    web_host: str = "127.0.0.1"
    #: the admin API's port (admin/; it binds loopback only)
    admin_port: int = Field(default=6070, ge=1, le=65535)
    web_body_timeout_s: float = Field(default=60.0, gt=0)
    session_idle_seconds: float = Field(default=SESSION_IDLE_SECONDS, gt=0)
    prune_seconds: float = Field(default=60.0, gt=0)
    #: the worker's sink stage in an OS process of its own (aggregator/sink/process.py);
    #: false (the default) runs it on the worker's own event loop
    sink_process: bool = False
    #: an embedded store's engine in a process of its own, walled in and killable
    #: (aggregator/sink/engine_host.py); false: in the process that owns the store
    engine_process: bool = True
    cache_dir: Path = Path.home() / ".cache" / "spendbus"
    kafka_security_protocol: SecurityProtocol = "PLAINTEXT"
    kafka_sasl_mechanism: SaslMechanism = "PLAIN"
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    kafka_sasl_password_file: Path | None = None
    kafka_ssl_cafile: Path | None = None
    kafka_ssl_certfile: Path | None = None
    kafka_ssl_keyfile: Path | None = None
    #: the worker's web token (spendbus/stack/web_token.py): /sql always needs it, every
    #: page does when the worker binds anything but loopback
    web_token: SecretStr | None = None
    web_token_file: Path | None = None
    #: what virtual keys' digests are keyed with (spendbus/stack/key_secret.py)
    key_secret: SecretStr | None = None
    key_secret_file: Path | None = None
    clickhouse_ca_file: Path | None = None
    clickhouse_verify: bool = True
    clickhouse_client_cert: Path | None = None
    clickhouse_client_key: Path | None = None
    clickhouse_password: SecretStr | None = None
    clickhouse_password_file: Path | None = None
    #: replication of every topic spendbus creates (runtime/replication.py): None follows
    #: the cluster, min(3, brokers) and RF - 1 in sync from three replicas on
    replication_factor: int | None = Field(default=None, ge=1)
    min_insync_replicas: int | None = Field(default=None, ge=1)
    allow_under_replication: bool = False

    @property
    def replication(self) -> ReplicationPolicy:
        return ReplicationPolicy(
            replication_factor=self.replication_factor,
            min_insync_replicas=self.min_insync_replicas,
            allow_under_replication=self.allow_under_replication,
        )

    @property
    def clickhouse_access(self) -> ClickHouseAccess:
        """The TLS options and password of an https:// ClickHouse server; ConfigError
        naming the setting when unusable (a password in two places, an unreadable file)."""
        password = self.clickhouse_password
        if self.clickhouse_password_file is not None:
            if password is not None:
                raise ConfigError(
                    "CLICKHOUSE_PASSWORD and CLICKHOUSE_PASSWORD_FILE are both set: keep one"
                )
            password = SecretStr(
                _read_secret(self.clickhouse_password_file, "CLICKHOUSE_PASSWORD_FILE")
            )
        try:
            return ClickHouseAccess(
                ca_file=self.clickhouse_ca_file,
                verify=self.clickhouse_verify,
                client_cert=self.clickhouse_client_cert,
                client_key=self.clickhouse_client_key,
                password=password,
            )
        except ValueError as exc:  # pydantic's ValidationError: the validator's message
            errors = getattr(exc, "errors", None)
            message = errors()[0]["msg"].removeprefix("Value error, ") if errors else str(exc)
            raise ConfigError(f"ClickHouse settings: {message}") from None

    @property
    def kafka_security(self) -> KafkaSecurity:
        """How every Kafka client connects; ConfigError naming the setting when unusable."""
        password = self.kafka_sasl_password
        if self.kafka_sasl_password_file is not None:
            if password is not None:
                raise ConfigError(
                    "KAFKA_SASL_PASSWORD and KAFKA_SASL_PASSWORD_FILE are both set: keep one"
                )
            check_secret_file(
                self.kafka_sasl_password_file,
                f"KAFKA_SASL_PASSWORD_FILE={self.kafka_sasl_password_file}",
            )
            try:
                text = self.kafka_sasl_password_file.read_text().rstrip("\r\n")
            except OSError as exc:
                raise ConfigError(
                    f"KAFKA_SASL_PASSWORD_FILE={self.kafka_sasl_password_file}: "
                    f"cannot read it ({exc.strerror})"
                ) from None
            password = SecretStr(text)
        try:
            return KafkaSecurity(
                security_protocol=self.kafka_security_protocol,
                sasl_mechanism=self.kafka_sasl_mechanism,
                sasl_username=self.kafka_sasl_username,
                sasl_password=password,
                ssl_cafile=self.kafka_ssl_cafile,
                ssl_certfile=self.kafka_ssl_certfile,
                ssl_keyfile=self.kafka_ssl_keyfile,
            )
        except ValueError as exc:  # pydantic's ValidationError: the validator's message
            errors = getattr(exc, "errors", None)
            message = errors()[0]["msg"].removeprefix("Value error, ") if errors else str(exc)
            raise ConfigError(f"Kafka security settings: {message}") from None

    @property
    def topics(self) -> Topics:
        return Topics(self.topic_prefix)

    @property
    def dsn(self) -> str:
        return self.clickhouse_dsn or f"chdb://{(self.home / 'clickhouse').resolve()}"


_ENV = {
    "SPENDBUS_HOME": "home",
    "KAFKA_BOOTSTRAP": "kafka_bootstrap",
    "CLICKHOUSE_DSN": "clickhouse_dsn",
    "SPENDBUS_TOPIC_PREFIX": "topic_prefix",
    "SPENDBUS_PARTITIONS": "partitions",
    "SPENDBUS_WEB_PORT": "web_port",
    "SPENDBUS_WEB_HOST": "web_host",
    "SPENDBUS_ADMIN_PORT": "admin_port",
    "SPENDBUS_WEB_BODY_TIMEOUT": "web_body_timeout_s",
    "SPENDBUS_SESSION_IDLE_SECONDS": "session_idle_seconds",
    "SPENDBUS_PRUNE_SECONDS": "prune_seconds",
    "SPENDBUS_SINK_PROCESS": "sink_process",
    "SPENDBUS_ENGINE_PROCESS": "engine_process",
    "SPENDBUS_CACHE_DIR": "cache_dir",
    "KAFKA_SECURITY_PROTOCOL": "kafka_security_protocol",
    "KAFKA_SASL_MECHANISM": "kafka_sasl_mechanism",
    "KAFKA_SASL_USERNAME": "kafka_sasl_username",
    "KAFKA_SASL_PASSWORD": "kafka_sasl_password",
    "KAFKA_SASL_PASSWORD_FILE": "kafka_sasl_password_file",
    "KAFKA_SSL_CAFILE": "kafka_ssl_cafile",
    "KAFKA_SSL_CERTFILE": "kafka_ssl_certfile",
    "KAFKA_SSL_KEYFILE": "kafka_ssl_keyfile",
    "SPENDBUS_WEB_TOKEN": "web_token",
    "SPENDBUS_WEB_TOKEN_FILE": "web_token_file",
    "SPENDBUS_KEY_SECRET": "key_secret",
    "SPENDBUS_KEY_SECRET_FILE": "key_secret_file",
    "CLICKHOUSE_CA_FILE": "clickhouse_ca_file",
    "CLICKHOUSE_VERIFY": "clickhouse_verify",
    "CLICKHOUSE_CLIENT_CERT": "clickhouse_client_cert",
    "CLICKHOUSE_CLIENT_KEY": "clickhouse_client_key",
    "CLICKHOUSE_PASSWORD": "clickhouse_password",
    "CLICKHOUSE_PASSWORD_FILE": "clickhouse_password_file",
    "SPENDBUS_REPLICATION_FACTOR": "replication_factor",
    "SPENDBUS_MIN_INSYNC_REPLICAS": "min_insync_replicas",
    "SPENDBUS_ALLOW_UNDER_REPLICATION": "allow_under_replication",
}


def _read_secret(path: Path, setting: str) -> str:
    """A secret kept in a file (its first line); ConfigError naming the setting, never the
    text; refused when other users can read the file."""
    check_secret_file(path, f"{setting}={path}")
    try:
        text = path.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"{setting}={path}: cannot read it ({exc.strerror})") from None
    if not text or not text[0].strip():
        raise ConfigError(f"{setting}={path}: the file is empty")
    return text[0].strip()


def load_settings(environ: dict[str, str] | None = None, **overrides: Any) -> Settings:
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    config_file = env.get("SPENDBUS_CONFIG")
    if config_file:
        try:
            loaded = yaml.safe_load(Path(config_file).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"{config_file}: cannot read settings: {exc}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{config_file}: expected a mapping of settings")
        values.update(loaded)
    for variable, name in _ENV.items():
        if env.get(variable):
            values[name] = env[variable]
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return Settings.model_validate(values)
    except Exception as exc:
        # pydantic echoes the input of a failing field: never a password
        raise ConfigError(f"invalid settings: {_without_input(exc)}") from None


def _without_input(exc: Exception) -> str:
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return str(exc)
    return "; ".join(
        f"{'.'.join(str(p) for p in error['loc']) or '<settings>'}: {error['msg']}"
        for error in errors()
    )
