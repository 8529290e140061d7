"""`spendbus gateway run --config FILE`: the reference gateway, composed.

The composition is here, not in ``ingest/``: the gateway (ingest) depends on a
budget-gate protocol that ``enforcer.Enforcer`` satisfies, and on a usage sink
that ``ingest.publisher.UsagePublisher`` is; this module builds both from the
file's ``kafka``, ``enforcer`` and ``publisher`` sections and wires them. It is
also the one place that reads the environment (credentials by variable name,
KAFKA_BOOTSTRAP through spendbus.settings).

Start order: enforcer (follow the topics; serve by ``fail_mode`` until caught
up) → publisher (spool, producer) → keys topic, when ``keys_topic.follow``
(caught up, or the gateway does not start: without its keys it would refuse
every client) → gateway (listen). Stop in reverse: stop listening and finish
the accounting of responses in flight, stop following the keys, then flush
and stop the publisher, then the enforcer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from aiokafka.errors import KafkaConnectionError
from pydantic import BaseModel, ConfigDict, ValidationError

from schemas.errors import ConfigError, SpendbusError
from spendbus.stack.local import check_broker_answers, unreachable_message

log = logging.getLogger("spendbus.gateway")

#: The gateway's publisher lingers this long (the publisher's own default is Kafka's 5 ms):
#: a batch goes out once its oldest event has waited 20 ms. A gateway publishes one event
#: per response, as responses end: at 100 a second, a short linger sends nearly every event
#: in a produce request of its own, and each request is CPU in the gateway's process
#: (aiokafka is Python) and in the broker. The cost is that an event reaches usage.raw up
#: to 20 ms later; the client's response is finished by then, and its hold covers the
#: spend in the meantime. The file's ``publisher: {linger_ms: ...}`` overrides it.
GATEWAY_LINGER_MS = 20


class KafkaSection(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    bootstrap: str | None = None
    topic_prefix: str | None = None


def _validated(model: type[BaseModel], values: dict[str, Any], source: str, section: str) -> Any:
    try:
        return model(**values)
    except ValidationError as exc:
        first = exc.errors()[0]
        path = ".".join(str(p) for p in (section, *first["loc"]))
        message = first["msg"].removeprefix("Value error, ")
        raise ConfigError(f"{source}: field {path!r}: {message}") from None


def compose_configs(gateway_config: Any, source: str) -> tuple[Any, Any]:
    """(EnforcerConfig, PublisherConfig) from the file's sections; errors name file and field."""
    from enforcer import EnforcerConfig
    from ingest.publisher import PublisherConfig
    from spendbus.settings import load_settings
    from spendbus.stack.local import bootstrap_or_fail, check_kafka

    kafka = _validated(KafkaSection, gateway_config.kafka, source, "kafka")
    settings = load_settings()
    bootstrap = kafka.bootstrap or bootstrap_or_fail(settings)
    if kafka.bootstrap:
        check_kafka(kafka.bootstrap, settings.kafka_security)
    prefix = kafka.topic_prefix if kafka.topic_prefix is not None else settings.topic_prefix
    enforcer_values = {
        "gateway_id": gateway_config.gateway_id,
        "client_id": f"{gateway_config.gateway_id}-enforcer",
        **gateway_config.enforcer,
        "bootstrap": bootstrap,
        "kafka_security": settings.kafka_security,
        "topic_prefix": prefix,
    }
    publisher_values = {
        "spool_dir": settings.home / "gateway-spool" / gateway_config.gateway_id,
        "client_id": f"{gateway_config.gateway_id}-ingest",
        "linger_ms": GATEWAY_LINGER_MS,
        **gateway_config.publisher,
        "bootstrap": bootstrap,
        "kafka_security": settings.kafka_security,
        "topic_prefix": prefix,
    }
    return (
        _validated(EnforcerConfig, enforcer_values, source, "enforcer"),
        _validated(PublisherConfig, publisher_values, source, "publisher"),
    )


