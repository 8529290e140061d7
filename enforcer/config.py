"""The enforcer's configuration: one frozen, validated object.

Only the CLI (``spendbus enforcer serve`` / ``spendbus check``) reads the
environment or files; the library takes an :class:`EnforcerConfig`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator

from runtime.kafka import PLAINTEXT, KafkaSecurity
from runtime.net import LOOPBACK_HOSTS  # hosts the sidecar may bind without a token
from schemas.errors import ConfigError


class EnforcerConfig(BaseModel):
    """Everything the enforcer library and its sidecar need; immutable once built."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Kafka bootstrap servers (``host:port[,host:port]``)
    bootstrap: str = "127.0.0.1:9092"
    #: how the follower and the refusal producer connect (PLAINTEXT unless set)
    kafka_security: KafkaSecurity = PLAINTEXT
    #: prefix of every topic name (``schemas.topics.Topics(prefix)``)
    topic_prefix: str = ""
    #: what a check does while verdicts are stale or not yet loaded: ``open`` allows,
    #: ``closed`` answers 503 for requests an enforce budget applies to
    fail_mode: Literal["open", "closed"] = "open"
    #: how long the verdict stream may go unconfirmed before it counts as stale
    grace_s: float = Field(default=900.0, gt=0)
    #: ``default``: spendbus's own 402/429 JSON; ``native``: the error each provider SDK
    #: knows; ``seed000``: seed 000's 402 body (error, secretId, period, limitCents, spentCents)
    refusal_style: Literal["default", "native", "seed000"] = "default"
    #: a hold not settled (or, once settled, not covered by a verdict) is dropped after this
    hold_timeout_s: float = Field(default=600.0, gt=0)
    #: output tokens held for a request that does not say its max output tokens
    default_max_output_tokens: int = Field(default=8192, ge=1, le=100_000_000)
    #: an enforce budget with a USD limit, for a request whose model has no price (no
    #: entry, no fallback in the price table in force) and whose policy does not say:
    #: ``refuse`` (402 ``budget_exceeded``, reason ``model_unpriced``), or ``allow_free``
    #: (admitted and charged $0: the budget cannot cap it)
    unpriced_models: Literal["refuse", "allow_free"] = "refuse"
    #: how many enforcers (gateway replicas, sidecars) admit against the same budgets.
    #: Holds are per process, so each may commit at most 1/replicas of the headroom the
    #: verdict leaves: a check refuses in flight when
    #: ``spent + replicas × (own holds + this estimate) > limit``. 1 = one enforcer
    #: (the rule is then spent + holds + estimate > limit). Too low over-admits across
    #: replicas; too high refuses early (enforcer/README.md, "Several replicas").
    replicas: int = Field(default=1, ge=1, le=10_000)
    #: count the replicas instead: every enforcer joins the consumer group
    #: ``Topics.enforcer_group`` and learns the live count from each rebalance
    #: (enforcer/membership.py); ``replicas`` is then a floor
    membership: bool = False
    #: membership: the most replicas that may run (the autoscaler's maximum). A replica
    #: assumes this many until it knows the count and for ``membership_grace_s`` after
    #: it joined (its peers may still hold what their larger shares allowed)
    max_replicas: int = Field(default=16, ge=1, le=10_000)
    #: membership: after a change the largest count seen in this window is used (a
    #: scale-down widens the shares only once the replicas that left had time to finish)
    membership_grace_s: float = Field(default=10.0, ge=0)
    #: membership: how long a replica that died without leaving (kill -9) stays counted:
    #: Kafka's session timeout (the broker's group.min.session.timeout.ms, 6 s by default,
    #: is the least it accepts)
    membership_session_timeout_s: float = Field(default=6.0, gt=0, le=300)
    #: Retry-After of an in-flight refusal (holds settle within seconds)
    in_flight_retry_after_s: int = Field(default=5, ge=1)
    #: Retry-After of a fail-closed 503
    fail_closed_retry_after_s: int = Field(default=30, ge=1)
    #: gateway_id written on the refusal events this enforcer produces
    gateway_id: str = Field(default="spendbus-enforcer", min_length=1, max_length=200)
    #: Kafka client id
    client_id: str = Field(default="spendbus-enforcer", min_length=1)
    #: how long start-up may take to catch up before :class:`NotReady`
    ready_timeout_s: float = Field(default=120.0, gt=0)
    #: sidecar: listen address, port, bearer token (required unless bound to loopback)
    sidecar_host: str = "127.0.0.1"
    sidecar_port: int = Field(default=8787, ge=0, le=65535)
    sidecar_token: SecretStr | None = None
    #: sidecar: more callers' bearer tokens, each its own caller (a hold taken with one
    #: token is settled or released with that token only)
    sidecar_tokens: tuple[SecretStr, ...] = ()
    #: sidecar: serve /v1/* without a token (every local process may then read any org's
    #: spend and publish refusals): loopback only, logged at WARNING when it starts;
    #: without it (and without ``sidecar_unix``) the sidecar refuses to start tokenless
    sidecar_insecure_loopback: bool = False
    #: sidecar: listen on this unix socket (made 0600, its directory 0700 when made here)
    #: instead of host:port; the file's permissions fence it, so a token is optional
    sidecar_unix: str | None = None
    #: sidecar: seconds a client has to send a request head (also the longest a keep-alive
    #: connection idles; a slower sender is disconnected), and to send the body once the
    #: head is in (408 after)
    sidecar_header_timeout_s: float = Field(default=30.0, gt=0)
    sidecar_body_timeout_s: float = Field(default=60.0, gt=0)
    #: sidecar: holds of one key (the context's ``secret_id``) in flight at once (None: no
    #: limit); a check past it is refused ``throttled`` (429, Retry-After) before deciding
    sidecar_max_in_flight_per_key: int | None = Field(default=None, ge=1)
    #: sidecar: the Retry-After of that refusal, seconds
    sidecar_throttle_retry_after_s: int = Field(default=1, ge=1)
    #: new session ids (``session_id``, the gateway's ``X-Spend-Session``) one key
    #: (``secret_id``) may open per UTC day under an enforce session budget; past it a
    #: request with another new id is refused (429 ``job_budget_exceeded``, reason
    #: ``too_many_sessions``) and gets no counter (None: no bound). Per enforcer process.
    max_sessions_per_key: int | None = Field(default=1000, ge=1)
    #: sidecar: publish a refusal UsageEvent to usage.raw for every refused check
    publish_refusals: bool = True
    #: a Rego policy consulted on every check (enforcer/policy.py; None: none, and no cost)
    policy_file: Path | None = None
    #: the rule whose value is the policy's answer: "allow", "deny" or "approval"
    policy_query: str = Field(default="data.spendbus.decision", min_length=1)
    #: Retry-After of an ``approval_required`` refusal (a person decides: minutes, not seconds)
    approval_retry_after_s: int = Field(default=60, ge=1)

    @model_validator(mode="after")
    def _token_off_loopback(self) -> EnforcerConfig:
        tokens = self.sidecar_token_values
        if self.sidecar_tokens and self.sidecar_token is None:
            raise ValueError("sidecar_tokens adds callers to sidecar_token: set that first")
        if not tokens and self.sidecar_unix is None and self.sidecar_host not in LOOPBACK_HOSTS:
            raise ValueError(
                f"sidecar_token is required when the sidecar listens on {self.sidecar_host!r} "
                "(only loopback may go without one)"
            )
        if any(not token for token in tokens) or (
            self.sidecar_token is not None and not self.sidecar_token.get_secret_value()
        ):
            raise ValueError("sidecar_token must not be empty")
        if self.sidecar_insecure_loopback and tokens:
            raise ValueError("sidecar_insecure_loopback and sidecar_token are both set: keep one")
        if self.sidecar_insecure_loopback and self.sidecar_unix is not None:
            raise ValueError(
                "sidecar_insecure_loopback is for host:port; a unix socket is fenced by its "
                "permissions"
            )
        return self

    @property
    def sidecar_token_values(self) -> tuple[str, ...]:
        """Every bearer token the sidecar accepts (``sidecar_token``, then ``sidecar_tokens``)."""
        first = () if self.sidecar_token is None else (self.sidecar_token.get_secret_value(),)
        return first + tuple(t.get_secret_value() for t in self.sidecar_tokens)

    @property
    def grace_us(self) -> int:
        return int(self.grace_s * 1_000_000)

    @property
    def hold_timeout_us(self) -> int:
        return int(self.hold_timeout_s * 1_000_000)


def load_config(source: str = "<enforcer config>", **values: Any) -> EnforcerConfig:
    """Build a config; a bad value raises ConfigError naming the field (for the CLI)."""
    try:
        return EnforcerConfig(**{k: v for k, v in values.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        path = ".".join(str(p) for p in first["loc"]) or "<config>"
        message = first["msg"].removeprefix("Value error, ")
        raise ConfigError(f"{source}: field {path!r}: {message}") from None
