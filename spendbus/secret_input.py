"""Secrets a command takes: from a file or standard input, never from its arguments.

An argument is visible to every user of the machine (``ps``, ``/proc/*/cmdline``) and
stays in shell history, so a command's secret option is a file (``-`` is standard
input, first line); the old argv forms stop with an error that says what to use.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click
from click.core import ParameterSource

from runtime.private_files import secret_file_problem


def read_secret(source: str, what: str) -> str:
    """The first line of file ``source`` (``-``: standard input), stripped; a click error
    naming ``what`` when it is unreadable, empty (never the text) or readable by other
    users (runtime/private_files.py)."""
    if source == "-":
        line = sys.stdin.readline()
        where = "standard input"
    else:
        where = source
        problem = secret_file_problem(source, f"{source} (the {what})")
        if problem is not None:
            raise click.BadParameter(problem)
        try:
            lines = Path(source).read_text().splitlines()
        except OSError as exc:
            raise click.BadParameter(f"{source}: cannot read the {what} ({exc.strerror})") from None
        line = lines[0] if lines else ""
    if not line.strip():
        raise click.BadParameter(f"{where}: no {what} on the first line")
    return line.strip()


def refuse_on_command_line(param: str, instead: str) -> None:
    """Stop when option ``param`` of the current command was given as an argument
    (an environment variable bound to it is fine)."""
    ctx = click.get_current_context()
    if ctx.get_parameter_source(param) is ParameterSource.COMMANDLINE:
        raise click.UsageError(
            f"secrets are never taken as arguments (other users see them in ps, shells keep "
            f"them in history): {instead}"
        )
