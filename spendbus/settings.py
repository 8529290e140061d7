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
SPENDBUS_CACHE_DIR         where the Kafka broker jars are cached           ~/.cache/spendbus
SPENDBUS_CONFIG            a YAML file with any of the keys below           (none)
=========================  ===============================================  ==========================

A config file uses the lower-case names without the prefix (``home``,
``kafka_bootstrap``, ``clickhouse_dsn``, ``topic_prefix``, ``partitions``,
``web_port``, ``web_host``, ``cache_dir``); environment variables win over the file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from schemas.errors import ConfigError
from schemas.topics import Topics


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    home: Path = Path(".spendbus")
    kafka_bootstrap: str | None = None
    clickhouse_dsn: str | None = None
    topic_prefix: str = ""
    partitions: int = Field(default=4, ge=1, le=256)
    web_port: int = Field(default=6066, ge=1, le=65535)
    web_host: str = "127.0.0.1"
    cache_dir: Path = Path.home() / ".cache" / "spendbus"

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
    "SPENDBUS_CACHE_DIR": "cache_dir",
}


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
        raise ConfigError(f"invalid settings: {exc}") from None
