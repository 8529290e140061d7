"""How to reach a ClickHouse server over HTTPS: the CA, verification, a client certificate
and the password, kept out of the DSN so that a DSN can be logged (``CLICKHOUSE_*`` settings).

One frozen object, built by the CLI from the settings and passed down to
:func:`aggregator.sink.store.open_client`; the embedded engine (``chdb://``) ignores it.
The password is a ``SecretStr``: its repr, the config's repr and every error show ``***``.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, SecretStr, model_validator


class ClickHouseAccess(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    #: PEM file of the CA(s) that signed the server's certificate (None: the system CAs)
    ca_file: Path | None = None
    #: verify the server's certificate and host name; False only for a test server
    verify: bool = True
    #: mutual TLS: the client's certificate (PEM) and its key (when not inside the cert file)
    client_cert: Path | None = None
    client_key: Path | None = None
    #: the user's password, when the DSN carries none (never both: one source of truth)
    password: SecretStr | None = None

    @model_validator(mode="after")
    def _key_needs_cert(self) -> ClickHouseAccess:
        if self.client_key is not None and self.client_cert is None:
            raise ValueError("a client key without a client certificate (CLICKHOUSE_CLIENT_CERT)")
        return self

    @property
    def uses_tls_options(self) -> bool:
        """True when anything here only means something over https://."""
        return (
            self.ca_file is not None
            or self.client_cert is not None
            or self.client_key is not None
            or not self.verify
        )


#: the default: the system CAs, verification on, the DSN's own credentials
DEFAULT_ACCESS = ClickHouseAccess()


def redact_dsn(dsn: str) -> str:
    """``dsn`` with its password, if it carries one, shown as ``***``: what may be printed."""
    parsed = urlparse(dsn)
    if parsed.password:
        return dsn.replace(f":{parsed.password}@", ":***@", 1)
    return dsn
