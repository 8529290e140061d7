"""One price version (``PriceTable``): its entries, the lookup of a model's entry, its record.

*Which model entry.* An entry's ``match`` is a model id; it prices that id and the id's
snapshot forms (dated suffixes, ``-latest``, ``-preview``, Bedrock ``-v1:0``...:
:data:`schemas.pricing.model_ids.SNAPSHOT_SUFFIX`), never another version: ``gpt-5``
does not price ``gpt-5.5`` nor ``gpt-5-codex``. The id is tried as carried and then
normalised (:func:`schemas.pricing.model_ids.model_id_forms`); of the entries that
price a form, the longest ``match`` wins (``gpt-4o-2024-05-13`` over ``gpt-4o``).
Write ``match`` values in lower case. ``*`` is refused, and so is an empty match (use
``fallback``). OpenAI fine-tuned ids (``ft:gpt-4o-mini:...``) are matched by their
base (``ft:gpt-4o-mini-2024-07-18``): fine-tuned models cost more, so they must be
listed (``match: "ft:gpt-4o-mini"``). :meth:`PriceTable.explain` says which form,
which entry and which suffix (``spendbus price --explain``).

*No match.* With a ``fallback``, the fallback prices are charged and the
priced event records ``matched = "*"``. Without one the event costs 0 and is
flagged ``unpriced`` (matched null, price_version = the version in force),
for the aggregator to count, alert on and list.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from schemas.errors import ContractError
from schemas.periods import from_micros
from schemas.pricing.model_ids import is_snapshot_suffix, model_id_forms
from schemas.pricing.model_price import FALLBACK_MATCH, ModelPrice


@dataclass(frozen=True, slots=True)
class PriceTable:
    """One price version: in force from ``effective_from`` until the next version's."""

    version: str
    effective_from: datetime
    models: tuple[ModelPrice, ...]
    fallback: ModelPrice | None = None
    _by_prefix: dict[str, ModelPrice] = field(init=False, repr=False, compare=False, hash=False)
    _lengths: tuple[int, ...] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.version, str) or not self.version.strip():
            raise ContractError("version: must be a non-empty string")
        if not isinstance(self.effective_from, datetime) or self.effective_from.tzinfo is None:
            raise ContractError("effective_from: must be a datetime with a time zone")
        object.__setattr__(self, "effective_from", self.effective_from.astimezone(UTC))
        object.__setattr__(self, "models", tuple(self.models))
        by_prefix: dict[str, ModelPrice] = {}
        for price in self.models:
            if price.match == FALLBACK_MATCH:
                raise ContractError("match: '*' is the fallback's; give it as 'fallback'")
            if price.match in by_prefix:
                raise ContractError(f"match: {price.match!r} is listed twice")
            by_prefix[price.match] = price
        if self.fallback is not None and self.fallback.match != FALLBACK_MATCH:
            raise ContractError(f"fallback: its match must be {FALLBACK_MATCH!r}")
        object.__setattr__(self, "_by_prefix", by_prefix)
        lengths = sorted({len(m) for m in by_prefix}, reverse=True)
        object.__setattr__(self, "_lengths", tuple(lengths))

    def lookup(self, model: str) -> ModelPrice | None:
        """The entry that prices ``model`` or one of its snapshot forms (tried as carried,
        then normalised; the longest match wins), or None.

        The fallback is not returned here; see :meth:`resolve`.
        """
        found = self._find(model)
        return None if found is None else found[0]

    def _find(self, model: str) -> tuple[ModelPrice, str, str, str] | None:
        """(entry, the step that made the form, the form, what followed the match)."""
        by_prefix = self._by_prefix
        for step, form in model_id_forms(model):
            size = len(form)
            for length in self._lengths:
                if length <= size:
                    price = by_prefix.get(form[:length])
                    if price is not None and is_snapshot_suffix(form[length:]):
                        return price, step, form, form[length:]
        return None

    def explain(self, model: str) -> dict[str, Any]:
        """Why ``model`` is priced as it is: the forms tried, the form and entry that
        matched and by which rule (``exact``, ``snapshot`` of the entry, ``fallback``, or
        ``unpriced``)."""
        forms = [{"step": step, "form": form} for step, form in model_id_forms(model)]
        found = self._find(model)
        if found is not None:
            price, step, form, suffix = found
            return {
                "rule": "snapshot" if suffix else "exact",
                "entry": price.match,
                "form": form,
                "step": step,
                "suffix": suffix,
                "forms_tried": forms,
            }
        rule = "unpriced" if self.fallback is None else "fallback"
        entry = None if self.fallback is None else FALLBACK_MATCH
        return {"rule": rule, "entry": entry, "forms_tried": forms}

    def resolve(self, model: str) -> ModelPrice | None:
        """What ``model`` is charged by: its entry, else the fallback, else None (unpriced)."""
        price = self.lookup(model)
        return self.fallback if price is None else price

    def to_record(self) -> dict[str, Any]:
        """The PriceTable Avro record (schemas/avro/PriceTable.avsc); decimals as exact strings."""
        return {
            "version": self.version,
            "effective_from": self.effective_from,
            "models": [m.to_record() for m in self.models],
            "fallback": None if self.fallback is None else self.fallback.to_record(),
        }

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> PriceTable:
        effective_from = rec["effective_from"]
        if type(effective_from) is int:  # microseconds, as on the wire
            effective_from = from_micros(effective_from)
        fallback = rec.get("fallback")
        return cls(
            version=rec["version"],
            effective_from=effective_from,
            models=tuple(ModelPrice.from_record(m) for m in rec["models"]),
            fallback=None if fallback is None else ModelPrice.from_record(fallback),
        )
