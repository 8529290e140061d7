"""Community price maps read into exact per-million-token prices.

Two formats:

``litellm``
    LiteLLM's ``model_prices_and_context_window.json``: an object keyed by model id,
    each entry with ``litellm_provider``, ``mode`` and USD **per token**:
    ``input_cost_per_token``, ``output_cost_per_token``,
    ``cache_read_input_token_cost``, ``cache_creation_input_token_cost`` (5-minute
    writes), ``cache_creation_input_token_cost_above_1hr`` (1-hour writes), and a
    long-context tier as ``input_cost_per_token_above_<N>k_tokens`` /
    ``output_cost_per_token_above_<N>k_tokens``. ``search_context_cost_per_query``
    (USD per search, the ``medium`` size) is the ``web_search`` unit price,
    ``code_interpreter_cost_per_session`` the ``code_interpreter_session`` one,
    ``file_search_cost_per_1k_calls`` / 1000 the ``file_search`` one and
    ``output_cost_per_image`` (USD per image) the ``image_generation`` one;
    ``input_cost_per_audio_token`` / ``output_cost_per_audio_token`` /
    ``input_cost_per_image_token`` / ``output_cost_per_image_token`` (the modality's full
    rate per token) become the ``input_audio_tokens`` ... ``output_image_tokens``
    surcharges, that rate less the text rate (those tokens are inside the token totals;
    a modality cheaper than text is not imported, and said so); the
    ``*_cost_per_token_batches`` / ``_flex`` / ``_priority`` prices (input, output,
    ``cache_read_input_token_cost_<tier>``) become the ``batch`` / ``flex`` /
    ``priority`` tiers: a multiplier when input and output give the same finite decimal
    ratio, and a rate of each class billed otherwise (``tiers.py``; a tier without an
    input and output price is not imported). ``sample_spec`` is skipped.

``genai-prices``
    pydantic's genai-prices ``data.json``: a list of providers, each with ``models``;
    a model has an ``id``, a ``match`` clause tree (``starts_with``, ``equals``,
    ``or``...) and ``prices`` in USD **per million** tokens (``input_mtok``,
    ``output_mtok``, ``cache_read_mtok``, ``cache_write_mtok``; a price may be
    ``{base, tiers: [{start, price}]}``), or a list of conditional prices
    (``constraint: {start_date}``: the latest one in force on the import date wins).
    ``tool_use_kcount`` (USD per thousand uses, by unit) gives per-unit prices;
    ``input_audio_mtok`` / ``output_audio_mtok`` (the audio rate per million) the audio
    surcharges over the text rate, per token, as for LiteLLM. ``cache_audio_read_mtok``
    is not representable (cached audio is charged as cache reads) and said so.

Every number is read exactly (exact.py). What our price table cannot express is
skipped and said why: ids routed through another service (``bedrock/us-east-1/...``,
``openrouter/...``), ``regex``/``contains``/``ends_with`` matches, time-of-day prices,
several tiers. Only chat-like modes and the chosen providers are read.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import date
from decimal import Decimal, localcontext
from pathlib import Path
from typing import Any, Final

from schemas.billed_units import valid_unit_name
from schemas.errors import ConfigError
from schemas.pricing import LONG_CONTEXT_RATE_PREFIX, LongContextTier

from .exact import (
    SUSPICIOUS_PLACES,
    canonical,
    exact_number,
    load_exact_json,
    per_million,
    places,
    price_text,
)
from .tiers import tier_terms

SOURCES: Final = ("litellm", "genai-prices")

#: the providers read by default: the APIs spendbus meters
DEFAULT_PROVIDERS: Final[dict[str, frozenset[str]]] = {
    "litellm": frozenset({"anthropic", "openai", "gemini", "bedrock", "bedrock_converse"}),
    "genai-prices": frozenset({"anthropic", "openai", "google", "aws"}),
}
#: LiteLLM ``mode`` values priced per token like a chat call
_LITELLM_MODES: Final = frozenset({"chat", "responses", "completion"})
#: LiteLLM key prefixes that name the provider's own API (the rest of the key is its id)
_LITELLM_OWN_ROUTES: Final = {"gemini/": "gemini"}
_TIER_KEY = re.compile(r"^input_cost_per_token_above_(\d+)k_tokens$")


@dataclass(frozen=True, slots=True)
class SourcePrice:
    """One model id (or id prefix) as a source prices it: exact USD per million tokens;
    None where the source gives no price (the table's defaults or our own then apply)."""

    model: str
    input_per_mtok: Decimal
    output_per_mtok: Decimal
    cache_read_per_mtok: Decimal | None
    cache_write_per_mtok: Decimal | None
    cache_write_1h_per_mtok: Decimal | None
    long_context: LongContextTier | None
    #: provenance: ``<source>:<the source's key>``
    source: str
    #: (unit, USD per unit) and (service tier, token-price multiplier), sorted; () when
    #: the source gives none
    unit_prices: tuple[tuple[str, Decimal], ...] = ()
    service_tiers: tuple[tuple[str, Decimal], ...] = ()
    #: (service tier, ((price field, USD per Mtok), ...)): the classes a tier bills apart
    #: from its multiplier, sorted; () when none
    service_tier_rates: tuple[tuple[str, tuple[tuple[str, Decimal], ...]], ...] = ()

    def signature(self) -> tuple[Any, ...]:
        """What the price is, provenance aside (two ids that agree have equal ones)."""
        tier = self.long_context
        return (
            self.input_per_mtok,
            self.output_per_mtok,
            self.cache_read_per_mtok,
            self.cache_write_per_mtok,
            self.cache_write_1h_per_mtok,
            None
            if tier is None
            else (tier.above_input_tokens, tier.input_per_mtok, tier.output_per_mtok),
            self.unit_prices,
            self.service_tiers,
            self.service_tier_rates,
        )


@dataclass
class SourceFile:
    """What was read from one source file."""

    name: str
    #: ``<file name> sha256:<12 hex>``: which file exactly, for provenance
    label: str
    prices: list[SourcePrice] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def read_source(
    kind: str,
    path: Path,
    *,
    providers: Iterable[str] | None = None,
    on: date,
) -> SourceFile:
    """Read ``path`` in the format ``kind`` (one of :data:`SOURCES`); ``on`` picks dated
    conditional prices (genai-prices). ConfigError names the file and what is wrong."""
    if kind not in SOURCES:
        raise ConfigError(f"--from: {kind!r} is not a known source ({', '.join(SOURCES)})")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8") from None
    doc = load_exact_json(text, source=str(path))
    wanted = frozenset(providers) if providers else DEFAULT_PROVIDERS[kind]
    out = SourceFile(name=kind, label=f"{path.name} sha256:{hashlib.sha256(raw).hexdigest()[:12]}")
    if kind == "litellm":
        _read_litellm(doc, wanted, out, str(path))
    else:
        _read_genai(doc, wanted, out, str(path), on)
    for price in out.prices:
        for name in ("input_per_mtok", "output_per_mtok", "cache_read_per_mtok",
                     "cache_write_per_mtok", "cache_write_1h_per_mtok"):  # fmt: skip
            value = getattr(price, name)
            if value is not None and places(value) > SUSPICIOUS_PLACES:
                out.warnings.append(
                    f"{price.source}: {name} {value} has {places(value)} decimal places "
                    "(a float artifact in the source?); imported exactly as written"
                )
    return out


# -- LiteLLM -------------------------------------------------------------------------


def _read_litellm(doc: Any, wanted: frozenset[str], out: SourceFile, where: str) -> None:
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: a LiteLLM price map is a JSON object keyed by model id")
    for key in sorted(doc):
        entry = doc[key]
        if key == "sample_spec" or not isinstance(entry, dict):
            continue
        provider = entry.get("litellm_provider")
        if provider not in wanted:
            continue
        mode = entry.get("mode")
        if mode is not None and mode not in _LITELLM_MODES:
            continue
        model = _litellm_model(key.strip().lower(), provider)
        if model is None:
            out.skipped.append(f"litellm:{key}: an id routed through another service")
            continue
        try:
            price = _litellm_price(key, model, entry, out.warnings)
        except ValueError as exc:
            out.skipped.append(f"litellm:{key}: {exc}")
            continue
        out.prices.append(price)


def _litellm_model(key: str, provider: str) -> str | None:
    for route, owner in _LITELLM_OWN_ROUTES.items():
        if key.startswith(route) and provider == owner:
            key = key[len(route) :]
    return None if "/" in key or not key else key


def _per_token(entry: dict[str, Any], name: str, *, required: bool = False) -> Decimal | None:
    value = entry.get(name)
    if value is None:
        if required:
            raise ValueError(f"no {name}")
        return None
    number = exact_number(value)
    if number is None or number < 0:
        raise ValueError(f"{name} is not a price: {value!r}")
    return per_million(number)


#: LiteLLM's per-token modality rates -> (our surcharge unit, the text rate it is over)
_LITELLM_MODALITY_RATES: Final = {
    "input_cost_per_audio_token": ("input_audio_tokens", "input_cost_per_token"),
    "output_cost_per_audio_token": ("output_audio_tokens", "output_cost_per_token"),
    "input_cost_per_image_token": ("input_image_tokens", "input_cost_per_token"),
    "output_cost_per_image_token": ("output_image_tokens", "output_cost_per_token"),
}
#: LiteLLM's per-call prices -> (our unit, the divisor that makes them per unit)
_LITELLM_PER_CALL: Final = {
    "code_interpreter_cost_per_session": ("code_interpreter_session", 0),
    "file_search_cost_per_1k_calls": ("file_search", -3),
    "output_cost_per_image": ("image_generation", 0),
}


def surcharge(
    rate: Decimal, text_rate: Decimal, unit: str, label: str, warnings: list[str]
) -> tuple[str, Decimal] | None:
    """A modality's surcharge per token (its rate less the text rate, both USD per token),
    exact; None, with a warning, when the modality is cheaper than text (a unit price is
    never negative: the source's rate is then not imported)."""
    with localcontext() as ctx:
        ctx.prec = 200
        difference = rate - text_rate
    if difference < 0:
        warnings.append(
            f"{label}: {unit} costs less than text ({price_text(rate)} < "
            f"{price_text(text_rate)} USD per token): not imported"
        )
        return None
    return unit, canonical(difference)


def _litellm_price(key: str, model: str, entry: dict[str, Any], warnings: list[str]) -> SourcePrice:
    thresholds = sorted(
        int(match.group(1)) for match in map(_TIER_KEY.match, entry) if match is not None
    )
    tier = None
    if len(thresholds) > 1:
        raise ValueError(f"several long-context tiers ({thresholds}k): one is representable")
    if thresholds:
        k = thresholds[0]
        tier_in = _per_token(entry, f"input_cost_per_token_above_{k}k_tokens", required=True)
        tier_out = _per_token(entry, f"output_cost_per_token_above_{k}k_tokens")
        base_out = _per_token(entry, "output_cost_per_token", required=True)
        assert tier_in is not None and base_out is not None
        tier = LongContextTier(k * 1000, tier_in, base_out if tier_out is None else tier_out)
    input_price = _per_token(entry, "input_cost_per_token", required=True)
    output_price = _per_token(entry, "output_cost_per_token", required=True)
    assert input_price is not None and output_price is not None
    units: list[tuple[str, Decimal]] = []
    search = entry.get("search_context_cost_per_query")
    if isinstance(search, dict):  # USD per search; the medium context size is the default
        medium = exact_number(search.get("search_context_size_medium"))
        if medium is not None and medium >= 0:
            units.append(("web_search", canonical(medium)))
    for name, (unit, shift) in _LITELLM_PER_CALL.items():
        number = exact_number(entry.get(name))
        if number is not None and number >= 0:
            units.append((unit, canonical(number, shift=shift)))
    for name, (unit, text_name) in _LITELLM_MODALITY_RATES.items():
        rate = exact_number(entry.get(name))
        text_rate = exact_number(entry.get(text_name))
        if rate is not None and rate >= 0 and text_rate is not None:
            made = surcharge(rate, text_rate, unit, f"litellm:{key}", warnings)
            if made is not None:
                units.append(made)
    cache_read = _per_token(entry, "cache_read_input_token_cost")
    base = {"input": input_price, "output": output_price, "cache_read": cache_read}
    tiers: list[tuple[str, Decimal]] = []
    tier_rates: list[tuple[str, tuple[tuple[str, Decimal], ...]]] = []
    for suffix, tier_name in (("batches", "batch"), ("flex", "flex"), ("priority", "priority")):
        terms = _litellm_tier(entry, suffix, base, tier)
        if terms is not None:
            factor, rates = terms
            if factor is not None:
                tiers.append((tier_name, factor))
            if rates:
                tier_rates.append((tier_name, tuple(sorted(rates.items()))))
    return SourcePrice(
        model=model,
        input_per_mtok=input_price,
        output_per_mtok=output_price,
        cache_read_per_mtok=cache_read,
        cache_write_per_mtok=_per_token(entry, "cache_creation_input_token_cost"),
        cache_write_1h_per_mtok=_per_token(entry, "cache_creation_input_token_cost_above_1hr"),
        long_context=tier,
        source=f"litellm:{key}",
        unit_prices=tuple(sorted(units)),
        service_tiers=tuple(sorted(tiers)),
        service_tier_rates=tuple(tier_rates),
    )


def _litellm_tier(
    entry: dict[str, Any],
    suffix: str,
    base: dict[str, Decimal | None],
    long_context: LongContextTier | None,
) -> tuple[Decimal | None, dict[str, Decimal]] | None:
    """A service tier as the entry prices it (``input_cost_per_token_<suffix>``, output's,
    ``cache_read_input_token_cost_<suffix>``, and each above the long-context edge,
    ``..._above_<k>k_tokens_<suffix>``): its multiplier and the rates of the classes it
    bills apart (:func:`.tiers.tier_terms`), or None without an input and output rate."""
    keys: tuple[tuple[str, str], ...] = (
        ("input", "input_cost_per_token"),
        ("output", "output_cost_per_token"),
        ("cache_read", "cache_read_input_token_cost"),
    )
    if long_context is not None:
        k = long_context.above_input_tokens // 1000
        keys += tuple(
            (f"{LONG_CONTEXT_RATE_PREFIX}{name}", f"{key}_above_{k}k_tokens") for name, key in keys
        )
    given = {name: _per_token(entry, f"{key}_{suffix}") for name, key in keys}
    tier = {name: rate for name, rate in given.items() if rate is not None}
    plain = {name: rate for name, rate in base.items() if rate is not None}
    return tier_terms(plain, tier, long_context)


# -- genai-prices --------------------------------------------------------------------


def _read_genai(doc: Any, wanted: frozenset[str], out: SourceFile, where: str, on: date) -> None:
    if not isinstance(doc, list):
        raise ConfigError(f"{where}: genai-prices data is a JSON list of providers")
    for provider in doc:
        if not isinstance(provider, dict) or provider.get("id") not in wanted:
            continue
        models = provider.get("models")
        if not isinstance(models, list):
            raise ConfigError(f"{where}: provider {provider.get('id')!r}: 'models' is not a list")
        for model in models:
            if not isinstance(model, dict) or not isinstance(model.get("id"), str):
                continue
            label = f"genai-prices:{provider['id']}/{model['id']}"
            try:
                prefixes = _genai_prefixes(model.get("match"))
                prices = _genai_prices_on(model.get("prices"), on)
                made = _genai_price(prices, label, out.warnings)
            except ValueError as exc:
                out.skipped.append(f"{label}: {exc}")
                continue
            if not prefixes:
                out.skipped.append(f"{label}: no starts_with/equals match to use as a prefix")
                continue
            for prefix in prefixes:
                if "/" in prefix:
                    out.skipped.append(f"{label}: {prefix!r} is routed through another service")
                    continue
                if prefix[-1] in "-.@:_":  # gpt-4o-2024-: snapshots, priced by the model's id
                    out.skipped.append(f"{label}: {prefix!r} is a prefix, not a model id")
                    continue
                out.prices.append(SourcePrice(model=prefix, source=label, **made))


def _genai_prefixes(clause: Any) -> list[str]:
    """The prefixes a match clause names: ``starts_with`` and ``equals`` (an exact id is
    taken as a prefix), inside ``or``; other clauses name none."""
    if not isinstance(clause, dict) or len(clause) != 1:
        return []
    ((kind, value),) = clause.items()
    if kind in ("starts_with", "equals") and isinstance(value, str) and value.strip():
        return [value.strip().lower()]
    if kind == "or" and isinstance(value, list):
        out: list[str] = []
        for item in value:
            for prefix in _genai_prefixes(item):
                if prefix not in out:
                    out.append(prefix)
        return out
    return []


def _genai_prices_on(prices: Any, on: date) -> dict[str, Any]:
    if isinstance(prices, dict):
        return prices
    if not isinstance(prices, list) or not prices:
        raise ValueError("no prices")
    chosen: dict[str, Any] | None = None
    chosen_start: date | None = None
    for item in prices:
        if not isinstance(item, dict) or not isinstance(item.get("prices"), dict):
            raise ValueError("a conditional price without prices")
        constraint = item.get("constraint")
        if constraint is None:
            if chosen_start is None:
                chosen = item["prices"]
            continue
        if not isinstance(constraint, dict) or "start_date" not in constraint:
            raise ValueError("time-of-day prices are not representable")
        try:
            start = date.fromisoformat(str(constraint["start_date"]))
        except ValueError:
            raise ValueError(f"start_date {constraint['start_date']!r} is not a date") from None
        if start <= on and (chosen_start is None or start > chosen_start):
            chosen, chosen_start = item["prices"], start
    if chosen is None:
        raise ValueError("no price in force on the import date")
    return chosen


def _mtok(prices: dict[str, Any], name: str) -> tuple[Decimal | None, tuple[int, Decimal] | None]:
    """(base price, (tier start, tier price) or None) of one genai-prices field."""
    value = prices.get(name)
    if value is None:
        return None, None
    if isinstance(value, dict):
        base = exact_number(value.get("base"))
        tiers = value.get("tiers")
        if base is None or base < 0 or not isinstance(tiers, list):
            raise ValueError(f"{name}: a tiered price needs base and tiers")
        if len(tiers) != 1 or not isinstance(tiers[0], dict):
            raise ValueError(f"{name}: {len(tiers)} tiers: one is representable")
        start, price = tiers[0].get("start"), exact_number(tiers[0].get("price"))
        if type(start) is not int or start < 0 or price is None or price < 0:
            raise ValueError(f"{name}: a tier needs an integer start and a price")
        return canonical(base), (start, canonical(price))
    number = exact_number(value)
    if number is None or number < 0:
        raise ValueError(f"{name} is not a price: {value!r}")
    return canonical(number), None


#: genai-prices' per-million modality rates -> (our surcharge unit, the text rate's field)
_GENAI_MODALITY_RATES: Final = {
    "input_audio_mtok": ("input_audio_tokens", "input_mtok"),
    "output_audio_mtok": ("output_audio_tokens", "output_mtok"),
}


def _genai_price(prices: dict[str, Any], label: str, warnings: list[str]) -> dict[str, Any]:
    input_price, input_tier = _mtok(prices, "input_mtok")
    output_price, output_tier = _mtok(prices, "output_mtok")
    if input_price is None or output_price is None:
        raise ValueError("no input_mtok and output_mtok")
    tier = None
    if input_tier is not None:
        if output_tier is not None and output_tier[0] != input_tier[0]:
            raise ValueError("input and output tiers start at different sizes")
        tier = LongContextTier(
            input_tier[0], input_tier[1], output_price if output_tier is None else output_tier[1]
        )
    elif output_tier is not None:
        raise ValueError("an output tier without an input tier is not representable")
    cache_read, _ = _mtok(prices, "cache_read_mtok")
    cache_write, _ = _mtok(prices, "cache_write_mtok")
    units: list[tuple[str, Decimal]] = []
    per_thousand = prices.get("tool_use_kcount")
    if isinstance(per_thousand, dict):  # USD per thousand uses, by unit
        for unit, value in per_thousand.items():
            number = exact_number(value)
            if valid_unit_name(unit) and number is not None and number >= 0:
                units.append((unit, canonical(number, shift=-3)))
    for name, (unit, text_name) in _GENAI_MODALITY_RATES.items():
        if prices.get(name) is None:
            continue
        rate, rate_tier = _mtok(prices, name)
        text_rate, _ = _mtok(prices, text_name)
        if rate_tier is not None:
            warnings.append(f"{label}: {name} is tiered: not imported")
        elif rate is not None and text_rate is not None:
            made = surcharge(
                canonical(rate, shift=-6), canonical(text_rate, shift=-6), unit, label, warnings
            )
            if made is not None:
                units.append(made)
    if prices.get("cache_audio_read_mtok") is not None:
        warnings.append(
            f"{label}: cache_audio_read_mtok is not representable (cached audio is charged "
            "as cache reads): not imported"
        )
    return {
        "input_per_mtok": input_price,
        "output_per_mtok": output_price,
        "cache_read_per_mtok": cache_read,
        "cache_write_per_mtok": cache_write,
        "cache_write_1h_per_mtok": None,
        "long_context": tier,
        "unit_prices": tuple(sorted(units)),
    }