async def serve(
    gateway_config: Any,
    enforcer_config: Any,
    publisher_config: Any,
    credentials: dict[str, str],
    *,
    host: str | None = None,
    port: int | None = None,
    on_started: Callable[[str], None] | None = None,
    stop: asyncio.Event | None = None,
    key_secret: bytes | None = None,
) -> None:
    """Run the gateway until ``stop`` is set (or SIGINT/SIGTERM). ``key_secret``: what
    the virtual keys' digests are keyed with (default: spendbus.stack.key_secret's)."""
    from enforcer import Enforcer, NotReady
    from ingest.gateway import BudgetGate, Gateway, KeysTopicFollower, UsageSink
    from ingest.publisher import UsagePublisher
    from schemas.jobs import job_key_secret
    from schemas.topics import Topics
    from spendbus.settings import load_settings
    from spendbus.stack.key_secret import key_secret as settings_key_secret

    if key_secret is None:
        key_secret = settings_key_secret(load_settings())
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread
            loop.add_signal_handler(sig, stop.set)
    job_secret = job_key_secret(key_secret) if enforcer_config.policy_file is not None else None
    async with Enforcer(enforcer_config, job_key_secret=job_secret) as enforcer:
        try:
            await enforcer.wait_ready()
        except NotReady as exc:  # serve anyway: fail_mode decides until it catches up
            log.warning("%s; serving with fail_mode=%s", exc, enforcer_config.fail_mode)
        publisher = UsagePublisher(publisher_config)
        await publisher.start()
        try:
            gate: BudgetGate = enforcer  # mypy checks that the enforcer fits the protocol
            sink: UsageSink = publisher
            gateway = Gateway(
                gateway_config, gate, sink, credentials=credentials, key_secret=key_secret
            )
            if gateway.keys.legacy:
                log.warning(
                    "%d virtual keys are stored as unsalted SHA-256 (key_sha256): "
                    "`spendbus keys migrate` prints their key_hmac",
                    gateway.keys.legacy,
                )
            follower: KeysTopicFollower | None = None
            if gateway_config.keys_topic.follow:
                follower = KeysTopicFollower(
                    enforcer_config.bootstrap,
                    Topics(enforcer_config.topic_prefix).gateway_keys,
                    gateway.keys,
                    gateway_config,
                    client_id=f"{gateway_config.gateway_id}-keys",
                    security=enforcer_config.kafka_security,
                    registry=gateway.metrics.registry,
                )
                await follower.start()
            try:
                if follower is not None:
                    await follower.wait_ready(gateway_config.keys_topic.ready_timeout_s)
                await _listen(gateway, gateway_config, host, port, on_started, stop)
            finally:
                if follower is not None:
                    await follower.stop()
        finally:
            await publisher.stop()


async def _listen(
    gateway: Any,
    gateway_config: Any,
    host: str | None,
    port: int | None,
    on_started: Callable[[str], None] | None,
    stop: asyncio.Event,
) -> None:
    from ingest.gateway import GatewayServer

    server = GatewayServer(
        gateway,
        host or gateway_config.listen.host,
        gateway_config.listen.port if port is None else port,
    )
    await server.start()
    try:
        if on_started is not None:
            on_started(server.url)
        await stop.wait()
    finally:
        await server.stop()


def bootstrap_setting(config: Any, config_path: Path) -> str:
    """The setting the gateway's Kafka address came from, as a user would change it."""
    from spendbus.settings import load_settings

    if config.kafka.get("bootstrap"):
        return f"{config_path}: kafka.bootstrap"
    settings = load_settings()
    if settings.kafka_bootstrap:
        return "KAFKA_BOOTSTRAP"
    return f"the local broker of `spendbus up` (SPENDBUS_HOME={settings.home})"


def _check_key_strength(config: Any, config_path: Path, listen_host: str) -> None:
    """A key given in clear that is too weak: refused off loopback, a warning on it."""
    from runtime.net import is_loopback

    for name, problem in config.weak_keys():
        if not is_loopback(listen_host):
            raise ConfigError(
                f"{config_path}: key {name!r}: {problem}; a gateway listening on "
                f"{listen_host} takes no weak key"
            )
        log.warning("%s: key %r: %s (accepted on loopback only)", config_path, name, problem)


@click.group()
def gateway() -> None:
    """The reference gateway: an LLM proxy that checks budgets and meters every call."""


@gateway.command("run")
@click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The gateway YAML (see infra/gateway/gateway.example.yaml).",
)
@click.option("--host", default=None, help="Listen address (overrides listen.host).")
@click.option("--port", default=None, type=int, help="Listen port (overrides listen.port; 0: any).")
@click.option("--log-level", default="INFO", show_default=True)
def run(config_path: Path, host: str | None, port: int | None, log_level: str) -> None:
    """Serve the OpenAI, Anthropic, Gemini and Bedrock APIs through the budget checks."""
    from ingest.gateway import load_config

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    try:
        config = load_config(config_path)
        _check_key_strength(config, config_path, host or config.listen.host)
        credentials = config.credentials(os.environ, source=str(config_path))
        enforcer_config, publisher_config = compose_configs(config, str(config_path))
        if enforcer_config.policy_file is not None:  # a bad policy: this error, before anything
            from enforcer import Policy

            Policy(enforcer_config.policy_file, enforcer_config.policy_query)
        where = bootstrap_setting(config, config_path)
        check_broker_answers(enforcer_config.bootstrap, where, enforcer_config.kafka_security)
    except SpendbusError as exc:
        raise click.ClickException(str(exc)) from None

    def started(url: str) -> None:
        click.echo(
            json.dumps(
                {
                    "listening": url,
                    "keys": len(config.keys),
                    "keys_topic": config.keys_topic.follow,
                }
            ),
            err=True,
        )

    try:
        asyncio.run(
            serve(
                config,
                enforcer_config,
                publisher_config,
                credentials,
                host=host,
                port=port,
                on_started=started,
            )
        )
    except SpendbusError as exc:
        raise click.ClickException(str(exc)) from None
    except KafkaConnectionError:
        # the broker answered the check above and went away since: the same one line
        raise click.ClickException(unreachable_message(enforcer_config.bootstrap, where)) from None
