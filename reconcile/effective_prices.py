"""The provider's effective rates as a price map, for a new price version.

When the tokens of a (model, tier) agree and its money does not (cause ``price``), the
cost report says what the provider really charged per token of each class. Those rates
are written as a LiteLLM-format price map (USD per token, exact decimals), which
`spendbus prices import --from litellm` turns into a new dated version of the price file
(`spendbus reconcile prices` does both), so history can be replayed at the billed rates.
Only the standard tier is written (a tier's rate is a multiplier of the standard one in
the price file); a model whose input or output rate the report cannot give is left out,
with a note.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from decimal import Decimal

from .matching import CostCell

#: the price map's key of each token class (LiteLLM's names)
RATE_KEYS = {
    "input": "input_cost_per_token",
    "output": "output_cost_per_token",
    "cache_read": "cache_read_input_token_cost",
    "cache_write_5m": "cache_creation_input_token_cost",
}
#: USD per token to this many places (a millionth of a dollar per million tokens): what
#: per-call rounding leaves in a rate is below it
PLACES = Decimal("1e-12")


def effective_price_map(
    costs: Iterable[CostCell],
) -> tuple[dict[str, dict[str, object]], list[str]]:
    """``model -> entry`` of the cells whose cause is ``price``, and notes on those left out."""
    entries: dict[str, dict[str, object]] = {}
    notes: list[str] = []
    for cell in costs:
        if "price" not in cell.causes:
            continue
        if cell.tier != "standard":
            notes.append(
                f"{cell.model} [{cell.tier}]: a tier's rate is not written (standard only)"
            )
            continue
        rates: dict[str, Decimal] = {}
        for token_class, key in RATE_KEYS.items():
            tokens = cell.provider_tokens.get(token_class, 0)
            if tokens:
                nanos = Decimal(cell.provider_classes.get(token_class, 0))
                rates[key] = (nanos / tokens / 10**9).quantize(PLACES).normalize()
        if "input_cost_per_token" not in rates or "output_cost_per_token" not in rates:
            notes.append(f"{cell.model}: the report bills no input or no output: no rate written")
            continue
        previous = entries.get(cell.model)
        if previous is not None and any(previous.get(k) != v for k, v in rates.items()):
            notes.append(f"{cell.model}: billed at different rates on different days: left out")
            entries.pop(cell.model)
            continue
        entries[cell.model] = {"litellm_provider": cell.provider, "mode": "chat", **rates}
    return entries, notes


def price_map_text(entries: dict[str, dict[str, object]]) -> str:
    """The map as JSON, each rate an exact decimal number (never a float's repr)."""

    def value(item: object) -> str:
        if isinstance(item, Decimal):
            return format(item, "f")
        return json.dumps(item)

    models = []
    for model in sorted(entries):
        fields = ", ".join(f"{json.dumps(k)}: {value(v)}" for k, v in entries[model].items())
        models.append(f"  {json.dumps(model)}: {{{fields}}}")
    return "{\n" + ",\n".join(models) + "\n}\n"
