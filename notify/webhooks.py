"""Webhooks: where alerts go, which ones each takes, and how hard it is retried.

A webhook is given on the command line (``--webhook URL``, one secret for all from
``--secret-file``) or in a YAML file (``--config``)::

    webhooks:
      - url: https://hooks.slack.com/services/T000/B000/XXXX
        id: slack-finance           # optional; default: derived from the URL
        secret_file: /run/secrets/slack-hmac
        budgets: [acme-*]           # budget ids, shell patterns (fnmatch)
        scopes: [org, project]      # the budgets' scope (secret, org, ..., tag:<name>)
        kinds: [threshold]          # threshold | exhausted | unpriced_model | forecast
    retry: {base_seconds: 1, max_seconds: 300, max_attempts: 0, timeout_seconds: 10}

A filter left out takes every alert; an alert without a budget (``unpriced_model``)
passes a webhook only when it names neither ``budgets`` nor ``scopes``.

The URL may carry a token: only :func:`redact_url` (``scheme://host/…``) is logged,
recorded or shown; the id (``wh-`` + 12 hex of the URL's SHA-256 unless named) keys the
delivery records. The secret is read from a file, held as a ``SecretStr`` and never
printed.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from runtime.net import is_loopback
from runtime.private_files import check_secret_file
from schemas.errors import ConfigError

WEBHOOK_ID_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def redact_url(url: str) -> str:
    """``scheme://host[:port]/…``: what may be shown of a URL that can carry a token."""
    parts = urlsplit(url)
    host = parts.hostname or "?"
    if ":" in host:
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}/…"


def derived_webhook_id(url: str) -> str:
    return "wh-" + hashlib.sha256(url.encode()).hexdigest()[:12]


def read_secret_file(path: Path, what: str) -> SecretStr:
    """The first line of ``path``; ConfigError naming the file (never its text), or when
    other users can read it (runtime/private_files.py)."""
    check_secret_file(path, f"{what}={path}")
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"{what}={path}: cannot read it ({exc.strerror})") from None
    if not lines or not lines[0].strip():
        raise ConfigError(f"{what}={path}: the file is empty")
    return SecretStr(lines[0].strip())


class RetryPolicy(BaseModel):
    """Exponential backoff: attempt n waits base * 2**(n-1), at most max_seconds (jittered)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    base_seconds: float = Field(default=1.0, gt=0)
    max_seconds: float = Field(default=300.0, gt=0)
    #: 0: retry until delivered (a 4xx other than 408/429 still gives up at once)
    max_attempts: int = Field(default=0, ge=0)
    timeout_seconds: float = Field(default=10.0, gt=0)

    def delay(self, attempt: int, jitter: float) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1-based); ``jitter`` in [0, 1)."""
        full = min(self.max_seconds, self.base_seconds * 2.0 ** (attempt - 1))
        return full * (0.5 + jitter / 2)


class Webhook(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str = Field(repr=False)
    id: str = ""
    secret: SecretStr | None = None
    budgets: tuple[str, ...] = ()
    scopes: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()
    allow_http: bool = False
    retry: RetryPolicy = RetryPolicy()

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if value and not WEBHOOK_ID_PATTERN.fullmatch(value):
            raise ValueError(f"id {value!r}: letters, digits, '_', '.', '-' (at most 64)")
        return value

    def model_post_init(self, _: Any) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"webhook {redact_url(self.url)}: expected an http(s):// URL")
        if parts.scheme == "http" and not (self.allow_http or is_loopback(parts.hostname)):
            raise ConfigError(
                f"webhook {redact_url(self.url)}: plain http:// off loopback sends the alert "
                "(and any token in the URL) in clear; use https:// or allow_http: true"
            )
        if not self.id:
            object.__setattr__(self, "id", derived_webhook_id(self.url))

    @property
    def shown(self) -> str:
        """How logs and status name this webhook: its id and redacted URL."""
        return f"{self.id} ({redact_url(self.url)})"

    def wants(self, alert: Mapping[str, Any], scope: str | None) -> bool:
        """Does this webhook take ``alert`` (``scope``: its budget's scope, None unknown)?"""
        if self.kinds and alert["kind"] not in self.kinds:
            return False
        budget = alert.get("budget_id") or ""
        if self.budgets and not (
            budget and any(fnmatch.fnmatchcase(budget, p) for p in self.budgets)
        ):
            return False
        return not self.scopes or (scope is not None and scope in self.scopes)


def load_webhooks(
    path: Path | None,
    urls: Sequence[str],
    *,
    secret_file: Path | None = None,
    retry: Mapping[str, Any] | None = None,
    allow_http: bool = False,
) -> list[Webhook]:
    """The webhooks of ``--config`` and of ``--webhook`` (``secret_file`` signs the latter);
    ConfigError naming the file, webhook and field on anything wrong."""
    common_retry: dict[str, Any] = dict(retry or {})
    items: list[tuple[str, dict[str, Any]]] = []
    if path is not None:
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"{path}: cannot read the notify config: {exc}") from None
        if not isinstance(loaded, dict) or not isinstance(loaded.get("webhooks", []), list):
            raise ConfigError(f"{path}: expected a mapping with a list `webhooks:`")
        unknown = set(loaded) - {"webhooks", "retry"}
        if unknown:
            raise ConfigError(f"{path}: unknown keys {sorted(unknown)} (webhooks, retry)")
        common_retry = {**(loaded.get("retry") or {}), **common_retry}
        for number, item in enumerate(loaded.get("webhooks") or [], 1):
            if not isinstance(item, dict) or "url" not in item:
                raise ConfigError(f"{path}: webhook {number}: expected a mapping with `url:`")
            items.append((f"{path}: webhook {number}", dict(item)))
    shared_secret = None if secret_file is None else read_secret_file(secret_file, "--secret-file")
    for number, url in enumerate(urls, 1):
        items.append((f"--webhook {number}", {"url": url, "secret": shared_secret}))
    webhooks: list[Webhook] = []
    for where, item in items:
        if "secret_file" in item:
            item["secret"] = read_secret_file(
                Path(item.pop("secret_file")), f"{where}: secret_file"
            )
        for name in ("budgets", "scopes", "kinds"):
            if isinstance(item.get(name), str):
                item[name] = [item[name]]
        item["retry"] = {**common_retry, **(item.get("retry") or {})}
        item.setdefault("allow_http", allow_http)
        try:
            webhooks.append(Webhook.model_validate(item))
        except ValidationError as exc:
            # pydantic would echo the input: the URL and secret stay out of the message
            fields = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'webhook'}: {e['msg']}"
                for e in exc.errors()
            )
            raise ConfigError(f"{where}: {fields}") from None
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    if not webhooks:
        raise ConfigError("no webhook: give --webhook URL or --config FILE with `webhooks:`")
    seen: dict[str, str] = {}
    for webhook in webhooks:
        if webhook.id in seen:
            raise ConfigError(f"webhook id {webhook.id!r} given twice: ids must be unique")
        seen[webhook.id] = webhook.url
    return webhooks
