"""Jobs (seed 001): a session budget's counters named by an opaque one-way key, and their
approvals.

A job is one (org, identity, session): the counter of a ``scope: session`` budget, whose
scope values are exactly these three (identity = the user id, else the secret id). What
people see of a job is :func:`job_key`, an HMAC-SHA256 of the three under a secret the
gateways, sidecars and the CLI share (derived from the key secret: spendbus/stack/key_secret.py),
so a listing never shows, and cannot be turned back into, a tenant, an identity or a session;
the approvals topic (``budget.approvals``) and the gateway's access log name both, for an
operator to correlate.

A job's approval steps (:class:`ApprovalStep`, record ``JobApproval``) are a request (an
enforcer whose policy answered ``approval``), then an operator's ``approve`` (a raise of the
job's session counter on ``budget.raises``) or ``deny``. :class:`ApprovalBook` folds them by
job key: the newest step says where each job stands.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from schemas.ids import compose
from schemas.periods import from_micros, to_micros

#: a job key's prefix, then this many hex digits of the HMAC (128 bits)
JOB_KEY_PREFIX: Final = "job-"
JOB_KEY_HEX: Final = 32
#: what the job-key secret is derived with from the key secret (one secret to keep)
JOB_KEY_CONTEXT: Final = b"spendbus job key v1"
#: the approval steps, as the record's enum names them
REQUEST: Final = "request"
APPROVE: Final = "approve"
DENY: Final = "deny"
#: a job's standing, from its newest step
PENDING: Final = "pending"
APPROVED: Final = "approved"
DENIED: Final = "denied"
_STANDING: Final = {REQUEST: PENDING, APPROVE: APPROVED, DENY: DENIED}


def job_key_secret(key_secret: bytes) -> bytes:
    """The job keys' HMAC secret, derived from the key secret (kept and shared like it)."""
    return hmac.new(key_secret, JOB_KEY_CONTEXT, hashlib.sha256).digest()


def job_key(secret: bytes, org_id: str, identity: str, session_id: str) -> str:
    """The opaque key of the job (org, identity, session): canonical ids, length-prefixed
    before hashing so no choice of ids makes two jobs share a key."""
    digest = hmac.new(secret, compose([org_id, identity, session_id]).encode(), hashlib.sha256)
    return JOB_KEY_PREFIX + digest.hexdigest()[:JOB_KEY_HEX]


@dataclass(frozen=True, slots=True)
class ApprovalStep:
    """One ``JobApproval`` record."""

    job_key: str
    kind: str
    at_us: int
    by: str
    org_id: str
    identity: str
    session_id: str
    budget_id: str | None = None
    reason: str = ""
    raise_id: str | None = None

    @property
    def scope_values(self) -> tuple[str, str, str]:
        """The job's session counter's scope values (what an approval raises)."""
        return (self.org_id, self.identity, self.session_id)

    def to_record(self) -> dict[str, Any]:
        return {
            "job_key": self.job_key,
            "kind": self.kind,
            "at": from_micros(self.at_us),
            "by": self.by,
            "org_id": self.org_id,
            "identity": self.identity,
            "session_id": self.session_id,
            "budget_id": self.budget_id,
            "reason": self.reason,
            "raise_id": self.raise_id,
        }

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> ApprovalStep:
        at: datetime = record["at"]
        return cls(
            job_key=record["job_key"],
            kind=record["kind"],
            at_us=to_micros(at),
            by=record["by"],
            org_id=record["org_id"],
            identity=record["identity"],
            session_id=record["session_id"],
            budget_id=record["budget_id"],
            reason=record["reason"],
            raise_id=record["raise_id"],
        )


class ApprovalBook:
    """Every job's approval steps in topic order; :meth:`standing` is the newest step's."""

    __slots__ = ("steps",)

    def __init__(self) -> None:
        self.steps: dict[str, list[ApprovalStep]] = {}

    def apply(self, step: ApprovalStep) -> None:
        self.steps.setdefault(step.job_key, []).append(step)

    def standing(self, key: str) -> str | None:
        """``pending``, ``approved`` or ``denied`` (None: never asked)."""
        steps = self.steps.get(key)
        return None if not steps else _STANDING[steps[-1].kind]

    def requested(self, key: str) -> bool:
        """A request is on the topic for the job's current round (asked, not yet decided)."""
        return self.standing(key) == PENDING

    def first(self, key: str) -> ApprovalStep | None:
        """The job's first step (its request: who the key stands for)."""
        steps = self.steps.get(key)
        return steps[0] if steps else None
