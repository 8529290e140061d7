"""`spendbus prices import`, `update` and `diff`: community price maps in, changes out.

``import --from litellm|genai-prices FILE`` reads the map exactly (schemas/pricing/writer/exact.py),
matches its ids to the newest version of ``--base`` (default: the shipped price file) and
writes ``--output``: every version of the base plus one new version in force from
``--effective-from`` (default: today, 00:00 UTC), whose updated and new entries say where
their prices came from (``source``). What changed, what conflicted and what could not be
represented is printed to stderr (``--report-json`` for scripts).

``update`` fetches both maps from their published URLs (schemas/pricing/writer/refresh.py), takes
what they agree on, prints the diff against our newest version and, with ``-o``, writes
the file with a new version in force from ``--effective-from``.

``diff OLD NEW`` lists every price that differs between the version in force at ``--at``
(default: the newest) of each file; exit 0 when none differs, 1 when some do, 2 on bad
input (as diff(1)).
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime, time
from pathlib import Path

import click

from schemas.errors import SpendbusError
from schemas.pricing import PriceTable, default_price_file, load_price_file
from schemas.pricing.writer import (
    PUBLISHED,
    SOURCES,
    diff_tables,
    fetch_agreed,
    import_prices,
    price_file_text,
    read_source,
)
from spendbus.commands.pricing import BadInput, parse_at


def _tables(path: Path) -> list[PriceTable]:
    try:
        return load_price_file(path)
    except SpendbusError as exc:
        raise BadInput(str(exc)) from None


def _newest(tables: list[PriceTable]) -> PriceTable | None:
    return max(tables, key=lambda t: (t.effective_from, t.version)) if tables else None


def next_version(
    base: Path | None, version: str | None, effective_text: str | None, prefix: str
) -> tuple[Path, list[PriceTable], PriceTable | None, datetime, str]:
    """The base file, its versions and newest one, and the new version's start (default
    today 00:00 UTC: after the newest) and name (default ``<prefix>-<date>``, not taken);
    BadInput otherwise."""
    if effective_text is None:
        effective = datetime.combine(datetime.now(UTC).date(), time(0), tzinfo=UTC)
    else:
        effective = parse_at(effective_text)
    base_path = base or default_price_file()
    tables = _tables(base_path)
    newest = _newest(tables)
    if newest is not None and effective <= newest.effective_from:
        raise BadInput(
            f"--effective-from: {effective.isoformat()} is not after the newest version "
            f"{newest.version!r} ({newest.effective_from.isoformat()}): a new version must follow it"
        )
    version = version or f"{prefix}-{effective.date().isoformat()}"
    if any(t.version == version for t in tables):
        raise BadInput(f"--version: {version!r} is already in {base_path}")
    return base_path, tables, newest, effective, version


def _in_force(tables: list[PriceTable], at: datetime | None, path: Path) -> PriceTable:
    if at is None:
        table = _newest(tables)
    else:
        older = [t for t in tables if t.effective_from <= at]
        table = _newest(older)
    if table is None:
        raise BadInput(
            f"{path}: no price version in force at {at.isoformat() if at else 'any time'}"
        )
    return table


@click.command("import")
@click.option(
    "--from", "source_kind", required=True, type=click.Choice(SOURCES), help="The file's format."
)
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--base",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Our price file to update (default: the one shipped with spendbus).",
)
@click.option(
    "--output",
    "-o",
    required=True,
    type=click.Path(dir_okay=False, allow_dash=True, path_type=Path),
    help="Where to write the new price file ('-' for stdout).",
)
@click.option(
    "--version", "version", default=None, help="The new version (default: <source>-<date>)."
)
@click.option(
    "--effective-from",
    "effective_text",
    default=None,
    metavar="TIMESTAMP",
    help="RFC 3339 time from which the new version prices events (default: today 00:00 UTC).",
)
@click.option(
    "--provider",
    "providers",
    multiple=True,
    help="A provider of the source to read (repeatable; default: the APIs spendbus meters).",
)
@click.option("--add-new", is_flag=True, help="Add the source's models our file does not price.")
@click.option("--report-json", is_flag=True, help="Print the report as JSON on stderr.")
def prices_import(
    source_kind: str,
    file: Path,
    base: Path | None,
    output: Path,
    version: str | None,
    effective_text: str | None,
    providers: tuple[str, ...],
    add_new: bool,
    report_json: bool,
) -> None:
    """Write a new dated version of our price file from a community price map FILE."""
    base_path, tables, newest, effective, version = next_version(
        base, version, effective_text, source_kind
    )
    try:
        source = read_source(source_kind, file, providers=providers or None, on=effective.date())
        table, report = import_prices(
            newest, source, version=version, effective_from=effective, add_new=add_new
        )
    except SpendbusError as exc:
        raise BadInput(str(exc)) from None
    header = (
        f"spendbus price file: {base_path.name} and version {version!r} imported by\n"
        f"`spendbus prices import --from {source_kind}` from {source.label}.\n"
        "Every price is USD per million tokens, exact; `source` says where an entry's\n"
        "prices came from. See schemas/data/prices.yaml for what is and is not modelled."
    )
    text = price_file_text([*tables, table], header=header)
    load_check = f"{output}" if str(output) != "-" else "<stdout>"
    if str(output) == "-":
        sys.stdout.write(text)
    else:
        output.write_text(text, encoding="utf-8")
    summary = report.as_dict() | {"skipped": source.skipped, "warnings": source.warnings}
    if report_json:
        click.echo(json.dumps({"version": version, "output": load_check, **summary}), err=True)
        return
    click.echo(
        f"{load_check}: version {version!r} from {effective.isoformat()}: "
        f"{len(report.updated)} updated, {len(report.added)} added, "
        f"{len(report.unchanged)} unchanged, {len(report.not_in_source)} not in the source, "
        f"{len(report.conflicts)} conflicts, {len(source.skipped)} source ids skipped",
        err=True,
    )
    for title, items in (
        ("updated", report.updated),
        ("added", report.added),
        ("conflict", report.conflicts),
        ("note", report.notes),
        ("warning", source.warnings),
    ):
        for item in items:
            click.echo(f"  {title}: {item}", err=True)
    if report.new_in_source:
        click.echo(
            f"  {len(report.new_in_source)} source ids price nothing in our file "
            "(--add-new adds them)",
            err=True,
        )


@click.command("diff")
@click.argument("old", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("new", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--at",
    "at_text",
    default=None,
    metavar="TIMESTAMP",
    help="Compare the versions in force at this time (default: each file's newest).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per change.")
def prices_diff(old: Path, new: Path, at_text: str | None, as_json: bool) -> None:
    """List every price that differs between OLD and NEW (exit 1 when any does)."""
    at = parse_at(at_text) if at_text is not None else None
    before = _in_force(_tables(old), at, old)
    after = _in_force(_tables(new), at, new)
    changes = diff_tables(before, after)
    for change in changes:
        click.echo(json.dumps(change.as_dict()) if as_json else change.line())
    click.echo(
        f"{len(changes)} price(s) differ: {old} version {before.version!r} -> "
        f"{new} version {after.version!r}",
        err=True,
    )
    if changes:
        raise SystemExit(1)


@click.command("update")
@click.option(
    "--base",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Our price file to update (default: the one shipped with spendbus).",
)
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, allow_dash=True, path_type=Path),
    default=None,
    help="Write the file with the new version here (default: only show the diff).",
)
@click.option("--litellm-url", default=PUBLISHED["litellm"], show_default=True)
@click.option("--genai-prices-url", default=PUBLISHED["genai-prices"], show_default=True)
@click.option("--version", "version", default=None, help="The new version (default: maps-<date>).")
@click.option(
    "--effective-from",
    "effective_text",
    default=None,
    metavar="TIMESTAMP",
    help="RFC 3339 time from which the new version prices events (default: today 00:00 UTC).",
)
def prices_update(
    base: Path | None,
    output: Path | None,
    litellm_url: str,
    genai_prices_url: str,
    version: str | None,
    effective_text: str | None,
) -> None:
    """Fetch both community price maps, take what they agree on, show the diff against our
    newest version and, with -o, write a new version in force from --effective-from
    (older events keep their prices). Exit 1 when prices differ, as `prices diff`."""
    base_path, tables, newest, effective, version = next_version(
        base, version, effective_text, "maps"
    )
    try:
        source, disagree, _ = fetch_agreed(litellm_url, genai_prices_url, effective.date())
        table, report = import_prices(
            newest, source, version=version, effective_from=effective, add_new=True
        )
    except SpendbusError as exc:
        raise BadInput(str(exc)) from None
    changes = diff_tables(newest, table) if newest is not None else []
    for change in changes:
        click.echo(change.line())
    click.echo(
        f"{len(source.prices)} model(s) the maps agree on ({len(report.updated)} updated, "
        f"{len(report.added)} added), {len(disagree)} they disagree on; "
        f"{len(changes)} price(s) differ from {base_path} version "
        f"{newest.version if newest else None!r}",
        err=True,
    )
    if output is not None:
        header = (
            f"spendbus price file: {base_path.name} and version {version!r}, what LiteLLM's\n"
            f"and genai-prices' maps agree on ({source.label}), by `spendbus prices update`.\n"
            "See schemas/data/prices.yaml for what is and is not modelled."
        )
        text = price_file_text([*tables, table], header=header)
        if str(output) == "-":
            sys.stdout.write(text)
        else:
            output.write_text(text, encoding="utf-8")
            click.echo(f"{output}: version {version!r} from {effective.isoformat()}", err=True)
    if changes:
        raise SystemExit(1)


__all__ = ["next_version", "prices_diff", "prices_import", "prices_update"]
