"""The broker's SASL_SSL listener: its settings (`SaslSslListener`) and JAAS lines."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BROKER_USER",
    "SCRAM_MECHANISMS",
    "STANDARD_AUTHORIZER",
    "SaslSslListener",
    "jaas_config",
    "sasl_ssl_properties",
    "scram_format_args",
]

# --------------------------------------------------------------------------------------------
# A secured listener
# --------------------------------------------------------------------------------------------

#: the broker's own SCRAM user (inter-broker listener) and PLAIN user (controller listener)
BROKER_USER = "broker"
SCRAM_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256")
STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


@dataclass(frozen=True)
class SaslSslListener:
    """A SASL_SSL listener (SCRAM-SHA-512 and -256) beside the PLAINTEXT one, with Kafka's
    StandardAuthorizer denying whatever no ACL allows.

    ``users`` (name -> password) get SCRAM credentials for both mechanisms when the storage is
    formatted (``kafka-storage format --add-scram``), so they exist before the first client
    connects; the set is fixed from then on. ``super_users`` bypass the ACLs (an operator's
    admin); the broker's own user is always one. ``keystore`` is a PEM file holding the
    broker's private key (unencrypted PKCS#8) and certificate chain, ``truststore`` a PEM file
    with the CA: Kafka 4.x reads PEM stores directly.

    The PLAINTEXT listener stays for the readiness probe (ApiVersions and the broker list,
    which need no ACL); its principal, ``User:ANONYMOUS``, is not a super user, so the ACLs
    refuse it everything else. The controller listener authenticates the broker with PLAIN.
    """

    keystore: Path
    truststore: Path
    users: Mapping[str, str]
    super_users: Sequence[str] = ("admin",)

    def __repr__(self) -> str:  # never the passwords
        return f"SaslSslListener(users={sorted(self.users)}, super_users={list(self.super_users)})"


def jaas_config(module: str, user: str, password: str, **extra: str) -> str:
    options = " ".join(
        f'{k}="{v}"' for k, v in {"username": user, "password": password, **extra}.items()
    )
    return f"org.apache.kafka.common.security.{module} required {options};"


def sasl_ssl_properties(
    listener: SaslSslListener, *, port: int, sasl_ssl_port: int, controller_port: int, secret: str
) -> dict[str, str]:
    """The server.properties of a broker with a SASL_SSL listener (beside PLAINTEXT for the
    readiness probe); ``secret`` is the broker's own password."""
    sport, cport = sasl_ssl_port, controller_port
    scram = jaas_config("scram.ScramLoginModule", BROKER_USER, secret)
    props = {
        "listeners": (
            f"PLAINTEXT://127.0.0.1:{port},SASL_SSL://127.0.0.1:{sport},"
            f"CONTROLLER://127.0.0.1:{cport}"
        ),
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port},SASL_SSL://127.0.0.1:{sport}",
        "listener.security.protocol.map": (
            "PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,CONTROLLER:SASL_PLAINTEXT"
        ),
        # the broker's own connections authenticate too: SCRAM between brokers, PLAIN to
        # the controller (SCRAM credentials live in the metadata the controller serves)
        "inter.broker.listener.name": "SASL_SSL",
        "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
        "sasl.mechanism.controller.protocol": "PLAIN",
        "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.controller.plain.sasl.jaas.config": jaas_config(
            "plain.PlainLoginModule", BROKER_USER, secret, **{f"user_{BROKER_USER}": secret}
        ),
        "listener.name.sasl_ssl.sasl.enabled.mechanisms": ",".join(SCRAM_MECHANISMS),
        **{f"listener.name.sasl_ssl.{m.lower()}.sasl.jaas.config": scram for m in SCRAM_MECHANISMS},
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(listener.keystore),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(listener.truststore),
        "authorizer.class.name": STANDARD_AUTHORIZER,
        "allow.everyone.if.no.acl.found": "false",
        "super.users": ";".join(
            f"User:{u}" for u in dict.fromkeys([BROKER_USER, *listener.super_users])
        ),
    }
    return props


def scram_format_args(listener: SaslSslListener, secret: str) -> list[str]:
    """``--add-scram`` for the broker's user (password ``secret``) and every listener user, both mechanisms.

    The StorageTool takes credentials only as arguments: this short-lived local JVM, on a
    test's own broker, is the one place spendbus passes a password in argv.
    """
    users = {BROKER_USER: secret, **listener.users}
    return [
        arg
        for name, password in users.items()
        for mechanism in SCRAM_MECHANISMS
        for arg in ("--add-scram", f"{mechanism}=[name={name},password={password}]")
    ]
