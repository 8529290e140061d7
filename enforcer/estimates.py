"""Worst-case estimates of requests: their tokens, and their cost cached until prices
or time move on.

:func:`request_tokens` is a request's input estimate and max output. A check prices the request's worst case (input estimate + max output) with the
price book in force; :class:`PriceEstimates` keeps the answers per (model,
input tokens, max output), the last one in front, and whether a model has no
price at all, all dropped when a new price version arrives or the next table
comes into force.
"""

from __future__ import annotations

from typing import Final, final

from enforcer.context import Context
from enforcer.plans import NEVER_US, epoch_micros
from enforcer.state import EnforcerState
from schemas.periods import from_micros
from schemas.usage import MAX_TOKENS_PER_EVENT, REQUEST_BYTES_PER_TOKEN

#: estimates cached per (model, input tokens, max output) until prices or time move on
ESTIMATE_CACHE_SIZE: Final = 4096


@final
class PriceEstimates:
    """The checker's cache of worst-case costs and of unpriced models."""

    def __init__(self, state: EnforcerState) -> None:
        self.state = state
        self._estimates: dict[tuple[str, int, int], int] = {}
        self._estimates_version = -1
        self._estimates_until_us = 0
        #: the last estimate, in front of the cache (a proxy's requests repeat one shape)
        self._last_model: str | None = None
        self._last_input = 0
        self._last_output = 0
        self._last_nanos = 0
        #: model -> whether no price entry nor fallback prices it (cleared with the estimates)
        self._unpriced: dict[str, bool] = {}

    def nanos(
        self,
        model: str,
        input_tokens: int,
        max_output: int,
        now_us: int,
        units: dict[str, int] | None = None,
    ) -> int:
        """Worst-case cost (schemas.pricing), cached until the price book or version changes;
        a request naming unit caps (rare) is priced with them, uncached."""
        state = self.state
        if state.price_version != self._estimates_version or now_us >= self._estimates_until_us:
            self._estimates.clear()
            self._unpriced.clear()
            self._last_model = None
            self._estimates_version = state.price_version
            self._estimates_until_us = NEVER_US
            for table in state.prices.tables:  # the next version to come into force
                start = epoch_micros(table.effective_from)
                if start > now_us:
                    self._estimates_until_us = min(self._estimates_until_us, start)
        if units:
            return state.prices.worst_case_nanos(
                model,
                at=from_micros(now_us),
                input_tokens=input_tokens,
                max_output_tokens=max_output,
                units=units,
            )
        if (
            model == self._last_model
            and input_tokens == self._last_input
            and max_output == self._last_output
        ):
            return self._last_nanos
        key = (model, input_tokens, max_output)
        nanos = self._estimates.get(key)
        if nanos is None:
            if len(self._estimates) >= ESTIMATE_CACHE_SIZE:
                self._estimates.clear()
            nanos = state.prices.worst_case_nanos(
                model,
                at=from_micros(now_us),
                input_tokens=input_tokens,
                max_output_tokens=max_output,
            )
            self._estimates[key] = nanos
        self._last_model = model
        self._last_input = input_tokens
        self._last_output = max_output
        self._last_nanos = nanos
        return nanos

    def unpriced(self, model: str, now_us: int) -> bool:
        """No entry nor fallback of the price table in force prices ``model`` (cached with
        the estimates: call after :meth:`nanos`, which renews the cache)."""
        unpriced = self._unpriced.get(model)
        if unpriced is None:
            if len(self._unpriced) >= ESTIMATE_CACHE_SIZE:
                self._unpriced.clear()
            table = self.state.prices.table_at(from_micros(now_us))
            unpriced = self._unpriced[model] = table is None or table.resolve(model) is None
        return unpriced


def request_tokens(ctx: Context, default_output: int) -> tuple[int, int]:
    """(input estimate, max output) of the request, in tokens: the max output is per
    candidate (``n``), so the worst case counts every candidate's."""
    if ctx.input_tokens is not None:
        input_tokens = ctx.input_tokens
    elif ctx.request_bytes:
        input_tokens = min(MAX_TOKENS_PER_EVENT, -(-ctx.request_bytes // REQUEST_BYTES_PER_TOKEN))
    else:
        input_tokens = 0
    output = ctx.max_output_tokens
    if output is None:
        output = default_output
    candidates = ctx.candidates
    if candidates is not None and candidates > 1:
        output = min(MAX_TOKENS_PER_EVENT, output * candidates)
    return input_tokens, output
