"""The price book: every applied version, which one is in force, and pricing events.

*Which version.* An event is priced by the version in force at its
``occurred_at``: the one with the latest ``effective_from`` <= occurred_at
(two versions with the same ``effective_from``: the greater version string
wins, so the choice never depends on the order they were applied in). An event
older than every version is **unpriced, with price_version null** (it is not
priced by the earliest version: that would charge history with prices that
were not yet in force).

*Worst case.* :meth:`PriceBook.worst_case_nanos` prices ``input_tokens`` as
plain input (tier-aware), ``max_output_tokens`` as output and the ``units`` the request
can cost at most (a server tool's ``max_uses``...) at their unit prices. It does not add
the cache-write premium (1.25x, 2x for 1-hour writes): an enforcer that knows
a request writes to the cache should pass those tokens to :meth:`PriceBook.price`.

:meth:`PriceTable.to_record` writes every price out, defaults resolved, as
exact decimal strings: what a reader charges does not depend on the defaults
of the code that reads it. :meth:`PriceTable.from_record` still gives a null
cache price its default. :class:`PriceBook` resolves each (version, model)
once and caches the result (the rates, each service tier's rates, or the constant
unpriced Price), so :meth:`PriceBook.price_event` is a comparison (events of the newest
version skip the bisect), a dict lookup and integer arithmetic; an event a tier served
is the same sum over that tier's rates.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final

from schemas.billed_units import valid_service_tier, valid_unit_name
from schemas.errors import ContractError, InvalidRecord
from schemas.pricing.exact_cost import Extras, Rates, cost_with_units, rounded_cost, token_numerator
from schemas.pricing.price_file import default_price_file, load_price_file
from schemas.pricing.table import PriceTable

#: resolved (version, model) entries kept per version before the cache is cleared
MAX_CACHED_MODELS: Final = 10_000


@dataclass(frozen=True, slots=True)
class Price:
    """What one call costs and by which prices (the priced event's pricing fields)."""

    cost_nanos: int
    #: the version in force at the event's time; None when no version was in force
    price_version: str | None
    #: the matching prefix, ``"*"`` for the fallback, None when unpriced
    matched: str | None
    unpriced: bool


#: the price of an event older than every version
NO_VERSION: Final = Price(cost_nanos=0, price_version=None, matched=None, unpriced=True)

# A frozen dataclass's __init__ goes through object.__setattr__ per field; on the
# hot path, filling the slots through their descriptors builds the same object
# in about half the time.
_new_price = Price.__new__
_set_cost = vars(Price)["cost_nanos"].__set__
_set_version = vars(Price)["price_version"].__set__
_set_matched = vars(Price)["matched"].__set__
_set_unpriced = vars(Price)["unpriced"].__set__


def _charged(cost: int, version: str, matched: str | None) -> Price:
    price = _new_price(Price)
    _set_cost(price, cost)
    _set_version(price, version)
    _set_matched(price, matched)
    _set_unpriced(price, False)
    return price


#: a resolved (version, model): (the Price when constant, version, matched, rates)
_Entry = tuple[Price | None, str, str | None, Rates | None, Extras | None]


class PriceBook:
    """Every applied price version, indexed by ``effective_from``; prices events.

    Resolved (version, model) pairs are cached, so pricing an event is a list
    lookup, a dict lookup and a few integer operations.
    """

    __slots__ = ("_by_version", "_entries", "_order", "_starts")

    def __init__(self, tables: Iterable[PriceTable] = ()) -> None:
        self._by_version: dict[str, PriceTable] = {}
        self._order: list[PriceTable] = []
        self._starts: list[datetime] = []
        self._entries: list[dict[str, _Entry]] = []
        for table in tables:
            self._by_version[table.version] = table
        self._reindex()

    @classmethod
    def from_file(cls, path: str | Path | None = None) -> PriceBook:
        """A book of every version in ``path`` (default: the shipped price file)."""
        return cls(load_price_file(default_price_file() if path is None else path))

    def _reindex(self) -> None:
        self._order = sorted(self._by_version.values(), key=lambda t: (t.effective_from, t.version))
        self._starts = [t.effective_from for t in self._order]
        self._entries = [{} for _ in self._order]

    def add(self, table: PriceTable) -> None:
        """Apply a version; a version applied again replaces the earlier one."""
        self._by_version[table.version] = table
        self._reindex()

    def remove(self, version: str) -> None:
        """Forget a version (a tombstone on the pricing topic); unknown versions are ignored."""
        if self._by_version.pop(version, None) is not None:
            self._reindex()

    @property
    def tables(self) -> list[PriceTable]:
        """Every version, oldest ``effective_from`` first."""
        return list(self._order)

    def __len__(self) -> int:
        return len(self._order)

    def _index_at(self, at: datetime) -> int:
        starts = self._starts
        if starts and at >= starts[-1]:
            return len(starts) - 1
        return bisect_right(starts, at) - 1

    def table_at(self, at: datetime) -> PriceTable | None:
        """The version in force at ``at`` (latest effective_from <= at), or None."""
        if at.tzinfo is None:
            raise ContractError(f"time {at.isoformat()} has no time zone; spendbus works in UTC")
        index = self._index_at(at)
        return None if index < 0 else self._order[index]

    def _resolve(self, index: int, model: str) -> _Entry:
        table = self._order[index]
        price = table.resolve(model)
        entry: _Entry
        if price is None:
            entry = (Price(0, table.version, None, True), table.version, None, None, None)
        else:
            entry = (None, table.version, price.match, price.rates, price.extras)
        cache = self._entries[index]
        if len(cache) >= MAX_CACHED_MODELS:
            cache.clear()
        cache[model] = entry
        return entry

    def price(
        self,
        model: str,
        *,
        at: datetime,
        input_tokens: int = 0,
        cache_read_tokens: int = 0,
        cache_write_tokens: int = 0,
        cache_write_1h_tokens: int = 0,
        output_tokens: int = 0,
        units: Mapping[str, int] | None = None,
        service_tier: str | None = None,
    ) -> Price:
        """The cost of one call of ``model`` at ``at`` (``cache_write_1h_tokens`` is part of
        ``cache_write_tokens``; ``units`` and ``service_tier`` as a UsageEvent carries them)."""
        for name, value in (
            ("input_tokens", input_tokens),
            ("cache_read_tokens", cache_read_tokens),
            ("cache_write_tokens", cache_write_tokens),
            ("cache_write_1h_tokens", cache_write_1h_tokens),
            ("output_tokens", output_tokens),
        ):
            if type(value) is not int or value < 0:
                raise ContractError(f"{name}: must be an integer >= 0, got {value!r}")
        for unit, count in (units or {}).items():
            if not valid_unit_name(unit) or type(count) is not int or count < 0:
                raise ContractError(f"units: {unit!r}: a unit name and a count >= 0, got {count!r}")
        if service_tier is not None and not valid_service_tier(service_tier):
            raise ContractError(f"service_tier: {service_tier!r} is not a tier name")
        if at.tzinfo is None:
            raise ContractError(f"time {at.isoformat()} has no time zone; spendbus works in UTC")
        index = self._index_at(at)
        if index < 0:
            return NO_VERSION
        entry = self._entries[index].get(model) or self._resolve(index, model)
        fixed, version, matched, rates, extras = entry
        if fixed is not None:
            return fixed
        assert rates is not None
        if extras is not None and service_tier is not None:
            rates = extras[1].get(service_tier, rates)
        if extras is not None and units:
            if cache_write_1h_tokens > cache_write_tokens:
                raise ContractError("cache_write_1h_tokens is a part of cache_write_tokens")
            token_total = token_numerator(
                rates,
                input_tokens,
                cache_read_tokens,
                cache_write_tokens,
                cache_write_1h_tokens,
                output_tokens,
            )
            cost = cost_with_units(token_total, rates[3], extras[0], units)
            return Price(cost, version, matched, False)
        cost = rounded_cost(
            rates,
            input_tokens,
            cache_read_tokens,
            cache_write_tokens,
            cache_write_1h_tokens,
            output_tokens,
        )
        return Price(cost, version, matched, False)

    def price_event(self, event: Mapping[str, Any]) -> Price:
        """Price a (validated) UsageEvent record by the version in force at its occurred_at.

        The aggregator's hot path: a cached (version, model) costs one bisect (or
        none, for the newest version), one dict lookup and integer arithmetic.
        """
        at = event["occurred_at"]
        starts = self._starts
        try:  # the newest version prices most events: no bisect for them
            newest = bool(starts) and at >= starts[-1]
            index = len(starts) - 1 if newest else bisect_right(starts, at) - 1
        except TypeError:
            raise InvalidRecord(
                "occurred_at",
                f"must be a UTC timestamp, got {at!r}",
                record_id=event.get("event_id"),
            ) from None
        if index < 0:
            return NO_VERSION
        model = event["model"]
        entry = self._entries[index].get(model)
        if entry is None:
            entry = self._resolve(index, model)
        fixed, version, matched, rates, extras = entry
        if fixed is not None:
            return fixed
        if extras is not None:  # only entries that price units or tiers look at them
            service_tier = event.get("service_tier")
            if service_tier is not None:  # the tier's own rates, when the entry prices it
                rates = extras[1].get(service_tier, rates)
        threshold, base, tier, den = rates  # type: ignore[misc]  # rates is None only with a fixed price (returned above)
        inp = event["input_tokens"]
        read = event["cache_read_tokens"]
        write = event["cache_write_tokens"]
        write_1h = event["cache_write_1h_tokens"]
        if write_1h > write:
            raise InvalidRecord(
                "cache_write_1h_tokens",
                "is a part of cache_write_tokens: cannot exceed it",
                record_id=event.get("event_id"),
            )
        a, b, c, d, e = tier if 0 <= threshold < inp + read + write else base
        total = (
            inp * a + read * b + (write - write_1h) * c + write_1h * d + event["output_tokens"] * e
        )
        if extras is not None:
            units = event.get("units")
            if units:
                return _charged(cost_with_units(total, den, extras[0], units), version, matched)
        if den != 1:
            quotient, remainder = divmod(total, den)
            twice = remainder + remainder
            if twice > den or (twice == den and quotient & 1):
                quotient += 1
            total = quotient
        return _charged(total, version, matched)

    def worst_case_nanos(
        self,
        model: str,
        *,
        at: datetime,
        input_tokens: int,
        max_output_tokens: int,
        units: Mapping[str, int] | None = None,
    ) -> int:
        """The enforcer's pre-forward estimate: the prompt at the input price (long-context
        tier included) plus ``max_output_tokens`` at the output price, plus the billed
        units the request can cost at most (``units``, known before it is sent) at their
        unit prices; 0 when unpriced."""
        return self.price(
            model, at=at, input_tokens=input_tokens, output_tokens=max_output_tokens, units=units
        ).cost_nanos

    def unpriced_models(self, models: Iterable[str], at: datetime) -> list[str]:
        """The models (each once, in the given order) no entry nor fallback prices at ``at``."""
        table = self.table_at(at)
        unique = list(dict.fromkeys(models))
        if table is None:
            return unique
        return [m for m in unique if table.resolve(m) is None]
