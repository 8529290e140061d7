"""The demo's live view in a log: the line after it starts a line of its own."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from spendbus.demo import live_view


def test_a_line_printed_after_the_live_view_starts_on_its_own_line() -> None:
    captured = io.StringIO()
    console = Console(file=captured, width=60, force_terminal=False)
    table = Table("org", "spent")
    table.add_row("acme", "$1.00")
    with live_view(table, console) as live:
        live.update(table)
    console.print("imported 3,061 tokens")
    lines = captured.getvalue().splitlines()
    assert "imported 3,061 tokens" in lines
    assert lines[lines.index("imported 3,061 tokens") - 1].startswith("└")
