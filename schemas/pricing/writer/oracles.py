"""The two community price maps ("oracles") read from their pinned packages into one small
snapshot: what each map says every current chat model of the four providers costs.

``make prices`` downloads the pinned wheels (:data:`PINS`; no other network) and calls
:func:`snapshot_from_wheels`: LiteLLM's wheel ships
``litellm/model_prices_and_context_window_backup.json`` (read as JSON, exactly), and
pydantic's genai-prices ships its data as Python (``genai_prices/data.py``, read by
importing the package from the wheel). The snapshot (``schemas/data/oracle_prices.json``)
keeps, per model id, each map's rates in USD per million tokens as exact decimal
strings:

``input``, ``output``, ``cache_read``, ``cache_write`` (5-minute), ``cache_write_1h``
    the token prices (a class the map does not price is absent);
``long_context``
    ``[above_input_tokens, input, output]`` when the map prices prompts above a size at
    a second rate (one such tier);
``tiers``
    ``{batch|flex|priority: {input, output, cache_read}}``: the rates of a service tier,
    as given (a class the tier does not reprice keeps the standard rate); and where the
    map prices the tier above the long-context edge, ``long_context_input``,
    ``long_context_output``, ``long_context_cache_read`` (gpt-5.4's batch cached input
    is $0.13 below 272k and $0.25 above).

The generation (:mod:`schemas.pricing.writer.generate`) and the test that holds the shipped
file to the maps (tests/schemas/test_prices_against_oracles.py) read this snapshot, so
neither needs the packages nor the network.
"""

from __future__ import annotations

import importlib
import json
import sys
import zipfile
from collections.abc import Iterator, Mapping
from datetime import UTC, date, datetime, time
from decimal import Decimal
from pathlib import Path
from typing import Any, Final

from schemas.errors import ConfigError
from schemas.pricing import LONG_CONTEXT_RATE_PREFIX

#: the oracle versions the shipped table is made from (exact pins: PyPI)
PINS: Final = {"litellm": "1.110.2", "genai-prices": "0.2.3"}
#: the path of LiteLLM's map inside its wheel
LITELLM_MAP: Final = "litellm/model_prices_and_context_window_backup.json"
#: LiteLLM providers and genai-prices provider ids of the four providers spendbus meters
LITELLM_PROVIDERS: Final = frozenset(
    {"openai", "anthropic", "gemini", "bedrock", "bedrock_converse"}
)
GENAI_PROVIDERS: Final = frozenset({"openai", "anthropic", "google", "aws"})
_LITELLM_MODES: Final = frozenset({"chat", "responses"})
#: the two maps, as the snapshot names them
MAPS: Final = ("litellm", "genai-prices")
#: the service tiers the snapshot gives, the token classes it gives a tier's rates of,
#: and those a tier needs (without an input and output rate it is not imported)
SERVICE_TIERS: Final = ("batch", "flex", "priority")
TIER_CLASSES: Final = ("input", "output", "cache_read")
TIER_NEEDS: Final = ("input", "output")
#: a tier's rates above the long-context edge, and all the rates a tier may give
TIER_LONG_CLASSES: Final = tuple(LONG_CONTEXT_RATE_PREFIX + name for name in TIER_CLASSES)
TIER_RATE_CLASSES: Final = TIER_CLASSES + TIER_LONG_CLASSES
#: LiteLLM's suffix of a service tier's price keys, and genai-prices' price context
_LITELLM_TIERS: Final = {"batch": "_batches", "flex": "_flex", "priority": "_priority"}
_GENAI_TIERS: Final = {
    "batch": {"processing": "batch"},
    "flex": {"service_tier": "flex"},
    "priority": {"service_tier": "priority"},
}
_MILLION: Final = Decimal(1_000_000)

Rates = dict[str, Any]


def text(value: Decimal) -> str:
    """An exact decimal in plain digits, no trailing zeros (``3``, ``0.075``)."""
    out = format(value.normalize(), "f")
    return out


def _per_million(value: Any) -> str | None:
    if isinstance(value, Decimal):
        return text(value * _MILLION)
    return None


# -- LiteLLM -----------------------------------------------------------------------------


def litellm_rates(doc: Mapping[str, Any], on: date) -> dict[str, Rates]:
    """Every current chat model of the four providers in LiteLLM's map (parsed with
    ``parse_float=Decimal``): id -> rates."""
    out: dict[str, Rates] = {}
    for key in sorted(doc):
        entry = doc[key]
        if not isinstance(entry, dict) or entry.get("litellm_provider") not in LITELLM_PROVIDERS:
            continue
        if entry.get("mode") not in _LITELLM_MODES:
            continue
        retired = entry.get("deprecation_date")
        if isinstance(retired, str) and retired[:10] <= on.isoformat():
            continue
        model = key.strip().lower().removeprefix("gemini/")
        if "/" in model:  # routed through another service (bedrock/us-east-1/...)
            continue
        rates = _litellm_one(entry)
        if rates is not None:
            out[model] = rates
    return out


