"""A click group whose commands are imported when one runs, not when the CLI starts.

Every command module pulls in its room (Kafka clients, aiohttp, Faust...): importing
them all made `spendbus --help` and `spendbus price` spend most of their time loading
code they never ran. A :class:`LazyGroup` knows each command by name, where it lives
and the first paragraph of its help, which is all `--help` shows of it; the command's
module is imported by :meth:`get_command`, i.e. when it is invoked or its own help is
asked for. ``tests/cli/test_lazy_commands.py`` holds the summaries to the commands.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from gettext import gettext

import click


@dataclass(frozen=True)
class LazyCommand:
    """Where a command lives (``module:attribute``: a command, or a function making one)
    and the first paragraph of its help."""

    home: str
    summary: str

    def load(self) -> click.Command:
        module, _, attribute = self.home.partition(":")
        found = getattr(importlib.import_module(module), attribute)
        command = found if isinstance(found, click.Command) else found()
        if not isinstance(command, click.Command):
            raise TypeError(f"{self.home} is not a click command")
        return command


class LazyGroup(click.Group):
    """A group listing ``lazy`` commands by name and importing each on first use."""

    def __init__(self, *args: object, lazy: Mapping[str, LazyCommand], **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]  # click's own keywords
        self.lazy = dict(lazy)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(self.commands) | set(self.lazy))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy:
            self.add_command(self.lazy[cmd_name].load(), cmd_name)
        return super().get_command(ctx, cmd_name)

    def command_summary(self, name: str, limit: int) -> str:
        """What the command list shows for ``name``: the loaded command's own short help,
        else the same text made from its summary, without importing it."""
        command = self.commands.get(name)
        if command is not None:
            return command.get_short_help_str(limit)
        # a stand-in with the same help shortens it as click would the command's own
        return click.Command(name, help=self.lazy[name].summary).get_short_help_str(limit)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        names = self.list_commands(ctx)
        if not names:
            return
        # the same layout as click.Group's: three times the default spacing
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = [(name, self.command_summary(name, limit)) for name in names]
        with formatter.section(gettext("Commands")):  # click translates it so
            formatter.write_dl(rows)
