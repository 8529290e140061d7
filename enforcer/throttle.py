"""The rate limits as a check applies them: :class:`RateLimits`.

Checked last, once no budget refuses (a budget refusal takes no rate): the throttled
decision when a bucket of a rated counter cannot admit now, else the request takes its
rate from every bucket; settle and release give back what it did not use. The buckets
themselves are :mod:`enforcer.rates`.
"""

from __future__ import annotations

from typing import final

from enforcer import rates
from enforcer.config import EnforcerConfig
from enforcer.context import Context
from enforcer.counters import CounterStatus
from enforcer.decision import Decision
from enforcer.holds import Holds
from enforcer.plans import THROTTLED_I
from enforcer.rates import RateBucket
from schemas.usage import THROTTLED

#: what one request took from the buckets: (bucket, tokens or 1 request) per bucket
Charges = list[tuple[RateBucket, int]]


@final
class RateLimits:
    """This replica's token buckets and what each hold took from them."""

    def __init__(self, holds: Holds, config: EnforcerConfig) -> None:
        self.holds = holds
        self.config = config
        #: one bucket per (counter id, index into the plan's rates)
        self.buckets: rates.Buckets = {}
        #: hold id -> the token buckets it took its worst case from (settle refunds)
        self._charges: dict[int, Charges] = {}

    def throttled(
        self,
        ctx: Context,
        rows: list[CounterStatus],
        rated: list[int],
        tokens: int,
        now_us: int,
        reserve: bool,
        share: int,
    ) -> Decision | None:
        """The throttled decision when a bucket of a rated counter cannot admit now (the
        one admitting last is reported), else None."""
        worst, worst_wait, worst_spec = rates.slowest_bucket(
            self.buckets, rows, rated, share, now_us
        )
        if worst < 0:
            return None
        row = rows[worst]
        if reserve:
            row.plan.counts[row.state_i] -= 1
            row.plan.counts[THROTTLED_I] += 1
        row.state_i = THROTTLED_I
        decision = Decision(ctx, THROTTLED, "refused", rows, worst, now_us, self.config)
        decision.throttle = (worst_spec[0], worst_spec[1], worst_spec[2], worst_wait)
        decision.replicas = share
        decision.request_tokens = tokens
        return decision

    def take(self, rows: list[CounterStatus], rated: list[int], tokens: int) -> Charges:
        """Take one request (and the worst case's tokens) from every bucket of the rated
        counters: the charges, for :meth:`keep` once the hold is taken."""
        return rates.take(self.buckets, rows, rated, tokens)

    def keep(self, hold_id: int, charges: Charges) -> None:
        """Remember what the hold ``hold_id`` took, for its settle or release."""
        self._charges[hold_id] = charges

    def refund(self, hold_id: int, used_tokens: int, sent: bool) -> None:
        """Settle: give back the tokens the worst case took beyond what was used; release
        (never sent): give back everything, the request included."""
        charges = self._charges.pop(hold_id, None)
        if charges is None:
            return
        rates.refund(charges, used_tokens, sent)
        if len(self._charges) > 2 * len(self.holds) + 1024:
            # holds that timed out without a settle or release: their charges go too
            self._charges = {
                h: c for h, c in self._charges.items() if self.holds.get(h) is not None
            }