def _litellm_one(entry: Mapping[str, Any]) -> Rates | None:
    inp = _per_million(entry.get("input_cost_per_token"))
    outp = _per_million(entry.get("output_cost_per_token"))
    if inp is None or outp is None:
        return None
    rates: Rates = {"input": inp, "output": outp}
    for name, key in (
        ("cache_read", "cache_read_input_token_cost"),
        ("cache_write", "cache_creation_input_token_cost"),
        ("cache_write_1h", "cache_creation_input_token_cost_above_1hr"),
    ):
        value = _per_million(entry.get(key))
        if value is not None:
            rates[name] = value
    above = sorted(
        int(k.removeprefix("input_cost_per_token_above_").removesuffix("k_tokens"))
        for k in entry
        if k.startswith("input_cost_per_token_above_")
        and k.endswith("k_tokens")
        and k.removeprefix("input_cost_per_token_above_").removesuffix("k_tokens").isdigit()
    )
    if len(above) == 1:
        size = above[0]
        tier_in = _per_million(entry.get(f"input_cost_per_token_above_{size}k_tokens"))
        tier_out = _per_million(entry.get(f"output_cost_per_token_above_{size}k_tokens"))
        if tier_in is not None and tier_out is not None:
            rates["long_context"] = [size * 1000, tier_in, tier_out]
    tiers: dict[str, dict[str, str]] = {}
    keys: tuple[tuple[str, str], ...] = (
        ("input", "input_cost_per_token"),
        ("output", "output_cost_per_token"),
        ("cache_read", "cache_read_input_token_cost"),
    )
    if "long_context" in rates:  # the tier's rates above the same edge, where given
        size = rates["long_context"][0] // 1000
        keys += tuple(
            (LONG_CONTEXT_RATE_PREFIX + name, f"{key}_above_{size}k_tokens") for name, key in keys
        )
    for tier, suffix in _LITELLM_TIERS.items():
        given = {name: _per_million(entry.get(key + suffix)) for name, key in keys}
        if given["input"] is not None and given["output"] is not None:
            tiers[tier] = {k: v for k, v in given.items() if v is not None}
    if tiers:
        rates["tiers"] = tiers
    return rates


def read_litellm_wheel(wheel: Path, on: date) -> dict[str, Rates]:
    with zipfile.ZipFile(wheel) as archive:
        raw = archive.read(LITELLM_MAP)
    doc = json.loads(raw, parse_float=Decimal)
    if not isinstance(doc, dict):
        raise ConfigError(f"{wheel}: {LITELLM_MAP} is not a JSON object")
    return litellm_rates(doc, on)


# -- genai-prices ------------------------------------------------------------------------


def _genai_ids(model: Any) -> Iterator[str]:
    """The model's id and the exact ids its match clause names."""
    yield str(model.id)

    def walk(clause: Any) -> Iterator[str]:
        for attr in ("equals", "starts_with"):
            value = getattr(clause, attr, None)
            if isinstance(value, str):
                yield value
        for item in getattr(clause, "or_", None) or []:
            yield from walk(item)

    yield from walk(model.match)


def _genai_price(value: Any) -> tuple[str, list[tuple[int, str]]] | None:
    """(base, [(start, price)...]) of a genai-prices price per million, or None."""
    if value is None:
        return None
    if isinstance(value, Decimal | int):
        return text(Decimal(value)), []
    base = getattr(value, "base", None)
    if not isinstance(base, Decimal | int):
        return None
    tiers = [(int(t.start), text(Decimal(t.price))) for t in getattr(value, "tiers", [])]
    return text(Decimal(base)), tiers


def _genai_one(prices: Any) -> Rates | None:
    inp = _genai_price(getattr(prices, "input_mtok", None))
    outp = _genai_price(getattr(prices, "output_mtok", None))
    if inp is None or outp is None:
        return None
    rates: Rates = {"input": inp[0], "output": outp[0]}
    for name, attr in (
        ("cache_read", "cache_read_mtok"),
        ("cache_write", "cache_write_mtok"),
        ("cache_write_1h", "cache_write_1h_mtok"),
    ):
        given = _genai_price(getattr(prices, attr, None))
        if given is not None:
            rates[name] = given[0]
    if len(inp[1]) == 1 and len(outp[1]) == 1 and inp[1][0][0] == outp[1][0][0]:
        rates["long_context"] = [inp[1][0][0], inp[1][0][1], outp[1][0][1]]
        read = _genai_price(getattr(prices, "cache_read_mtok", None))
        if read is not None and len(read[1]) == 1 and read[1][0][0] == inp[1][0][0]:
            rates[LONG_CONTEXT_RATE_PREFIX + "cache_read"] = read[1][0][1]
    return rates


