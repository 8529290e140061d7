"""A Rego policy consulted after the budget check (seed 001): :class:`Policy`, :class:`PolicyGate`.

The policy (``policy_file``, real Rego evaluated by ``regopy``, Microsoft's rego-cpp) reads
the check's decision and the request (:func:`policy_input`: ``input.job_over_budget``,
``input.over_budget``, the org, key, model and session, the job's spent / limit /
remaining...) and answers ``allow``, ``deny`` or ``approval`` at ``policy_query``. Reading
it is read only: it creates no hold and counts nothing; a refusal it makes releases the
hold the check took.

- ``allow``: the check's decision stands (a policy never lifts a limit).
- ``deny``: 403 ``policy_denied``.
- ``approval``: the job (org, identity, session) waits for a person: 429
  ``approval_required`` with Retry-After, and one ``request`` step goes on
  ``budget.approvals`` per job (the first time; the follower reads the topic back, so
  every replica knows it was asked). ``spendbus approvals approve`` raises the job's
  session counter (a raise on ``budget.raises``) and records ``approve``: the check then
  admits it and the policy's answer is taken as given; ``deny`` records ``deny``: the job
  is refused (403 ``approval_denied``). An approved job over its raised ceiling asks again.

A bad policy file (unreadable, not Rego, no answer at ``policy_query`` for a sample input)
raises :class:`PolicyError` when the enforcer is made. An evaluation that fails (a
conflict, an error, an answer other than the three) is logged and counted, and the request
is decided by ``fail_mode``: ``open`` keeps the check's decision, ``closed`` answers 503
``failed_closed`` with reason ``policy_error``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import regopy
from aiokafka import AIOKafkaProducer

from enforcer.config import EnforcerConfig
from enforcer.context import Context
from enforcer.counters import CounterStatus
from enforcer.decision import Decision
from enforcer.errors import EnforcerError
from schemas.codec import JOB_APPROVAL
from schemas.jobs import APPROVED, DENIED, REQUEST, ApprovalBook, ApprovalStep, job_key
from schemas.topics import Topics
from schemas.usage import APPROVAL_DENIED, APPROVAL_REQUIRED, FAILED_CLOSED, POLICY_DENIED

log = logging.getLogger("spendbus.enforcer.policy")

#: the policy's answers
ALLOW: Final = "allow"
DENY: Final = "deny"
APPROVAL: Final = "approval"
ANSWERS: Final = (ALLOW, DENY, APPROVAL)
#: the reason of a failed_closed decision made because the policy could not be evaluated
POLICY_ERROR: Final = "policy_error"
#: approval requests waiting for the producer, at most (a broker away for long drops the
#: newest, logged: the job stays held and asks again after a restart)
OUTBOX_LIMIT: Final = 10_000
#: seconds between attempts to publish an approval request while the broker refuses it
PUBLISH_RETRY_S: Final = 1.0


class PolicyError(EnforcerError):
    """The policy file cannot be used (named, with the reason): found at start."""


class PolicyEvaluationError(EnforcerError):
    """One evaluation failed (a rule conflict, an error, an answer not in ANSWERS)."""


_SAMPLE_INPUT: Final[dict[str, Any]] = {
    "org_id": "org",
    "key": "secret",
    "user_id": None,
    "session_id": "session",
    "job_key": "job-0",
    "model": "model",
    "provider": "openai",
    "api": "openai.chat",
    "decision": "allowed",
    "allowed": True,
    "over_budget": False,
    "job_over_budget": False,
    "exceeded_budgets": [],
    "budget_id": None,
    "spent": None,
    "limit": None,
    "remaining": None,
    "approval": None,
    "counters": [],
}


class Policy:
    """One Rego policy file, compiled once; :meth:`decide` evaluates it for one input."""

    def __init__(self, path: Path, query: str) -> None:
        self.path = path
        self.query = query
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise PolicyError(f"policy_file {str(path)!r}: cannot read it: {exc}") from None
        self._interpreter = regopy.Interpreter()
        try:
            self._interpreter.add_module(path.name, text)
            self._bundle = self._interpreter.build(query)
        except regopy.RegoError as exc:
            raise PolicyError(f"policy_file {str(path)!r}: not valid Rego: {exc}") from None
        try:
            answer = self.decide(_SAMPLE_INPUT)
        except PolicyEvaluationError as exc:
            raise PolicyError(f"policy_file {str(path)!r}: {exc}") from None
        log.info("policy %s loaded (%s answers %r for a sample input)", path, query, answer)

    def decide(self, document: dict[str, Any]) -> str:
        """The policy's answer for ``document`` (``input``); raises PolicyEvaluationError."""
        interpreter = self._interpreter
        try:
            interpreter.set_input_term(json.dumps(document, separators=(",", ":")))
            output = interpreter.query_bundle(self._bundle)
        except regopy.RegoError as exc:
            raise PolicyEvaluationError(f"{self.query}: {exc}") from None
        if not output.ok():
            raise PolicyEvaluationError(f"{self.query}: evaluation failed ({output})")
        text = str(output)
        if text == "undefined":
            raise PolicyEvaluationError(
                f'{self.query} is undefined (give it a default: default decision := "allow")'
            )
        try:
            values = json.loads(text)["expressions"]
        except (ValueError, KeyError, TypeError):
            raise PolicyEvaluationError(f"{self.query}: unexpected result {text[:200]}") from None
        if len(values) != 1 or values[0] not in ANSWERS:
            raise PolicyEvaluationError(
                f"{self.query} answered {text[:200]}; expected one of {', '.join(ANSWERS)}"
            )
        answer: str = values[0]
        return answer


