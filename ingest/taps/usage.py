"""The normalised usage of one response, and reading token counts safely."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Literal

from schemas.usage import TOKEN_FIELDS

UsageSource = Literal["reported", "estimated", "none"]

#: Largest token count accepted in one field of one response: a larger value is
#: an upstream bug, and charging it would exhaust every budget it touches.
MAX_TOKENS = 10_000_000_000


# The classes below are frozen dataclasses with an ``__init__`` of their own: the one
# dataclass writes runs interpreted under mypyc (frozen fields set one by one through
# ``object.__setattr__``), this one is compiled and several times cheaper, even when called
# from interpreted code. One of each is made per response.


@dataclass(frozen=True, slots=True, init=False)
class Usage:
    """Normalised token counts (see docs/design.md, "Normalised usage")."""

    input_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    cache_write_1h_tokens: int
    output_tokens: int
    reasoning_tokens: int

    def __init__(
        self,
        input_tokens: int = 0,
        cache_read_tokens: int = 0,
        cache_write_tokens: int = 0,
        cache_write_1h_tokens: int = 0,
        output_tokens: int = 0,
        reasoning_tokens: int = 0,
    ) -> None:
        _set_counts(
            self,
            input_tokens,
            cache_read_tokens,
            cache_write_tokens,
            cache_write_1h_tokens,
            output_tokens,
            reasoning_tokens,
        )


@dataclass(frozen=True, slots=True, init=False)
class TapResult:
    """What one upstream response is charged.

    ``usage_source`` is ``reported`` (read from the provider), ``estimated``
    (usage missing or unreadable; ``estimate_reason`` says why) or ``none`` (a
    non-2xx response that carried no usage: not billable). ``upstream_error``
    names an error the upstream reported (an error event after a 200, or the
    body of a non-2xx response).
    """

    model: str | None
    input_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    cache_write_1h_tokens: int
    output_tokens: int
    reasoning_tokens: int
    usage_source: UsageSource
    estimate_reason: str | None
    upstream_error: str | None
    #: billed units beyond tokens the response counted (schemas/billed_units.py), as
    #: (unit, count) pairs sorted by unit (a tuple: the result stays hashable)
    units: tuple[tuple[str, int], ...]
    #: the service tier the response says served it, as it says it
    service_tier: str | None
    #: charges billed apart from this one, each at its own model (an Anthropic declined
    #: fallback hop that had written output): one more UsageEvent each
    separate_charges: tuple[TapResult, ...]
    #: why the response's own ``model`` was not the one priced (``priced_model``), or None
    model_note: str | None

    def __init__(
        self,
        model: str | None,
        input_tokens: int = 0,
        cache_read_tokens: int = 0,
        cache_write_tokens: int = 0,
        cache_write_1h_tokens: int = 0,
        output_tokens: int = 0,
        reasoning_tokens: int = 0,
        usage_source: UsageSource = "none",
        estimate_reason: str | None = None,
        upstream_error: str | None = None,
        units: dict[str, int] | tuple[tuple[str, int], ...] | None = None,
        service_tier: str | None = None,
        separate_charges: tuple[TapResult, ...] = (),
        model_note: str | None = None,
    ) -> None:
        _set_counts(
            self,
            input_tokens,
            cache_read_tokens,
            cache_write_tokens,
            cache_write_1h_tokens,
            output_tokens,
            reasoning_tokens,
        )
        if usage_source not in ("reported", "estimated", "none"):
            raise ValueError(f"unknown usage_source {usage_source!r}")
        if (usage_source == "estimated") != (estimate_reason is not None):
            raise ValueError("estimate_reason is set exactly when usage_source is 'estimated'")
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "usage_source", usage_source)
        object.__setattr__(self, "estimate_reason", estimate_reason)
        object.__setattr__(self, "upstream_error", upstream_error)
        pairs = units.items() if isinstance(units, dict) else units  # replace() passes pairs
        object.__setattr__(self, "units", tuple(sorted(pairs)) if pairs else ())
        object.__setattr__(self, "service_tier", service_tier)
        object.__setattr__(self, "separate_charges", separate_charges)
        object.__setattr__(self, "model_note", model_note)

    @property
    def total_tokens(self) -> int:
        """Every billed token: input + cache reads + cache writes + output."""
        return (
            self.input_tokens
            + self.cache_read_tokens
            + self.cache_write_tokens
            + self.output_tokens
        )

    def as_dict(self) -> dict[str, Any]:
        """The JSON object ``spendbus tap inspect`` prints."""
        out: dict[str, Any] = {
            "model": self.model,
            **{name: getattr(self, name) for name in TOKEN_FIELDS},
            "usage_source": self.usage_source,
        }
        if self.estimate_reason is not None:
            out["estimate_reason"] = self.estimate_reason
        if self.upstream_error is not None:
            out["upstream_error"] = self.upstream_error
        if self.units:
            out["units"] = dict(self.units)
        if self.service_tier is not None:
            out["service_tier"] = self.service_tier
        if self.model_note is not None:
            out["model_note"] = self.model_note
        if self.separate_charges:
            out["separate_charges"] = [charge.as_dict() for charge in self.separate_charges]
        return out

    @classmethod
    def from_usage(
        cls,
        model: str | None,
        usage: Usage,
        source: UsageSource,
        *,
        reason: str | None = None,
        upstream_error: str | None = None,
        units: dict[str, int] | None = None,
        service_tier: str | None = None,
        separate_charges: tuple[TapResult, ...] = (),
        model_note: str | None = None,
    ) -> TapResult:
        return TapResult(
            model,
            usage.input_tokens,
            usage.cache_read_tokens,
            usage.cache_write_tokens,
            usage.cache_write_1h_tokens,
            usage.output_tokens,
            usage.reasoning_tokens,
            source,
            reason,
            upstream_error,
            units,
            service_tier,
            separate_charges,
            model_note,
        )


def usage_max(a: Usage, b: Usage) -> Usage:
    """The field-wise maximum of two usages: what several reports of one call are charged
    (cumulative reports grow, so it is the last one; a report with lower counts after a
    higher one lowers nothing, and the cost is never below any single report's)."""
    return Usage(
        max(a.input_tokens, b.input_tokens),
        max(a.cache_read_tokens, b.cache_read_tokens),
        max(a.cache_write_tokens, b.cache_write_tokens),
        max(a.cache_write_1h_tokens, b.cache_write_1h_tokens),
        max(a.output_tokens, b.output_tokens),
        max(a.reasoning_tokens, b.reasoning_tokens),
    )


def is_snapshot_of(served: str, requested: str) -> bool:
    """True when ``served`` is ``requested`` or a dated snapshot of it, as providers name
    the snapshot an alias resolved to: ``requested``, a hyphen, then a date and nothing
    else (OpenAI ``gpt-4o-2024-08-06``, Anthropic ``claude-sonnet-4-5-20250929``) or a
    three-digit version (Gemini ``gemini-1.5-flash-002``). Any other suffix names another
    model, which may be priced lower: a version (``claude-sonnet-4-5-...`` for
    ``claude-sonnet-4``), a size (``gpt-4o-mini-...``), a preview or a four-digit
    snapshot (``gpt-4-0125-preview`` for ``gpt-4``, a third of its price)."""
    if served == requested:
        return True
    if len(served) <= len(requested) + 1 or not served.startswith(requested):
        return False
    if served[len(requested)] != "-":
        return False
    suffix = served[len(requested) + 1 :]
    if not suffix.isascii() or not suffix.replace("-", "").isdigit():
        return False
    if len(suffix) == 10:  # YYYY-MM-DD
        return suffix[4] == "-" and suffix[7] == "-" and suffix.count("-") == 2
    return len(suffix) in (8, 3) and suffix.isdigit()  # YYYYMMDD, or a version NNN


def priced_model(
    requested: str | None, served: str | None, relabelled_to: str | None
) -> tuple[str | None, str | None]:
    """The model a call is priced at, and why the response's was not taken (None when it
    was). The requested model (the URL's, else the body's) is the one the enforcer
    admitted and priced the hold at; the response's model is taken when nothing was
    requested, when it is the requested model or a dated snapshot of it
    (``is_snapshot_of``), or when the provider documented the relabel (``relabelled_to``:
    Anthropic's server-side fallback, for a request that allowed it). Any other model the
    response names is not priced: an answer naming a cheaper model never lowers the
    charge."""
    if served is None:
        return requested, None
    if requested is None or served == relabelled_to or is_snapshot_of(served, requested):
        return served, None
    note = (
        f"the response names {served!r}, neither {requested!r} (requested) nor a dated "
        "snapshot of it nor a relabel the provider documents: priced as requested"
    )
    return requested, note


def _set_counts(
    obj: Usage | TapResult,
    input_tokens: object,
    cache_read_tokens: object,
    cache_write_tokens: object,
    cache_write_1h_tokens: object,
    output_tokens: object,
    reasoning_tokens: object,
) -> None:
    """Check the six counts (the first wrong one is named), then set them on ``obj``."""
    _count("input_tokens", input_tokens)
    _count("cache_read_tokens", cache_read_tokens)
    cache_writes = _count("cache_write_tokens", cache_write_tokens)
    cache_writes_1h = _count("cache_write_1h_tokens", cache_write_1h_tokens)
    output = _count("output_tokens", output_tokens)
    reasoning = _count("reasoning_tokens", reasoning_tokens)
    if cache_writes_1h > cache_writes:
        raise ValueError("cache_write_1h_tokens exceeds cache_write_tokens")
    if reasoning > output:
        raise ValueError("reasoning_tokens exceeds output_tokens")
    object.__setattr__(obj, "input_tokens", input_tokens)
    object.__setattr__(obj, "cache_read_tokens", cache_read_tokens)
    object.__setattr__(obj, "cache_write_tokens", cache_write_tokens)
    object.__setattr__(obj, "cache_write_1h_tokens", cache_write_1h_tokens)
    object.__setattr__(obj, "output_tokens", output_tokens)
    object.__setattr__(obj, "reasoning_tokens", reasoning_tokens)


def _count(name: str, value: object) -> int:
    if type(value) is not int or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return value


class InvalidUsage(ValueError):
    """A usage object the provider sent cannot be charged as is."""


def tok(obj: Any, key: str, *, required: bool = False) -> int:
    """Read one token count from a usage object.

    Missing or null counts are 0 unless ``required``; anything that is not a
    non-negative integer (an integral float is accepted: JSON does not tell
    ``3`` from ``3.0``) raises :class:`InvalidUsage`.
    """
    if not isinstance(obj, dict):
        if obj is None and not required:
            return 0
        raise InvalidUsage(f"expected an object holding {key}, got {type(obj).__name__}")
    value = obj.get(key)
    if value is None:
        if required:
            raise InvalidUsage(f"{key} is missing")
        return 0
    raw = value
    if type(value) is int:
        pass
    elif type(value) is float and math.isfinite(value) and value.is_integer():
        value = int(value)
    else:
        raise InvalidUsage(f"{key} is not an integer: {_short(value)}")
    if value < 0:
        raise InvalidUsage(f"{key} is negative: {_short(raw)}")
    if value > MAX_TOKENS:
        raise InvalidUsage(f"{key} is implausibly large: {_short(raw)}")
    return value


def sub(total: int, part: int, total_name: str, part_name: str) -> int:
    """``total - part`` where the provider reports ``part`` inside ``total``."""
    if part > total:
        raise InvalidUsage(f"{part_name} ({part}) exceeds {total_name} ({total})")
    return total - part


def _short(value: Any) -> str:
    text = json.dumps(value, default=repr)
    return text if len(text) <= 40 else text[:37] + "..."


def modality_units(raw: Any, input_field: str, output_field: str) -> dict[str, int]:
    """OpenAI's audio and image tokens as billed units: ``<input>_details.audio_tokens`` /
    ``image_tokens`` less their cached part (``cached_tokens_details``, Realtime: cached
    tokens are charged as cache reads) and ``<output>_details.audio_tokens`` /
    ``image_tokens``, all inside the input and output counts; the usage was validated
    first. A count that is not one is left out (the tokens are in the totals already)."""
    units: dict[str, int] = {}
    for field, direction, cached_field in (
        (input_field, "input", "cached_tokens_details"),
        (output_field, "output", None),
    ):
        details = raw.get(f"{field}_details") if isinstance(raw, dict) else None
        if not isinstance(details, dict):
            continue
        cached = details.get(cached_field) if cached_field is not None else None
        for modality in ("audio", "image"):
            try:
                count = tok(details, f"{modality}_tokens")
                if isinstance(cached, dict):
                    count = max(0, count - tok(cached, f"{modality}_tokens"))
            except InvalidUsage:
                continue
            units[f"{direction}_{modality}_tokens"] = count
    return units


def openai_usage(raw: Any, input_field: str, output_field: str) -> Usage:
    """OpenAI's usage object (Chat: prompt/completion, Responses: input/output): the input
    count includes ``<input>_details.cached_tokens``, the output count includes
    ``<output>_details.reasoning_tokens``."""
    if not isinstance(raw, dict):
        raise InvalidUsage("usage is not an object")
    total_in = tok(raw, input_field, required=True)
    output = tok(raw, output_field, required=True)
    cached = tok(raw.get(f"{input_field}_details"), "cached_tokens")
    reasoning = tok(raw.get(f"{output_field}_details"), "reasoning_tokens")
    sub(output, reasoning, output_field, "reasoning_tokens")  # validates
    return Usage(
        input_tokens=sub(total_in, cached, input_field, "cached_tokens"),
        cache_read_tokens=cached,
        output_tokens=output,
        reasoning_tokens=reasoning,
    )
