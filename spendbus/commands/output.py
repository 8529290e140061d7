"""What the operator commands print in common: an error's exit, a budget's limits."""

from __future__ import annotations

import sys

from rich.console import Console

from schemas.errors import SpendbusError
from schemas.money import format_usd

console = Console()


def fail(exc: SpendbusError) -> None:
    console.print(f"[red]error:[/red] {exc}", highlight=False)
    sys.exit(2)


def limits_text(nanos: int | None, tokens: int | None, requests: int | None) -> str:
    """A budget's limits, e.g. ``$50.00 / 2,000,000 tok``."""
    parts = []
    if nanos is not None:
        parts.append(format_usd(nanos, 2))
    if tokens is not None:
        parts.append(f"{tokens:,} tok")
    if requests is not None:
        parts.append(f"{requests:,} req")
    return " / ".join(parts)
