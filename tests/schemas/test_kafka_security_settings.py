"""The Kafka security settings: env and YAML, the password file, clear errors, no secret shown."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from runtime.kafka import PLAINTEXT, KafkaSecurity
from schemas.errors import ConfigError
from spendbus.settings import load_settings

PASSWORD = "s3cret-pa55-never-shown"


def _ca(tmp_path: Path) -> Path:
    import subprocess

    cert = tmp_path / "ca.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=t", "-keyout", str(tmp_path / "ca.key"), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert


def test_no_setting_is_plaintext_and_clients_get_no_extra_arguments() -> None:
    security = load_settings({}).kafka_security
    assert security == PLAINTEXT
    assert security.client_kwargs() == {}


def test_env_settings_build_sasl_ssl_and_the_password_stays_secret(tmp_path: Path) -> None:
    ca = _ca(tmp_path)
    settings = load_settings(
        {
            "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "KAFKA_SASL_USERNAME": "gw",
            "KAFKA_SASL_PASSWORD": PASSWORD,
            "KAFKA_SSL_CAFILE": str(ca),
        }
    )
    security = settings.kafka_security
    kwargs = security.client_kwargs()
    assert kwargs["security_protocol"] == "SASL_SSL"
    assert kwargs["sasl_mechanism"] == "SCRAM-SHA-512"
    assert kwargs["sasl_plain_username"] == "gw"
    assert kwargs["sasl_plain_password"] == PASSWORD
    assert isinstance(kwargs["ssl_context"], ssl.SSLContext)
    assert kwargs["ssl_context"].check_hostname
    for shown in (repr(settings), str(settings), repr(security), security.describe()):
        assert PASSWORD not in shown
    assert "gw" in security.describe() and str(ca) in security.describe()


def test_yaml_file_and_password_file_env_wins(tmp_path: Path) -> None:
    ca = _ca(tmp_path)
    secret_file = tmp_path / "password"
    secret_file.write_text(PASSWORD + "\n")
    secret_file.chmod(0o600)  # a secret: private (runtime/private_files.py)
    config = tmp_path / "spendbus.yaml"
    config.write_text(
        "kafka_security_protocol: SASL_SSL\n"
        "kafka_sasl_mechanism: SCRAM-SHA-256\n"
        "kafka_sasl_username: from-file\n"
        f"kafka_sasl_password_file: {secret_file}\n"
        f"kafka_ssl_cafile: {ca}\n"
    )
    security = load_settings(
        {"SPENDBUS_CONFIG": str(config), "KAFKA_SASL_USERNAME": "from-env"}
    ).kafka_security
    assert security.sasl_username == "from-env"
    assert security.sasl_mechanism == "SCRAM-SHA-256"
    assert security.client_kwargs()["sasl_plain_password"] == PASSWORD  # newline dropped


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "KAFKA_SASL_PASSWORD": PASSWORD}, "KAFKA_SASL_USERNAME"),
        ({"KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "KAFKA_SASL_USERNAME": "u"}, "KAFKA_SASL_PASSWORD"),
        ({"KAFKA_SASL_USERNAME": "u", "KAFKA_SASL_PASSWORD": PASSWORD}, "KAFKA_SECURITY_PROTOCOL"),
        ({"KAFKA_SECURITY_PROTOCOL": "SSL", "KAFKA_SSL_CAFILE": "/nowhere/ca.pem"}, "KAFKA_SSL_CAFILE"),
        ({"KAFKA_SECURITY_PROTOCOL": "SSL", "KAFKA_SSL_CERTFILE": "/etc/hostname"}, "KAFKA_SSL_KEYFILE"),
        ({"KAFKA_SSL_CAFILE": "/etc/hostname"}, "does not use TLS"),
        (
            {
                "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
                "KAFKA_SASL_USERNAME": "u",
                "KAFKA_SASL_PASSWORD_FILE": "/nowhere/password",
            },
            "KAFKA_SASL_PASSWORD_FILE",
        ),
        (
            {
                "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
                "KAFKA_SASL_USERNAME": "u",
                "KAFKA_SASL_PASSWORD": PASSWORD,
                "KAFKA_SASL_PASSWORD_FILE": "/etc/hostname",
            },
            "both set",
        ),
    ],
)  # fmt: skip
def test_an_unusable_combination_names_the_setting(env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named) as caught:
        _ = load_settings(env).kafka_security
    assert PASSWORD not in str(caught.value)


def test_an_unknown_protocol_is_refused_without_echoing_the_password() -> None:
    with pytest.raises(ConfigError, match="kafka_security_protocol") as caught:
        load_settings({"KAFKA_SECURITY_PROTOCOL": "TLS", "KAFKA_SASL_PASSWORD": PASSWORD})
    assert PASSWORD not in str(caught.value)


def test_the_faust_credentials_carry_the_same_settings(tmp_path: Path) -> None:
    from faust.auth import SASLCredentials, SSLCredentials
    from pydantic import SecretStr

    from aggregator.app import faust_credentials

    ca = _ca(tmp_path)
    sasl = faust_credentials(
        KafkaSecurity(
            security_protocol="SASL_SSL",
            sasl_mechanism="SCRAM-SHA-512",
            sasl_username="worker",
            sasl_password=SecretStr(PASSWORD),
            ssl_cafile=ca,
        )
    )
    assert isinstance(sasl, SASLCredentials)
    assert (sasl.protocol.value, sasl.mechanism.value) == ("SASL_SSL", "SCRAM-SHA-512")
    assert PASSWORD not in repr(sasl)
    tls = faust_credentials(KafkaSecurity(security_protocol="SSL", ssl_cafile=ca))
    assert isinstance(tls, SSLCredentials)
    assert faust_credentials(PLAINTEXT) is None