def genai_rates(providers: Any, on: date) -> dict[str, Rates]:
    """Every model of the four providers in genai-prices' data (``providers``, its
    ``genai_prices.data.providers``), priced as on ``on``: id -> rates."""
    at = datetime.combine(on, time(0), tzinfo=UTC)
    out: dict[str, Rates] = {}
    for provider in providers:
        if provider.id not in GENAI_PROVIDERS:
            continue
        for model in provider.models:
            if getattr(model, "deprecated", None):
                continue
            rates = _genai_one(model.get_prices(at))
            if rates is None:
                continue
            tiers: dict[str, dict[str, str]] = {}
            for tier, context in _GENAI_TIERS.items():
                tiered = _genai_one(model.get_prices(at, context))
                if tiered is None:
                    continue
                given: dict[str, str] = {k: tiered[k] for k in TIER_CLASSES if k in tiered}
                standard = {k: rates[k] for k in given if k in rates}
                reprices = given != standard
                edge = tiered.get("long_context")
                if edge is not None and edge[0] == (rates.get("long_context") or [None])[0]:
                    given[LONG_CONTEXT_RATE_PREFIX + "input"] = edge[1]
                    given[LONG_CONTEXT_RATE_PREFIX + "output"] = edge[2]
                    read = tiered.get(LONG_CONTEXT_RATE_PREFIX + "cache_read")
                    if read is not None:
                        given[LONG_CONTEXT_RATE_PREFIX + "cache_read"] = read
                # the tier reprices something (its rates above the edge too)
                if reprices or edge != rates.get("long_context"):
                    tiers[tier] = given
            rates.pop(LONG_CONTEXT_RATE_PREFIX + "cache_read", None)
            if tiers:
                rates["tiers"] = tiers
            for model_id in _genai_ids(model):
                model_id = model_id.strip().lower()
                if model_id and "/" not in model_id and model_id[-1] not in "-.@:_":
                    out.setdefault(model_id, rates)
    return out


def read_genai_wheel(wheel: Path, on: date) -> dict[str, Rates]:
    """genai-prices' data, its package imported from the wheel (a zip on ``sys.path``)."""
    sys.path.insert(0, str(wheel))
    try:
        for name in [
            m for m in sys.modules if m == "genai_prices" or m.startswith("genai_prices.")
        ]:
            del sys.modules[name]
        data = importlib.import_module("genai_prices.data")
        return genai_rates(data.providers, on)
    finally:
        sys.path.remove(str(wheel))


# -- the snapshot -------------------------------------------------------------------------


def snapshot(litellm: Mapping[str, Rates], genai: Mapping[str, Rates], on: date) -> dict[str, Any]:
    models: dict[str, dict[str, Rates]] = {}
    for source, rates in (("litellm", litellm), ("genai-prices", genai)):
        for model, given in rates.items():
            models.setdefault(model, {})[source] = given
    return {
        "about": "what the pinned community price maps say each current chat model of "
        "OpenAI, Anthropic, Google Gemini and Bedrock costs (USD per million tokens); "
        "written by `make prices` (schemas/pricing/writer/oracles.py), do not edit",
        "pins": {name: f"{name}=={version}" for name, version in PINS.items()},
        "as_of": on.isoformat(),
        "models": {model: models[model] for model in sorted(models)},
    }


def snapshot_from_wheels(wheels: Path, on: date) -> dict[str, Any]:
    """The snapshot from the pinned wheels downloaded into ``wheels``."""
    found: dict[str, Path] = {}
    for name, version in PINS.items():
        stem = name.replace("-", "_")
        matches = sorted(wheels.glob(f"{stem}-{version}-*.whl"))
        if not matches:
            raise ConfigError(f"{wheels}: no {name}=={version} wheel (make prices downloads it)")
        found[name] = matches[0]
    return snapshot(
        read_litellm_wheel(found["litellm"], on), read_genai_wheel(found["genai-prices"], on), on
    )


def snapshot_text(snap: Mapping[str, Any]) -> str:
    """The snapshot as JSON, one model a line (a map update is a readable diff)."""
    head = [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in snap.items() if k != "models"]
    models = snap["models"]
    rows = [
        f"  {json.dumps(m)}: {json.dumps(models[m], sort_keys=True, separators=(',', ':'))}"
        for m in models
    ]
    return "{\n" + "\n".join(head) + '\n "models": {\n' + ",\n".join(rows) + "\n }\n}\n"


def load_snapshot(path: Path) -> dict[str, Any]:
    doc = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(doc, dict) or not isinstance(doc.get("models"), dict):
        raise ConfigError(f"{path}: not an oracle snapshot (no 'models')")
    return doc
