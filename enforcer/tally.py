"""What one check gathers as it walks its counters (:class:`Tally`, one per check).

The checker fills it counter by counter and reads it to decide: the rows, which of
them refuses, the holds to take, the rated rows and the request's estimate.
"""

from __future__ import annotations

from typing import final

from enforcer.context import Context
from enforcer.counters import CounterStatus
from enforcer.estimates import request_tokens
from enforcer.holds import CounterHolds, CounterPeriod
from enforcer.plans import EXCEEDED_I, NEVER_US, SESSIONS_I, TOO_LARGE_I, UNPRICED_I
from enforcer.state import EnforcerState


@final
class Tally:
    """What one check gathers as it walks its counters: the rows, the refusing one, the
    holds to take, the rated rows and the request's estimate (computed once, when a
    counter first needs it; -1 until then)."""

    def __init__(
        self,
        ctx: Context,
        now_us: int,
        reserve: bool,
        in_flight: bool,
        share: int,
        state: EnforcerState,
        held: dict[CounterPeriod, CounterHolds],
    ) -> None:
        self.ctx = ctx
        self.now_us = now_us
        #: count the check per state and hold the estimate (False: a peek or usage)
        self.reserve = reserve
        #: False: verdict states only, nothing held (usage)
        self.in_flight = in_flight
        self.share = share
        #: holds are looked up only when some are outstanding; what was found is handed
        #: to reserve (no second lookup of the same (counter, period))
        self.look_up_holds = bool(held)
        #: what every counter reads, looked up once per check (the raise book is an
        #: interpreted object: each attribute read of it is a dictionary lookup)
        self.held = held
        self.verdicts = state.verdicts
        self.ahead = state.ahead
        self.raises = state.raises
        #: the budgets with raises (one dict lookup per counter when none has one)
        self.raised = state.raises.by_budget
        self.rows: list[CounterStatus] = []
        #: index of the refusing row (-1: none), its period end, and whether it is hard
        #: (exhausted, too large, unpriced, too many sessions: retrying soon cannot help)
        self.refusal = -1
        self.refusal_end = 0
        self.hard = False
        self.to_hold: list[CounterPeriod] = []
        self.found: list[CounterHolds | None] = []
        #: rows of counters whose budget has a rate limit (None: none, no list built)
        self.rated: list[int] | None = None
        self.est_input = 0
        self.est_output = 0
        self.est_tokens = -1
        self.est_nanos = -1

    def estimate_tokens(self, default_output: int) -> None:
        """The request's input estimate and max output, computed when a counter or a rate
        limit first needs them."""
        self.est_input, self.est_output = request_tokens(self.ctx, default_output)
        self.est_tokens = self.est_input + self.est_output

    def consider_refusal(self, state: int, end_us: int | None) -> None:
        """The next row refuses: it becomes the refusing one if it is hard and the one so
        far is not, or it resets later (the refusal reports the longest wait)."""
        is_hard = state in (EXCEEDED_I, TOO_LARGE_I, UNPRICED_I, SESSIONS_I)
        end = NEVER_US if end_us is None else end_us
        if (
            self.refusal < 0
            or (is_hard and not self.hard)
            or (is_hard == self.hard and end > self.refusal_end)
        ):
            self.refusal = len(self.rows)
            self.refusal_end = end
            self.hard = is_hard
