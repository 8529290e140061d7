"""The generation control record (``GenerationSwitch``) and its codec.

A generation is one build of everything the aggregator derives from the
ledger (docs/replay.md). The compacted control topic
(``Topics.generations``) holds one live value under ``CONTROL_KEY``: the
current generation. No value means the default generation ('').

Its codec is ``schemas.codec.GENERATION_SWITCH`` (single-object header, like
every other value).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from schemas.codec import GENERATION_SWITCH
from schemas.topics import check_generation


@dataclass(frozen=True, slots=True)
class GenerationSwitch:
    """The control topic's live value."""

    generation: str
    previous: str
    #: the previous generation's workers are stopped (it writes nothing any more)
    previous_retired: bool
    switched_at: datetime

    def __post_init__(self) -> None:
        check_generation(self.generation)
        check_generation(self.previous)

    def encode(self) -> bytes:
        return GENERATION_SWITCH.encode(
            {
                "generation": self.generation,
                "previous": self.previous,
                "previous_retired": self.previous_retired,
                "switched_at": self.switched_at,
            }
        )

    @classmethod
    def decode(cls, data: bytes) -> GenerationSwitch:
        record = GENERATION_SWITCH.decode(data)
        return cls(
            record["generation"],
            record["previous"],
            record["previous_retired"],
            record["switched_at"].astimezone(UTC),
        )
