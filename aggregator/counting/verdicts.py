"""When a counter's Verdict goes to budget.verdicts. Pure; no Kafka here.

The rule (issue 4): at once when what an enforcer decides on changes (the
counter's period, or its state ok → alert → exceeded), otherwise at most once
per ``interval`` (≤ 100 ms) per counter, with the latest totals. A counter that
has not sent for ``interval`` sends at once, so a quiet counter is never held;
a hot one sends ~1/interval verdicts instead of one per event or batch.

A held verdict is a reference to the counter's live state, so it goes out with
the newest totals when it falls due. Before source offsets are committed the
caller sends everything held (``due(force=True)``): a committed record never
has its verdict still waiting in memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from aggregator.counting.batch_output import VerdictChange
from aggregator.counting.fold import counter_state


@dataclass(slots=True)
class _Sent:
    period: str
    label: str
    at: float


class VerdictCoalescer:
    def __init__(self, interval: float, *, limit: int = 500_000) -> None:
        if not 0 < interval <= 0.1:
            raise ValueError(f"the verdict interval must be in (0, 0.1] seconds, got {interval}")
        self.interval = interval
        self.limit = limit
        self._sent: dict[str, _Sent] = {}
        #: counter key -> (its change, when it falls due)
        self._held: dict[str, tuple[VerdictChange, float]] = {}

    def __len__(self) -> int:
        return len(self._held)

    def offer(self, key: str, change: VerdictChange, now: float) -> bool:
        """True: send this verdict now. False: it is held until it falls due."""
        state = change.state
        label = counter_state(change.budget, state.periods[state.period])
        sent = self._sent.get(key)
        if (
            sent is None
            or sent.period != state.period
            or sent.label != label
            or now - sent.at >= self.interval
        ):
            self._held.pop(key, None)
            self._mark(key, state.period, label, now)
            return True
        held = self._held.get(key)
        self._held[key] = (change, held[1] if held else sent.at + self.interval)
        return False

    def due(self, now: float, *, force: bool = False) -> list[tuple[str, VerdictChange]]:
        """The held verdicts to send now (all of them with ``force``), marked as sent."""
        if not self._held:
            return []
        ready = [(key, change) for key, (change, due) in self._held.items() if force or due <= now]
        for key, change in ready:
            del self._held[key]
            state = change.state
            label = counter_state(change.budget, state.periods[state.period])
            self._mark(key, state.period, label, now)
        return ready

    def next_due(self) -> float | None:
        """When the earliest held verdict falls due (None when nothing is held)."""
        return min((due for _, due in self._held.values()), default=None)

    def drop(self, key: str) -> None:
        """The counter was pruned: nothing of it is held back to be sent after its
        tombstone (which would bring it back)."""
        self._held.pop(key, None)
        self._sent.pop(key, None)

    def forget(self) -> None:
        """Partitions moved: send the next verdict of every counter at once."""
        self._sent.clear()
        self._held.clear()

    def _mark(self, key: str, period: str, label: str, now: float) -> None:
        if len(self._sent) >= self.limit and key not in self._sent:
            # bounded memory: forgetting only makes the next verdicts go out at once
            self._sent.clear()
        self._sent[key] = _Sent(period, label, now)
