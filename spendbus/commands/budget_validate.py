"""`spendbus budgets validate FILE`: a budget file checked with no broker, for CI.

It reads only the file and the contract (schemas.budgets, the validation `budgets apply`
runs), so it loads no Kafka client (tests/cli/test_lazy_commands.py), and it lists every
error rather than the first: a CI run shows the whole file's mistakes at once."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import click
import yaml

from schemas.budgets import parse_budgets_yaml

#: the exit status of a file with errors (CI fails on it); 0 when valid
INVALID_EXIT = 1


@click.command("validate")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
def budgets_validate(file: Path) -> None:
    """Check FILE (a YAML list of budgets) as `budgets apply` would, with no broker.

    Prints every error, each naming the file, the budget and the field, and exits 1; or,
    when the file is valid, one line saying how many budgets it holds, and exits 0."""
    try:
        document = yaml.safe_load(file.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        click.echo(f"error: {file}: {exc}", err=True)
        raise click.exceptions.Exit(INVALID_EXIT) from None
    budgets, errors = parse_budgets_yaml(document, source=str(file))
    if errors:
        for error in errors:
            click.echo(f"error: {error}", err=True)
        click.echo(f"{file}: {len(errors)} error{'s' * (len(errors) != 1)}", err=True)
        raise click.exceptions.Exit(INVALID_EXIT)
    actions = Counter(b.action for b in budgets)
    kinds = ", ".join(f"{actions[a]} {a}" for a in sorted(actions)) or "none"
    click.echo(f"{file}: {len(budgets)} budget{'s' * (len(budgets) != 1)} valid ({kinds})")
