"""The Enforcer: state + follower + checker + holds, wired together.

Start/stop order (mirrored in :meth:`Enforcer.start` / :meth:`Enforcer.stop`):

1. start: the follower assigns the topics, records the end offsets and starts
   reading; checks answer by ``fail_mode`` until it is ready.
2. :meth:`Enforcer.wait_ready` returns once caught up (or raises NotReady).
   With ``membership``, the enforcer also joins the enforcers' group
   (enforcer/membership.py) and ``wait_ready`` waits for its first count.
3. stop: the membership leaves the group (the other replicas widen their shares
   at once), then the follower stops; the in-memory state is dropped with the object
   (holds are per-process and never persisted: the verdicts are the truth).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

from prometheus_client import CollectorRegistry

from enforcer.check import Checker
from enforcer.config import EnforcerConfig
from enforcer.context import Context
from enforcer.counters import CounterStatus
from enforcer.decision import Decision
from enforcer.errors import NotReady
from enforcer.follower import Follower
from enforcer.holds import Holds
from enforcer.membership import Membership
from enforcer.metrics import EnforcerMetrics
from enforcer.policy import Policy, PolicyError, PolicyGate
from enforcer.state import EnforcerState
from schemas.topics import Topics


class Enforcer:
    """Budget enforcement in-process: ``check`` from memory, fed by Kafka.

    ``clock`` (seconds since the epoch) is injectable: periods, staleness and
    hold timeouts all read it.
    """

    def __init__(
        self,
        config: EnforcerConfig | None = None,
        *,
        clock: Callable[[], float] = time.time,
        registry: CollectorRegistry | None = None,
        job_key_secret: bytes | None = None,
    ) -> None:
        """``job_key_secret``: what jobs' opaque keys are keyed with (schemas/jobs.py), needed
        with a ``policy_file``; a bad policy file raises PolicyError here."""
        self.config = config if config is not None else EnforcerConfig()
        self.clock = clock
        self.topics = Topics(self.config.topic_prefix)
        self.state = EnforcerState(clock)
        self.holds = Holds(self.config.hold_timeout_us)
        self.metrics = EnforcerMetrics(registry)
        self.metrics.bind(self.state, self.holds, clock)
        self.state.on_verdict(self.holds.on_verdict)
        self.checker = Checker(self.state, self.holds, self.config, self.metrics, clock)
        self.follower = Follower(self.config, self.state, self.holds, self.metrics, clock)
        #: with ``membership``: the live replica count, from the enforcers' consumer group
        self.membership = (
            Membership(self.config, clock, self.checker.set_replicas)
            if self.config.membership
            else None
        )
        self.metrics.bind_replicas(lambda: self.checker.replicas, self.membership)
        #: the Rego policy consulted after each check (None: no policy, nothing evaluated)
        self.policy: PolicyGate | None = None
        if self.config.policy_file is not None:
            if job_key_secret is None:
                raise PolicyError(
                    "policy_file needs the job key secret (derived from the key secret)"
                )
            self.policy = PolicyGate(
                self.config,
                Policy(self.config.policy_file, self.config.policy_query),
                self.state.approvals,
                self.checker.release,
                job_key_secret,
            )

    # --- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        await self.follower.start()
        if self.policy is not None:
            try:
                await self.policy.outbox.start()
            except BaseException:
                await self.follower.stop()
                raise
        if self.membership is not None:
            try:
                await self.membership.start()
            except BaseException:
                await self.follower.stop()
                raise

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Caught up with the verdicts and, with membership, told the replica count (until
        then a check assumes ``max_replicas``)."""
        limit = self.config.ready_timeout_s if timeout is None else timeout
        started = time.monotonic()
        if not await self.follower.wait_ready(limit):
            raise NotReady(
                f"not caught up with {self.topics.budget_verdicts} after {limit:g}s "
                f"({len(self.state.verdicts)} counters read so far)"
            )
        if self.membership is not None:
            left = max(0.0, limit - (time.monotonic() - started))
            if not await self.membership.wait_known(left):
                raise NotReady(
                    f"no member count from group {self.membership.group} after {limit:g}s "
                    f"(checks assume {self.config.max_replicas} replicas)"
                )

    async def stop(self) -> None:
        if self.membership is not None:
            await self.membership.stop()  # leave first: the others widen their shares
        if self.policy is not None:
            await self.policy.outbox.stop()
        await self.follower.stop()

    async def __aenter__(self) -> Enforcer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def ready(self) -> bool:
        return self.state.ready

    @property
    def stale(self) -> bool:
        """True when checks are decided by fail_mode (not ready, or verdicts older than grace)."""
        return self.checker.stale_reason(int(self.clock() * 1_000_000)) is not None

    # --- the API proxies call -----------------------------------------------------------------
    @staticmethod
    def context(**fields: Any) -> Context:
        """Build (and validate) a request context; see :class:`Context`."""
        return Context(**fields)

    def check(self, ctx: Context, *, reserve: bool = True) -> Decision:
        """Decide for one request, from memory. An allowed request holds its worst-case
        estimate (``decision.hold_id``) until :meth:`settle` or :meth:`release`. With a
        policy, its answer is applied to the decision (enforcer/policy.py)."""
        decision = self.checker.check(ctx, reserve=reserve)
        policy = self.policy
        if policy is None:
            return decision
        return policy.apply(decision, reserve)

    def peek(self, ctx: Context) -> Decision:
        """The decision check would take, holding nothing and counting as no request
        (for policy engines reading the flags)."""
        return self.checker.check(ctx, reserve=False)

    def settle(self, hold_id: int | None, event: Mapping[str, Any]) -> bool:
        """The request's UsageEvent was published: its hold becomes the actual cost."""
        return hold_id is not None and self.checker.settle(hold_id, event)

    def release(self, hold_id: int | None) -> bool:
        """The request never reached the provider: drop its hold."""
        return hold_id is not None and self.checker.release(hold_id)

    def usage(self, ctx: Context) -> list[CounterStatus]:
        """Every counter ``ctx`` counts in, with spend, holds, limits (no hold, no count)."""
        return self.checker.usage(ctx)
