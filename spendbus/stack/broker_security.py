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
