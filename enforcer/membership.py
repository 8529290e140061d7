"""How many enforcers share the budgets, learnt from Kafka's group membership.

Each enforcer may commit at most 1/R of the headroom a verdict leaves (README, "Several
replicas"). With ``EnforcerConfig.membership`` R is not configured but counted: every
enforcer of the stack joins one consumer group of its own (``Topics(prefix)`` +
``spendbus-enforcers``, :func:`group_id`) and the group protocol does the counting. The
group's leader runs :class:`CountingAssignor`, which sees every member of the
generation and writes their number into each member's assignment (its user data), so
every member learns the same count in the same rebalance:

* a replica that starts joins the group: a rebalance, every member learns N + 1 within
  a heartbeat (``heartbeat_interval``, 1 s);
* a replica that stops leaves the group (LeaveGroup): the same, at once;
* a replica killed without leaving (kill -9, a lost node) stays counted until its
  session times out (``membership_session_timeout_s``, 6 s: Kafka's minimum by
  default), then the broker rebalances.

The group subscribes to ``budget.policies`` (one partition, which every enforcer reads
anyway; the member given it never fetches: its partitions are paused), so no topic is
created and no offset is ever committed.

Safety while the count changes (:meth:`Membership.effective`, what the checker uses):

* until this replica has a count, and for ``membership_grace_s`` after it first got
  one, it assumes ``max_replicas`` (the most the autoscaler runs): a new replica's
  peers may still hold what their larger share allowed; it errs toward less headroom;
* after a change, the largest count seen within ``membership_grace_s`` is used: a
  scale-down only widens the shares once the replicas that left had time to finish
  and publish what they admitted;
* ``EnforcerConfig.replicas`` stays a floor (an explicit override: fleets that mix
  members and enforcers without membership).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

from enforcer.config import EnforcerConfig
from schemas.topics import Topics

log = logging.getLogger("spendbus.enforcer.membership")

#: the group protocol's name: every member must run it (the broker refuses a member
#: with no protocol in common)
PROTOCOL = "spendbus-enforcer-count"
#: the count in an assignment's user data: one unsigned 32-bit integer, big-endian
_COUNT = struct.Struct(">I")
#: how often (seconds) the effective count is recomputed (grace periods end with time)
TICK_S = 0.25


def group_id(topics: Topics) -> str:
    """The consumer group every enforcer of the stack named by ``topics`` joins."""
    return topics.enforcer_group


class CountingAssignor(AbstractPartitionAssignor):  # type: ignore[misc]  # aiokafka has no types: the base is Any
    """Assigns the subscribed partitions to one member (nobody reads them) and tells
    every member how many members the generation has."""

    name = PROTOCOL
    version = 0

    def __init__(self, on_count: Callable[[int], None]) -> None:
        self.on_count = on_count

    def assign(
        self,
        cluster: ClusterMetadata,
        members: Mapping[str, ConsumerProtocolMemberMetadata],
    ) -> dict[str, ConsumerProtocolMemberAssignment]:
        count = _COUNT.pack(len(members))
        first = min(members)
        topics = sorted({t for m in members.values() for t in m.subscription})
        given = [
            ConsumerProtocolMemberAssignment.Assignment(
                topic, sorted(cluster.partitions_for_topic(topic) or ())
            )
            for topic in topics
        ]
        return {
            member: ConsumerProtocolMemberAssignment(
                self.version, given if member == first else [], count
            )
            for member in members
        }

    def metadata(self, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        return ConsumerProtocolMemberMetadata(self.version, sorted(topics), b"")

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:
        if len(assignment.user_data) == _COUNT.size:
            self.on_count(_COUNT.unpack(assignment.user_data)[0])
        else:  # not our protocol's data: keep the count we had (and say so)
            log.warning("assignment without a member count (%d bytes)", len(assignment.user_data))


class _Pause(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka has no types: the base is Any
    """The member given the partition never fetches it."""

    def __init__(self, consumer: AIOKafkaConsumer) -> None:
        self.consumer = consumer

    async def on_partitions_revoked(self, revoked: Any) -> None:
        return None

    async def on_partitions_assigned(self, assigned: Any) -> None:
        if assigned:
            self.consumer.pause(*assigned)


class Membership:
    """This enforcer's membership in the enforcers' group, and the count it implies."""

    def __init__(
        self,
        config: EnforcerConfig,
        clock: Callable[[], float],
        on_change: Callable[[int], None],
    ) -> None:
        self.config = config
        self.clock = clock
        self.on_change = on_change
        self.group = group_id(Topics(config.topic_prefix))
        #: the count of the latest generation this member was told (None: not yet)
        self.count: int | None = None
        #: when this member first got a count (its grace as a newcomer runs from there)
        self.joined_at: float | None = None
        #: (clock time, count) of every change, newest last (pruned past the grace window)
        self.changes: list[tuple[float, int]] = []
        #: the generations this member saw (one per rebalance it took part in)
        self.rebalances = 0
        self._known = asyncio.Event()
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None
        self._effective = max(config.replicas, config.max_replicas)

    # --- the count ------------------------------------------------------------------------
    def _on_count(self, count: int) -> None:
        now = self.clock()
        self.rebalances += 1
        if self.count != count:
            log.info("enforcers in group %s: %s -> %d", self.group, self.count, count)
            self.changes.append((now, count))
        if self.joined_at is None:
            self.joined_at = now
        self.count = count
        self._known.set()
        self._publish(now)

    def effective(self, now: float) -> int:
        """The replica count a check must use now (module docstring: the safety rules)."""
        config = self.config
        floor = config.replicas
        if self.count is None or self.joined_at is None:
            return max(floor, config.max_replicas, self.count or 0)
        grace = config.membership_grace_s
        if now - self.joined_at < grace:
            return max(floor, config.max_replicas, self.count)
        largest = self.count
        # the count in force when the window opened, and every one since
        before = [c for t, c in self.changes if t <= now - grace]
        if before:
            largest = max(largest, before[-1])
        for t, c in self.changes:
            if t > now - grace:
                largest = max(largest, c)
        return max(floor, largest)

    def _publish(self, now: float) -> None:
        effective = self.effective(now)
        if effective != self._effective:
            log.info("enforcer share: 1/%d of the headroom (was 1/%d)", effective, self._effective)
        self._effective = effective
        self.on_change(effective)
        # keep the last change before the window (it is the count the window opened with)
        horizon = now - self.config.membership_grace_s
        while len(self.changes) > 1 and self.changes[1][0] <= horizon:
            self.changes.pop(0)

    @property
    def replicas(self) -> int:
        """The effective count last published to the checker."""
        return self._effective

    async def wait_known(self, timeout: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._known.wait(), timeout)
        return self._known.is_set()

    # --- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        config = self.config
        session_ms = int(config.membership_session_timeout_s * 1000)
        consumer = AIOKafkaConsumer(
            bootstrap_servers=config.bootstrap,
            group_id=self.group,
            client_id=f"{config.client_id}-membership",
            enable_auto_commit=False,
            auto_offset_reset="latest",
            partition_assignment_strategy=(CountingAssignor(self._on_count),),
            session_timeout_ms=session_ms,
            heartbeat_interval_ms=max(100, min(1000, session_ms // 3)),
            **config.kafka_security.client_kwargs(),
        )
        await consumer.start()
        consumer.subscribe([Topics(config.topic_prefix).budget_policies], listener=_Pause(consumer))
        self._consumer = consumer
        self._publish(self.clock())
        self._task = asyncio.create_task(self._run(consumer), name="enforcer-membership")

    async def _run(self, consumer: AIOKafkaConsumer) -> None:
        """Poll (the group's heartbeats need a consumer that polls; nothing is fetched) and
        recompute the effective count as grace periods end."""
        while True:
            try:
                await consumer.getmany(timeout_ms=int(TICK_S * 1000))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a broker hiccup: the coordinator rejoins by itself
                log.warning("membership poll failed: %s", exc)
                await asyncio.sleep(TICK_S)
            paused = consumer.paused()
            for tp in consumer.assignment():
                if tp not in paused:
                    consumer.pause(TopicPartition(tp.topic, tp.partition))
            self._publish(self.clock())

    async def stop(self) -> None:
        """Leave the group (the others learn at once)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None
