"""The gateway's configuration: one frozen, validated object read from YAML.

The file also carries the sections the composition hands to the other rooms
(``kafka``, ``enforcer``, ``publisher``); they are kept here as plain maps and
validated by their own config classes in ``spendbus/commands/gateway.py``, with
errors naming this file and the field. Credentials are named by environment
variable and resolved by the caller (:meth:`GatewayConfig.credentials`), so
this module never reads the environment.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from schemas.errors import ConfigError
from schemas.ids import MAX_ID_LENGTH
from schemas.virtual_keys import key_digest, keyed_digest

from .families import Api
from .headers import NEVER_FORWARDED

DEFAULT_SESSION_HEADER = "X-Spend-Session"


#: the least estimated entropy of a key given in clear (what ``spendbus keys new`` makes: 256)
MIN_KEY_BITS = 128


def key_bits(key: str) -> float:
    """A conservative estimate of a key's entropy in bits.

    Each character counts log2 of the alphabet its classes span (lower, upper, digits,
    others); a character that repeats or continues a run of its predecessor (``aaaa``,
    ``0123``, ``dcba``) counts one bit. It cannot see dictionary words: it only refuses
    keys that are certainly too weak.
    """
    if not key:
        return 0.0
    alphabet = (
        26 * any(c.islower() for c in key)
        + 26 * any(c.isupper() for c in key)
        + 10 * any(c.isdigit() for c in key)
        + 33 * any(not c.isalnum() for c in key)
    )
    per_char = math.log2(max(alphabet, 2))
    bits = per_char
    for prev, cur in itertools.pairwise(key):
        bits += 1.0 if abs(ord(cur) - ord(prev)) <= 1 else per_char
    return bits


def weak_key_problem(key: str) -> str | None:
    """Why ``key`` is too weak to be a virtual key, or None."""
    bits = key_bits(key)
    if bits < MIN_KEY_BITS:
        return (
            f"too weak: about {bits:.0f} bits of entropy, at least {MIN_KEY_BITS} needed "
            "(make one with `spendbus keys new`)"
        )
    return None


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Listen(_Frozen):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)


class Upstream(_Frozen):
    """One provider endpoint: which API it speaks and where."""

    api: Api
    base_url: str = Field(min_length=1)
    #: the ``provider`` written on usage events (defaults to ``api``; e.g. ``azure``)
    provider: str | None = None

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value.rstrip("/")

    @property
    def provider_name(self) -> str:
        return self.provider or self.api


class Secret(_Frozen):
    """One upstream credential (the ``secret_id`` budgets and events name).

    ``upstream`` names where it is used; a list names several upstreams of
    different APIs for a credential that works with all of them (a
    multi-provider router's key, a local fake): each request goes to the one
    speaking its API.
    """

    upstream: str | tuple[str, ...]
    #: environment variable holding the credential (preferred)
    api_key_env: str | None = None
    #: the credential itself (tests and local setups only: prefer ``api_key_env``)
    api_key: str | None = None

    @property
    def upstream_names(self) -> tuple[str, ...]:
        return (self.upstream,) if isinstance(self.upstream, str) else self.upstream

    @model_validator(mode="after")
    def _one_source(self) -> Secret:
        if not self.upstream_names or not all(self.upstream_names):
            raise ValueError("upstream: name at least one upstream")
        if (self.api_key_env is None) == (self.api_key is None):
            raise ValueError("give exactly one of api_key_env and api_key")
        return self


def _id_field(value: str | None, *, required: bool = False) -> str | None:
    if value is None:
        if required:
            raise ValueError("required")
        return None
    if not value.strip():
        raise ValueError("must not be blank")
    if len(value) > MAX_ID_LENGTH:
        raise ValueError(f"longer than {MAX_ID_LENGTH} characters")
    return value


class Principal(_Frozen):
    """Who a virtual key is: every id the budgets and usage events use."""

    org_id: str
    secret_id: str
    project_id: str | None = None
    grant_id: str | None = None
    user_id: str | None = None
    groups: tuple[str, ...] = ()
    tags: dict[str, str] = Field(default_factory=dict)

    @field_validator("org_id", "secret_id")
    @classmethod
    def _required(cls, value: str) -> str:
        return _id_field(value, required=True) or value

    @field_validator("project_id", "grant_id", "user_id")
    @classmethod
    def _optional(cls, value: str | None) -> str | None:
        return _id_field(value)

    @field_validator("groups")
    @classmethod
    def _groups(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for group in value:
            _id_field(group, required=True)
        return value


class VirtualKey(_Frozen):
    """A key clients present; only its digest needs to be stored.

    ``key_hmac`` (keyed with the server-side key secret) is the stored form;
    ``key_sha256`` is the legacy unsalted one, still read (converted with the secret
    when loaded); ``key`` in clear is for local setups and tests.
    """

    #: a name for logs, metrics and the automatic session ids (unique)
    name: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9._@-]+$")
    key: str | None = Field(default=None, min_length=16)
    key_hmac: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    key_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    principal: Principal

    @model_validator(mode="after")
    def _one_key(self) -> VirtualKey:
        if sum(v is not None for v in (self.key, self.key_hmac, self.key_sha256)) != 1:
            raise ValueError("give exactly one of key, key_hmac and key_sha256")
        return self

    @property
    def identity(self) -> str:
        """What tells two entries of one form apart without the secret (duplicates)."""
        if self.key_hmac is not None:
            return f"hmac:{self.key_hmac}"
        return f"sha256:{self.key_sha256 or key_digest(self.key or '')}"

    @property
    def legacy(self) -> bool:
        """Stored as the unsalted SHA-256 (``spendbus keys migrate`` rewrites it)."""
        return self.key_sha256 is not None

    def digest(self, secret: bytes) -> str:
        """The keyed digest this key is looked up by, under ``secret``."""
        if self.key_hmac is not None:
            return self.key_hmac
        return keyed_digest(secret, self.key_sha256 or key_digest(self.key or ""))


class Sessions(_Frozen):
    #: the header agent frameworks set to name a job (its value is scoped by org)
    header: str = Field(default=DEFAULT_SESSION_HEADER, min_length=1)
    #: without the header: one session per key, ending after this many idle seconds
    idle_ttl_s: float = Field(default=1800.0, gt=0)
    #: False: requests without the header carry no session (session budgets do not apply)
    auto: bool = True
    #: keys whose automatic session is remembered at once (least recently used forgotten)
    max_tracked: int = Field(default=100_000, ge=1)


class KeysTopic(_Frozen):
    """Follow the compacted keys topic (``Topics.gateway_keys``) beside the file's keys.

    The gateway reads it from the start and listens only once it has caught up
    with the end offsets seen at start; later records apply live (a tombstone
    revokes at once). A key in this file always wins over the topic: a topic
    record for the same digest or name is skipped and counted (README.md).
    """

    follow: bool = False
    #: seconds to catch up with the topic before the gateway refuses to start
    ready_timeout_s: float = Field(default=60.0, gt=0)


class GatewayConfig(_Frozen):
    """Everything the gateway itself needs (see infra/gateway/gateway.example.yaml)."""

    gateway_id: str = Field(default="spendbus-gateway", min_length=1, max_length=200)
    listen: Listen = Field(default_factory=Listen)
    upstreams: dict[str, Upstream]
    secrets: dict[str, Secret]
    keys: tuple[VirtualKey, ...] = ()
    keys_topic: KeysTopic = Field(default_factory=KeysTopic)
    sessions: Sessions = Field(default_factory=Sessions)
    #: largest request body accepted (413 above)
    max_body_bytes: int = Field(default=32 * 1024 * 1024, ge=1024)
    #: seconds a client has to send each request's head (headers), which is also the
    #: longest a keep-alive connection stays idle: a slower sender is disconnected
    header_timeout_s: float = Field(default=30.0, gt=0)
    #: seconds a client has to send a request's body once its head is in (408 after)
    body_timeout_s: float = Field(default=60.0, gt=0)
    #: seconds to connect to an upstream, and the longest silence while reading from it
    connect_timeout_s: float = Field(default=10.0, gt=0)
    read_timeout_s: float = Field(default=600.0, gt=0)
    #: connections to the upstreams open at once; a request waits at most
    #: ``connect_timeout_s`` for one (then 502, released, not charged)
    max_upstream_connections: int = Field(default=1024, ge=1)
    #: requests of one virtual key in flight at once (None: no limit); one more is
    #: answered 429 ``throttled`` with Retry-After, never forwarded nor charged
    max_in_flight_per_key: int | None = Field(default=None, ge=1)
    #: the Retry-After of that answer, seconds
    throttle_retry_after_s: int = Field(default=1, ge=1)
    #: ask OpenAI Chat for a stream's usage (``stream_options.include_usage``) when the
    #: client did not, and hide it from the client (stream_usage.py); False: such streams
    #: are estimated (for an OpenAI-compatible upstream that refuses the option)
    ask_stream_usage: bool = True
    #: one INFO line per request on ``spendbus.gateway.access`` (access_log.py): method,
    #: path without query, status, latency, decision and deciding budget, never a secret
    access_log: bool = False
    #: request headers forwarded to the upstreams beside the per-provider allowlist
    #: (headers.py): names, or prefixes ending in ``-`` (e.g. OpenRouter's ``x-title``)
    forward_request_headers: tuple[str, ...] = ()
    #: what the other rooms are configured with (validated by the composition)
    kafka: dict[str, Any] = Field(default_factory=dict)
    enforcer: dict[str, Any] = Field(default_factory=dict)
    publisher: dict[str, Any] = Field(default_factory=dict)

    @field_validator("forward_request_headers")
    @classmethod
    def _forwardable(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        out = tuple(v.strip().lower() for v in value)
        for name in out:
            if not name or not all(c.isalnum() or c == "-" for c in name):
                raise ValueError(f"{name!r} is not a header name (or a prefix ending in '-')")
            if name in NEVER_FORWARDED or any(
                n.startswith(name) for n in NEVER_FORWARDED if name.endswith("-")
            ):
                raise ValueError(
                    f"{name!r} is never forwarded (credentials, cookies, framing, account)"
                )
        return out

    @model_validator(mode="after")
    def _references(self) -> GatewayConfig:
        for secret_id, secret in self.secrets.items():
            _id_field(secret_id, required=True)
            apis: set[str] = set()
            for name in secret.upstream_names:
                if name not in self.upstreams:
                    raise ValueError(f"secrets.{secret_id}.upstream: no upstream named {name!r}")
                api = self.upstreams[name].api
                if api in apis:
                    raise ValueError(
                        f"secrets.{secret_id}.upstream: two upstreams speak the {api} API"
                    )
                apis.add(api)
        names: set[str] = set()
        identities: set[str] = set()
        for i, vk in enumerate(self.keys):
            if vk.principal.secret_id not in self.secrets:
                raise ValueError(
                    f"keys.{i}.principal.secret_id: no secret named {vk.principal.secret_id!r}"
                )
            if vk.name in names:
                raise ValueError(f"keys.{i}.name: {vk.name!r} is used twice")
            if vk.identity in identities:
                raise ValueError(f"keys.{i}: the same key is given twice")
            names.add(vk.name)
            identities.add(vk.identity)
        return self

    def weak_keys(self) -> list[tuple[str, str]]:
        """(name, problem) of every key given in clear that is too weak to guess-proof."""
        return [
            (vk.name, problem)
            for vk in self.keys
            if vk.key is not None and (problem := weak_key_problem(vk.key)) is not None
        ]

    def credentials(self, environ: Mapping[str, str], source: str = "<gateway>") -> dict[str, str]:
        """secret_id -> upstream credential; a missing variable raises ConfigError."""
        out: dict[str, str] = {}
        for secret_id, secret in self.secrets.items():
            if secret.api_key is not None:
                out[secret_id] = secret.api_key
                continue
            assert secret.api_key_env is not None
            value = environ.get(secret.api_key_env, "")
            if not value:
                raise ConfigError(
                    f"{source}: field 'secrets.{secret_id}.api_key_env': "
                    f"environment variable {secret.api_key_env} is not set"
                )
            out[secret_id] = value
        return out


def _first_error(exc: ValidationError) -> tuple[str, str]:
    """(field path, reason) of a validation error's first problem."""
    first = exc.errors()[0]
    path = ".".join(str(p) for p in first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    if not path:  # a check across fields names its field first: "a.b: reason"
        path, _, message = message.partition(": ") if ": " in message else ("<config>", "", message)
    return path, message


def parse_config(data: Any, source: str = "<gateway config>") -> GatewayConfig:
    """Validate already-parsed YAML; ConfigError names ``source`` and the field."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level")
    try:
        return GatewayConfig(**data)
    except ValidationError as exc:
        path, message = _first_error(exc)
        raise ConfigError(f"{source}: field {path!r}: {message}") from None


def parse_key_entries(data: Any, source: str = "<keys>") -> tuple[VirtualKey, ...]:
    """Key entries as a gateway config's ``keys`` accepts them: a YAML list, or a mapping
    with only ``keys``. ConfigError names ``source``, the entry and the field."""
    if isinstance(data, dict) and set(data) == {"keys"}:
        data = data["keys"]
    if not isinstance(data, list):
        raise ConfigError(f"{source}: expected a list of key entries (or a mapping with 'keys')")
    out: list[VirtualKey] = []
    names: dict[str, int] = {}
    digests: dict[str, int] = {}
    for i, entry in enumerate(data):
        label = f"entry {i}"
        if isinstance(entry, dict) and isinstance(entry.get("name"), str):
            label += f" ({entry['name']!r})"
        if not isinstance(entry, dict):
            raise ConfigError(f"{source}: {label}: expected a mapping")
        try:
            vk = VirtualKey(**entry)
        except ValidationError as exc:
            path, message = _first_error(exc)
            raise ConfigError(f"{source}: {label}: field {path!r}: {message}") from None
        if vk.name in names:
            raise ConfigError(
                f"{source}: {label}: field 'name': {vk.name!r} is used by entry {names[vk.name]} too"
            )
        if vk.identity in digests:
            raise ConfigError(
                f"{source}: {label}: the same key is given by entry {digests[vk.identity]} too"
            )
        names[vk.name] = digests[vk.identity] = i
        out.append(vk)
    return tuple(out)


def load_config(path: str | Path) -> GatewayConfig:
    """Read and validate a gateway YAML file."""
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{file}: not valid YAML: {exc}") from None
    return parse_config(data, str(file))
