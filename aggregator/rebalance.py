"""The consumer-group listener both stages use: a rebalance handed to the stage itself."""

from __future__ import annotations

from typing import Protocol

from aiokafka import ConsumerRebalanceListener, TopicPartition


class RebalancingStage(Protocol):
    """A stage that owns a group consumer and must act before and after a rebalance."""

    async def on_revoked(self, revoked: list[TopicPartition]) -> None: ...

    async def on_assigned(self, assigned: list[TopicPartition]) -> None: ...


class StageRebalance(ConsumerRebalanceListener):  # type: ignore[misc]  # its base is Any: aiokafka has no types
    """Calls the stage's ``on_revoked`` / ``on_assigned`` (aiokafka awaits both inside the
    rebalance: partitions move only after ``on_revoked`` returned)."""

    def __init__(self, stage: RebalancingStage) -> None:
        self.stage = stage

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self.stage.on_revoked(revoked)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        await self.stage.on_assigned(assigned)
