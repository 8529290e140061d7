"""Kafka helpers every room uses: the connection's security and partition lookup (aiokafka only).

:class:`KafkaSecurity` is the one description of how a client authenticates and
encrypts (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL; PLAIN or SCRAM; optional mutual
TLS). The CLI builds it from the settings (spendbus/settings.py) and every stage gets it
in its frozen config; every aiokafka client takes ``**security.client_kwargs()``.
The password is a ``SecretStr``: no repr, log line or exception shows it.

:func:`preflight` connects once to the bootstrap servers with those settings and turns a
wrong password, an untrusted certificate or an unreachable cluster into a
:class:`~schemas.errors.ConfigError` naming the setting and the broker within seconds:
aiokafka itself only logs such failures and retries its bootstrap.
"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from typing import Any, Final, Literal

from aiokafka import TopicPartition
from aiokafka import errors as kafka_errors
from aiokafka.admin import AIOKafkaAdminClient
from pydantic import BaseModel, ConfigDict, SecretStr, model_validator

from schemas.errors import ConfigError

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]

#: how long the preflight waits for one broker to finish TLS and SASL
PREFLIGHT_TIMEOUT_S: Final = 10.0


class KafkaSecurity(BaseModel):
    """How every Kafka client connects. The default is PLAINTEXT with no credentials.

    Field names are the settings' names without ``kafka_`` (``KAFKA_SASL_USERNAME`` is
    ``sasl_username``); errors name the environment variable, which is what operators set.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    security_protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: SaslMechanism = "PLAIN"
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    #: PEM file of the CA(s) that signed the brokers' certificates; None = the system CAs
    ssl_cafile: Path | None = None
    #: mutual TLS: the client's certificate chain and private key (PEM), both or neither
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None

    @model_validator(mode="after")
    def _consistent(self) -> KafkaSecurity:
        protocol = self.security_protocol
        if self.uses_sasl:
            if not self.sasl_username:
                raise ValueError(
                    f"KAFKA_SECURITY_PROTOCOL={protocol} needs KAFKA_SASL_USERNAME (not set)"
                )
            if self.sasl_password is None or not self.sasl_password.get_secret_value():
                raise ValueError(
                    f"KAFKA_SECURITY_PROTOCOL={protocol} needs KAFKA_SASL_PASSWORD "
                    "or KAFKA_SASL_PASSWORD_FILE (not set)"
                )
        elif self.sasl_username or self.sasl_password is not None:
            raise ValueError(
                f"KAFKA_SASL_USERNAME/KAFKA_SASL_PASSWORD are set but KAFKA_SECURITY_PROTOCOL="
                f"{protocol} does not use SASL (SASL_SSL or SASL_PLAINTEXT)"
            )
        files = {
            "KAFKA_SSL_CAFILE": self.ssl_cafile,
            "KAFKA_SSL_CERTFILE": self.ssl_certfile,
            "KAFKA_SSL_KEYFILE": self.ssl_keyfile,
        }
        if not self.uses_tls:
            named = [name for name, value in files.items() if value is not None]
            if named:
                raise ValueError(
                    f"{', '.join(named)} set but KAFKA_SECURITY_PROTOCOL={protocol} does not "
                    "use TLS (SSL or SASL_SSL)"
                )
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("KAFKA_SSL_CERTFILE and KAFKA_SSL_KEYFILE go together (mutual TLS)")
        for name, value in files.items():
            if value is not None and not value.is_file():
                raise ValueError(f"{name}={value}: no such file")
        return self

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol in ("SASL_SSL", "SASL_PLAINTEXT")

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    def ssl_context(self) -> ssl.SSLContext | None:
        """The verifying client context (hostname checked), None without TLS."""
        if not self.uses_tls:
            return None
        from aiokafka.helpers import create_ssl_context

        try:
            context: ssl.SSLContext = create_ssl_context(
                cafile=self.ssl_cafile, certfile=self.ssl_certfile, keyfile=self.ssl_keyfile
            )
            return context
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"cannot load the Kafka TLS files (KAFKA_SSL_CAFILE={self.ssl_cafile}, "
                f"KAFKA_SSL_CERTFILE={self.ssl_certfile}, KAFKA_SSL_KEYFILE={self.ssl_keyfile}): "
                f"{exc}"
            ) from None

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for any aiokafka client (producer, consumer, admin, connection).

        Empty for PLAINTEXT, so a client built without security is built exactly as before.
        """
        if self.security_protocol == "PLAINTEXT":
            return {}
        kwargs: dict[str, Any] = {"security_protocol": self.security_protocol}
        if self.uses_tls:
            kwargs["ssl_context"] = self.ssl_context()
        if self.uses_sasl:
            assert self.sasl_password is not None  # checked by the validator
            kwargs.update(
                sasl_mechanism=self.sasl_mechanism,
                sasl_plain_username=self.sasl_username,
                sasl_plain_password=self.sasl_password.get_secret_value(),
            )
        return kwargs

    def describe(self) -> str:
        """One line for messages and status: protocol, mechanism, user, CA (never the password)."""
        parts: list[str] = [self.security_protocol]
        if self.uses_sasl:
            parts.append(f"{self.sasl_mechanism} as {self.sasl_username!r}")
        if self.uses_tls:
            parts.append(f"CA {self.ssl_cafile or 'the system CAs'}")
            if self.ssl_certfile is not None:
                parts.append(f"client certificate {self.ssl_certfile}")
        return ", ".join(parts)


#: the default: what every client did before security settings existed
PLAINTEXT: Final = KafkaSecurity()


def _brokers(bootstrap: str) -> list[tuple[str, int]]:
    out = []
    for item in bootstrap.split(","):
        host, sep, port = item.strip().rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ConfigError(f"KAFKA_BOOTSTRAP={bootstrap!r}: expected host:port[,host:port]")
        out.append((host.strip("[]"), int(port)))
    return out


async def preflight(
    bootstrap: str, security: KafkaSecurity, timeout_s: float = PREFLIGHT_TIMEOUT_S
) -> None:
    """Connect (TLS handshake, SASL authentication) to the first broker that answers.

    Raises ConfigError at once on a refused certificate or credentials (another broker of
    the same cluster would refuse them too), and when no broker answers within
    ``timeout_s`` each. A PLAINTEXT cluster is not probed: nothing changes for it.
    """
    if security.security_protocol == "PLAINTEXT":
        return
    from aiokafka.conn import create_conn

    kwargs = security.client_kwargs()
    unreachable: list[str] = []
    for host, port in _brokers(bootstrap):
        where = f"Kafka broker {host}:{port} ({security.describe()})"
        try:
            conn = await asyncio.wait_for(
                create_conn(
                    host,
                    port,
                    client_id="spendbus-preflight",
                    request_timeout_ms=int(timeout_s * 1000),
                    **kwargs,
                ),
                timeout_s,
            )
        except ssl.SSLCertVerificationError as exc:
            raise ConfigError(
                f"{where}: its TLS certificate is not trusted ({exc.verify_message}); "
                "KAFKA_SSL_CAFILE must name the CA that signed it"
            ) from None
        except ssl.SSLError as exc:
            raise ConfigError(
                f"{where}: the TLS handshake failed ({exc.reason or exc}); check "
                "KAFKA_SECURITY_PROTOCOL and, for mutual TLS, KAFKA_SSL_CERTFILE/KAFKA_SSL_KEYFILE"
            ) from None
        except kafka_errors.UnsupportedSaslMechanismError as exc:
            raise ConfigError(f"{where}: KAFKA_SASL_MECHANISM is not enabled: {exc}") from None
        except (kafka_errors.SaslAuthenticationFailed, kafka_errors.AuthenticationFailedError):
            raise ConfigError(
                f"{where}: authentication failed; check KAFKA_SASL_USERNAME, "
                "KAFKA_SASL_PASSWORD (or KAFKA_SASL_PASSWORD_FILE) and KAFKA_SASL_MECHANISM"
            ) from None
        except (TimeoutError, OSError, kafka_errors.KafkaError) as exc:
            # a plaintext listener answering a TLS client, a closed port, a dead host
            unreachable.append(f"{host}:{port}: {type(exc).__name__} {exc}".strip())
            continue
        conn.close()
        return
    raise ConfigError(
        f"no Kafka broker of KAFKA_BOOTSTRAP={bootstrap} completed a {security.describe()} "
        f"connection within {timeout_s:g}s (is KAFKA_SECURITY_PROTOCOL the listener's?): "
        + "; ".join(unreachable)
    )


async def topic_partitions(
    bootstrap: str, *topics: str, security: KafkaSecurity = PLAINTEXT
) -> list[TopicPartition]:
    """Every partition of ``topics``; ConfigError naming a topic that does not exist."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **security.client_kwargs())
    await admin.start()
    try:
        described = await admin.describe_topics(list(topics))
    finally:
        await admin.close()
    out: list[TopicPartition] = []
    for item in described:
        if item["error_code"] == kafka_errors.TopicAuthorizationFailedError.errno:
            raise ConfigError(
                f"not authorized to describe topic {item['topic']!r} (its ACLs: docs/security.md)"
            )
        if item["error_code"] != 0 or not item["partitions"]:
            raise ConfigError(
                f"topic {item['topic']!r} does not exist (run `spendbus up`, or create the topics)"
            )
        out.extend(TopicPartition(item["topic"], p["partition"]) for p in item["partitions"])
    return sorted(out)


async def committed_offsets(
    bootstrap: str, group: str, *, security: KafkaSecurity = PLAINTEXT
) -> dict[TopicPartition, int]:
    """The group's committed offsets (none for a group that never committed)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **security.client_kwargs())
    await admin.start()
    try:
        for attempt in range(60):
            try:
                committed = await admin.list_consumer_group_offsets(group)
                break
            except kafka_errors.KafkaError as exc:  # a fresh cluster elects its coordinator first
                if not exc.retriable or attempt == 59:
                    raise
                await asyncio.sleep(0.5)
    finally:
        await admin.close()
    return {tp: meta.offset for tp, meta in committed.items() if meta.offset >= 0}
