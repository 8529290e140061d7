"""Exact decimals out of community price files (JSON numbers, never floats).

Community price maps are JSON with binary-float-looking numbers: LiteLLM gives USD
per token (``3e-06``), genai-prices USD per million tokens (``0.3``). A float would
turn ``3.3e-06 * 1e6`` into ``3.3000000000000003``; so the JSON is parsed with
``parse_float=Decimal``: each number becomes the exact decimal its text says
(``Decimal("3.3e-06")``), never a binary float. Per-token prices are then moved six
places (``scaleb(6)``, an exponent change, exact) and normalised, under a context
that traps any inexact step: ``3.3e-06`` becomes ``3.3``, ``3e-06`` ``3``, ``1.25e-07`` ``0.125``,
``3.0000000000000004e-07`` (a float artifact in the source) stays exactly
``0.30000000000000004`` and is reported as suspicious, never silently rounded.
"""

from __future__ import annotations

import json
from decimal import Decimal, Inexact, InvalidOperation, localcontext
from typing import Any

from schemas.errors import ConfigError

#: decimal places beyond which an imported per-million price looks like a float artifact
SUSPICIOUS_PLACES = 6


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a price")


def load_exact_json(text: str, *, source: str) -> Any:
    """The JSON document with every non-integer number as its exact ``Decimal``.

    ``NaN``/``Infinity`` are refused; integers stay ``int`` (already exact)."""
    try:
        return json.loads(text, parse_float=Decimal, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        raise ConfigError(f"{source}: not valid JSON: {exc}") from None


def exact_number(value: Any) -> Decimal | None:
    """A JSON number as read by :func:`load_exact_json` (``Decimal`` or ``int``), or None
    for anything else (``bool`` is not a number here)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, Decimal) and value.is_finite():
        return value
    return None


def per_million(per_token: Decimal) -> Decimal:
    """USD per token to USD per million tokens, exactly (raises if it could not be)."""
    return canonical(per_token, shift=6)


def canonical(value: Decimal, *, shift: int = 0) -> Decimal:
    """``value * 10**shift`` without trailing zeros, exactly (``3.000000`` is ``3``)."""
    with localcontext() as ctx:
        ctx.prec = 200
        ctx.traps[Inexact] = True
        try:
            moved = value.scaleb(shift).normalize()
            if moved.as_tuple().exponent > 0:  # type: ignore[operator]  # a finite Decimal: the exponent is an int
                moved = moved.quantize(Decimal(1))  # 3E+1 -> 30: plain digits
        except (Inexact, InvalidOperation):
            raise ConfigError(f"{value}: cannot be moved {shift} places exactly") from None
    return moved


def places(value: Decimal) -> int:
    """Decimal places of a canonical value."""
    exponent = value.as_tuple().exponent
    return -exponent if isinstance(exponent, int) and exponent < 0 else 0


def price_text(value: Decimal) -> str:
    """The decimal as a price file writes it: plain digits, no exponent (``0.000003``)."""
    return format(value, "f")