def job_counter(decision: Decision) -> CounterStatus | None:
    """The request's job counter: the refusing session counter, else its first session
    counter, else the refusing counter."""
    refusing = decision.refusing
    if refusing is not None and refusing.plan.scope == "session":
        return refusing
    for row in decision.counters:
        if row.plan.scope == "session":
            return row
    return refusing


def _limits(row: CounterStatus) -> dict[str, dict[str, int | None]]:
    return {
        "spent": {
            "nanos": row.spent_nanos,
            "tokens": row.spent_tokens,
            "requests": row.spent_requests,
        },
        "limit": {
            "nanos": row.limit_nanos,
            "tokens": row.limit_tokens,
            "requests": row.limit_requests,
        },
        "remaining": row.remaining(),
    }


def policy_input(decision: Decision, key: str, standing: str | None) -> dict[str, Any]:
    """The policy's ``input``: the request, the check's decision and the job's counter."""
    ctx = decision.ctx
    job = job_counter(decision)
    document: dict[str, Any] = {
        "org_id": ctx.org_id,
        "key": ctx.secret_id,
        "user_id": ctx.user_id,
        "session_id": ctx.session_id,
        "job_key": key,
        "model": ctx.model,
        "provider": ctx.provider,
        "api": ctx.api,
        "decision": decision.decision,
        "allowed": decision.allowed,
        "over_budget": decision.over_budget,
        "job_over_budget": decision.job_over_budget,
        "exceeded_budgets": list(decision.exceeded_budgets),
        "budget_id": None if job is None else job.plan.budget_id,
        "spent": None,
        "limit": None,
        "remaining": None,
        "approval": standing,
        "counters": [
            {"budget_id": r.plan.budget_id, "scope": r.plan.scope, "state": r.state, **_limits(r)}
            for r in decision.counters
        ],
    }
    if job is not None:
        document.update(_limits(job))
    return document


