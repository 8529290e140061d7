"""Counters that count nothing any more, found for pruning (seed 003).

Two kinds are pruned from a partition's state, with a tombstone on the counters'
changelog and on the verdict topic (so enforcers, ``spendbus usage`` and a later
recovery forget them too):

- the counters of a budget no longer defined: no event will count in them again, and a
  verdict of a budget nobody enforces only misleads whoever reads the topic;
- a session counter (``scope: session``) whose newest event is older than the session
  idle time: a job that stopped; its counter would otherwise live for ever (a session
  budget's window is ``total``).

A removed budget's marker (backfill.py) is rewritten as ``PRUNED_MARKER``: should the
budget be defined again, it is counted again from its period's start, as a budget new to
the partition is (docs/design.md invariant 10). That re-read also folds the events of
pruned idle sessions into counters that have no fence any more: such a counter is back,
with the totals it had, until the next sweep prunes it again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from aggregator.counting.fold import CounterState
from schemas.budgets import Budget
from schemas.errors import ContractError
from schemas.ids import decompose


@dataclass
class Pruning:
    """What one partition's sweep found: counter keys to prune, by reason, and the removed
    budgets whose markers are rewritten."""

    removed_budget: list[str] = field(default_factory=list)
    idle_session: list[str] = field(default_factory=list)
    #: ids of the budgets ``removed_budget`` counters belonged to
    budgets_gone: set[str] = field(default_factory=set)

    @property
    def keys(self) -> list[str]:
        return self.removed_budget + self.idle_session


def newest_event_us(state: CounterState) -> int:
    """When the newest event any period of the counter holds occurred (µs; 0: none)."""
    return max((totals.as_of_us for totals in state.periods.values()), default=0)


def find_prunable(
    counters: Mapping[str, CounterState],
    budgets: Mapping[str, Budget],
    now_us: int,
    session_idle_us: int,
) -> Pruning:
    """The counters of ``counters`` (one partition's) that count nothing any more."""
    found = Pruning()
    idle_before = now_us - session_idle_us
    for key, state in counters.items():
        try:
            budget_id = decompose(key)[0]
        except (ContractError, IndexError):
            continue  # not a counter this stage wrote: left alone
        budget = budgets.get(budget_id)
        if budget is None:
            found.removed_budget.append(key)
            found.budgets_gone.add(budget_id)
        elif budget.scope == "session" and newest_event_us(state) < idle_before:
            found.idle_session.append(key)
    return found
