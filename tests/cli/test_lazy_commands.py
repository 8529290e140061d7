"""`spendbus` imports a command's module only when that command runs (issue 38, item 5):
the command list shows each command's help from the table in spendbus/cli.py, which
must say what the command itself says, and `--help` or `price` load no room."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest

from spendbus.cli import (
    BUDGETS_COMMANDS,
    COMMANDS,
    RECONCILE_COMMANDS,
    budgets_group,
    cli,
    reconcile_group,
)
from spendbus.lazy_group import LazyGroup

#: what `spendbus --help` and `spendbus price` never need: the rooms and their I/O
HEAVY = (
    "aggregator",
    "enforcer",
    "ingest",
    "notify",
    "reconcile",
    "aiokafka",
    "aiohttp",
    "faust",
    "fastavro",
)


def loaded(name: str) -> click.Command:
    command = cli.get_command(click.Context(cli), name)
    assert command is not None, name
    return command


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_summary_is_the_first_paragraph_of_the_commands_help(name: str) -> None:
    command = loaded(name)
    assert command.name == name
    first = " ".join((command.help or "").split("\n\n")[0].split())
    assert COMMANDS[name].summary == first
    group = LazyGroup(name="fresh", lazy=COMMANDS)  # nothing loaded: the summary speaks
    for limit in (20, 45, 74, 120, 400):
        assert group.command_summary(name, limit) == command.get_short_help_str(limit)


@pytest.mark.parametrize(
    ("group_of", "name"),
    [(budgets_group, name) for name in sorted(BUDGETS_COMMANDS)]
    + [(reconcile_group, name) for name in sorted(RECONCILE_COMMANDS)],
)
def test_each_subcommands_summary_is_the_first_paragraph_of_its_help(
    group_of: Any, name: str
) -> None:
    group = group_of()
    assert isinstance(group, LazyGroup)
    command = group.get_command(click.Context(group), name)
    assert command is not None and command.name == name
    first = " ".join((command.help or "").split("\n\n")[0].split())
    assert group.lazy[name].summary == first


def test_the_command_list_is_the_same_loaded_or_not() -> None:
    unloaded = LazyGroup(name="spendbus", lazy=COMMANDS, params=cli.params, help=cli.help)
    eager = click.Group(name="spendbus", params=cli.params, help=cli.help)
    for name in COMMANDS:
        eager.add_command(loaded(name), name)
    for width in (60, 80, 100, 160):
        texts = []
        for group in (unloaded, eager):
            formatter = click.HelpFormatter(width=width)
            group.format_help(click.Context(group, terminal_width=width), formatter)
            texts.append(formatter.getvalue())
        assert texts[0] == texts[1]
    assert not unloaded.commands, "formatting the list imported a command"


def test_a_name_the_table_does_not_know_is_no_command() -> None:
    assert cli.get_command(click.Context(cli), "no-such-command") is None


def modules_after(*argv: str) -> list[str]:
    """The top-level packages `spendbus ARGV` has imported when it exits."""
    script = (
        "import atexit, json, sys\n"
        "atexit.register(lambda: sys.__stderr__.write('MODULES ' + json.dumps("
        "sorted({m.split('.')[0] for m in sys.modules})) + '\\n'))\n"
        f"sys.argv = ['spendbus', *{list(argv)!r}]\n"
        "from spendbus.cli import main\n"
        "main()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stderr.splitlines() if x.startswith("MODULES "))
    return list(json.loads(line.removeprefix("MODULES ")))


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["price", "--model", "claude-sonnet-4-5", "--input-tokens", "1000"],
    ],
)
def test_quick_commands_load_no_room(argv: list[str]) -> None:
    imported = modules_after(*argv)
    assert "spendbus" in imported and "click" in imported  # the probe saw the run
    assert not set(HEAVY) & set(imported), sorted(set(HEAVY) & set(imported))


def test_budgets_validate_loads_no_room_nor_kafka(tmp_path: Path) -> None:
    """CI validates a budget file where no broker runs: nothing of Kafka is imported."""
    path = tmp_path / "budgets.yaml"
    path.write_text("- {id: a, scope: org, window: month, limit_usd: '5'}\n")
    imported = modules_after("budgets", "validate", str(path))
    assert "schemas" in imported and "yaml" in imported  # the probe saw the check
    assert not set(HEAVY) & set(imported), sorted(set(HEAVY) & set(imported))


def test_a_command_that_needs_kafka_still_loads_it() -> None:
    """The probe can fail: `topics --help` imports its command's module, and Kafka's client."""
    assert "aiokafka" in modules_after("topics", "--help")