class ApprovalOutbox:
    """Approval requests made by checks (no I/O there), published in the background."""

    def __init__(self, config: EnforcerConfig, topic: str) -> None:
        self.config = config
        self.topic = topic
        self._queue: asyncio.Queue[ApprovalStep] = asyncio.Queue(OUTBOX_LIMIT)
        self._task: asyncio.Task[None] | None = None
        self._producer: AIOKafkaProducer | None = None
        self.published = 0
        self.dropped = 0

    def put(self, step: ApprovalStep) -> None:
        try:
            self._queue.put_nowait(step)
        except asyncio.QueueFull:
            self.dropped += 1
            log.warning("approval request of %s dropped: %d waiting", step.job_key, OUTBOX_LIMIT)

    async def start(self) -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=self.config.bootstrap,
            client_id=f"{self.config.client_id}-approvals",
            acks="all",
            enable_idempotence=True,
            **self.config.kafka_security.client_kwargs(),
        )
        await producer.start()
        self._producer = producer
        self._task = asyncio.create_task(self._run(), name="spendbus-enforcer-approvals")

    async def _run(self) -> None:
        producer = self._producer
        assert producer is not None
        while True:
            step = await self._queue.get()
            value = JOB_APPROVAL.encode(step.to_record())
            while True:
                try:
                    await producer.send_and_wait(self.topic, value, key=step.job_key.encode())
                    self.published += 1
                    break
                except Exception as exc:  # the broker away, the topic missing: retried
                    log.warning("approval request of %s not published: %s", step.job_key, exc)
                    await asyncio.sleep(PUBLISH_RETRY_S)

    async def stop(self) -> None:
        if self._task is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._drain(), 5)
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        if self._producer is not None:
            await self._producer.stop()

    async def _drain(self) -> None:
        while not self._queue.empty():
            await asyncio.sleep(0.02)


class PolicyGate:
    """The policy applied to each check's decision (``Enforcer.check`` calls :meth:`apply`
    only when a policy is configured)."""

    def __init__(
        self,
        config: EnforcerConfig,
        policy: Policy,
        approvals: ApprovalBook,
        release: Callable[[int], bool],
        job_key_secret: bytes,
    ) -> None:
        self.config = config
        self.policy = policy
        self.approvals = approvals
        #: the checker's release: drops a hold and gives back its rate
        self.release = release
        self.secret = job_key_secret
        self.outbox = ApprovalOutbox(config, Topics(config.topic_prefix).budget_approvals)
        #: evaluations by answer, and "error"
        self.answers: Counter[str] = Counter()

    def job_key_of(self, ctx: Context) -> str:
        return job_key(self.secret, ctx.org, ctx.user or ctx.secret, ctx.session)

    def apply(self, decision: Decision, reserve: bool) -> Decision:
        ctx = decision.ctx
        key = self.job_key_of(ctx)
        standing = self.approvals.standing(key)
        try:
            answer = self.policy.decide(policy_input(decision, key, standing))
        except PolicyEvaluationError as exc:
            self.answers["error"] += 1
            log.warning("policy %s failed for org %r: %s", self.policy.path, ctx.org_id, exc)
            if self.config.fail_mode == "open":
                return decision
            return self._refuse(decision, FAILED_CLOSED, "failed_closed", key, POLICY_ERROR)
        self.answers[answer] += 1
        if answer == ALLOW:
            return decision
        if answer == DENY:
            return self._refuse(decision, POLICY_DENIED, "refused", key, None)
        # approval
        if standing == DENIED:
            return self._refuse(decision, APPROVAL_DENIED, "refused", key, None)
        if standing == APPROVED and (decision.allowed or not decision.job_over_budget):
            return decision  # approved: the check's own answer (the raise lifted the ceiling)
        if not ctx.session:
            # no job to hold (no session id): nothing an approval could raise
            return self._refuse(decision, POLICY_DENIED, "refused", key, "no_session")
        if reserve and not self.approvals.requested(key):
            job = job_counter(decision)
            step = ApprovalStep(
                job_key=key,
                kind=REQUEST,
                at_us=decision.now_us,
                by=self.config.gateway_id,
                org_id=ctx.org,
                identity=ctx.user or ctx.secret,
                session_id=ctx.session,
                budget_id=None
                if job is None or job.plan.scope != "session"
                else job.plan.budget_id,
                reason=f"policy answered approval ({decision.decision})",
            )
            self.approvals.apply(step)  # asked: every later check of the job waits for it
            self.outbox.put(step)
        return self._refuse(decision, APPROVAL_REQUIRED, "refused", key, None)

    def _refuse(
        self, decision: Decision, value: str, outcome: str, key: str, reason: str | None
    ) -> Decision:
        if decision.hold_id is not None:
            self.release(decision.hold_id)  # consulting the policy counts nothing
        job = job_counter(decision)
        rows = list(decision.counters)
        refusal = -1 if job is None else rows.index(job)
        refused = Decision(
            decision.ctx,
            value,
            outcome,
            rows,
            refusal,
            decision.now_us,
            self.config,
            None,
            reason,
        )
        refused.job_key = key
        return refused
