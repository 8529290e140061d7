"""A SASL_SSL broker for tests: a CA and a broker certificate made here (openssl), SCRAM users,
the StandardAuthorizer denying what no ACL allows. Session fixture: ``secured_kafka``."""

from __future__ import annotations

import os
import secrets
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from runtime.kafka import KafkaSecurity
from spendbus.stack.broker_security import SaslSslListener
from spendbus.stack.kafka import LocalKafka

#: the users the broker knows: one super user (the operator's admin) and one per role
USERS = ("admin", "gw", "worker", "sidecar", "ops")


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, stdin=subprocess.DEVNULL)


def make_ca(folder: Path, name: str) -> tuple[Path, Path]:
    """A self-signed CA: (certificate, key)."""
    cert, key = folder / f"{name}.pem", folder / f"{name}.key"
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(cert),
    )  # fmt: skip
    return cert, key


def make_broker_keystore(folder: Path, ca: tuple[Path, Path]) -> Path:
    """The broker's PEM keystore: its unencrypted PKCS#8 key and a certificate for
    127.0.0.1 / localhost signed by ``ca``."""
    key, csr, cert = folder / "broker.key", folder / "broker.csr", folder / "broker.crt"
    ext = folder / "broker.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
        "-keyout", str(key), "-out", str(csr),
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]),
        "-CAcreateserial", "-days", "2", "-extfile", str(ext), "-out", str(cert),
    )  # fmt: skip
    keystore = folder / "broker-keystore.pem"
    keystore.write_text(key.read_text() + cert.read_text() + ca[0].read_text())
    keystore.chmod(0o600)
    return keystore


@dataclass
class SecuredKafka:
    """The running broker, its CA, a CA that did not sign it, and each user's password."""

    broker: LocalKafka
    ca: Path
    untrusted_ca: Path
    passwords: dict[str, str]
    folder: Path
    _password_files: dict[str, Path] = field(default_factory=dict)

    @property
    def bootstrap(self) -> str:
        return self.broker.sasl_ssl_bootstrap

    def security(self, user: str, *, password: str | None = None) -> KafkaSecurity:
        from pydantic import SecretStr

        return KafkaSecurity(
            security_protocol="SASL_SSL",
            sasl_mechanism="SCRAM-SHA-512",
            sasl_username=user,
            sasl_password=SecretStr(password or self.passwords[user]),
            ssl_cafile=self.ca,
        )

    def password_file(self, user: str) -> Path:
        path = self.folder / f"{user}.password"
        if user not in self._password_files:
            path.touch(mode=0o600)
            path.write_text(self.passwords[user] + "\n")
            path.chmod(0o600)  # a secret: private (runtime/private_files.py)
            self._password_files[user] = path
        return path

    def env(self, user: str) -> dict[str, str]:
        """The settings a spendbus process needs to connect as ``user`` (the password by
        file: it appears in no environment listing either)."""
        return {
            "KAFKA_BOOTSTRAP": self.bootstrap,
            "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "KAFKA_SASL_USERNAME": user,
            "KAFKA_SASL_PASSWORD_FILE": str(self.password_file(user)),
            "KAFKA_SSL_CAFILE": str(self.ca),
        }


def start_secured_kafka(folder: Path) -> SecuredKafka:
    certs = folder / "certs"
    certs.mkdir(parents=True, exist_ok=True)
    ca = make_ca(certs, "spendbus-test-ca")
    untrusted, _ = make_ca(certs, "someone-elses-ca")
    keystore = make_broker_keystore(certs, ca)
    passwords = {user: f"{user}-{secrets.token_urlsafe(12)}" for user in USERS}
    broker = LocalKafka(
        data_dir=folder / "kafka",
        sasl_ssl=SaslSslListener(
            keystore=keystore, truststore=ca[0], users=passwords, super_users=("admin",)
        ),
    )
    broker.start(timeout=120)
    os.chmod(folder, 0o700)
    return SecuredKafka(broker, ca[0], untrusted, passwords, folder)
