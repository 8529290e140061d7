"""`spendbus price` and `spendbus prices check`: price a call, find unpriced models.

Both read a YAML price file (default: the one shipped in ``schemas/data``) and
price exactly as the aggregator does (``schemas.pricing``). ``prices apply``
is added to the ``prices`` group by the command line (it needs Kafka).

Exit codes: 0 ok; 1 ``prices check`` found unpriced models, or a line of
``price --batch`` could not be priced; 2 bad input (unreadable price file, bad option
value).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from typing import IO, Any, Final

import click

from schemas.errors import ContractError, SpendbusError
from schemas.money import nanos_to_usd
from schemas.pricing import (
    TOKEN_PRICE_FIELDS,
    ModelPrice,
    PriceBook,
    default_price_file,
    exact_decimal,
    load_price_file,
)
from spendbus.commands.price_batch import BadLine, read_call


class BadInput(click.ClickException):
    """A price file or option value that cannot be used (exit code 2)."""

    exit_code = 2


def _book(path: Path | None) -> PriceBook:
    try:
        return PriceBook(load_price_file(default_price_file() if path is None else path))
    except SpendbusError as exc:
        raise BadInput(str(exc)) from None


def parse_at(text: str | None, name: str = "--at") -> datetime:
    """An RFC 3339 time (``Z`` or an offset; a bare date is 00:00 UTC); None is now.
    ``name`` is what an error calls it."""
    if text is None:
        return datetime.now(UTC)
    value = text.strip()
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise BadInput(f"{name}: not an RFC 3339 time: {text!r}") from None
    if parsed.tzinfo is None:
        if len(value) != 10:
            raise BadInput(f"{name}: {text!r} needs a time zone (use Z for UTC)")
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def usd_text(nanos: int) -> str:
    """Exact decimal USD of ``nanos``, without trailing zeros (``0.0105``, ``15``, ``0``)."""
    return format(nanos_to_usd(nanos).normalize(), "f") if nanos else "0"


_PRICES_OPTION = click.option(
    "--prices",
    "prices_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="YAML price file (default: the price file shipped with spendbus).",
)
_AT_OPTION = click.option(
    "--at",
    "at_text",
    default=None,
    metavar="TIMESTAMP",
    help="RFC 3339 time whose price version applies (default: now).",
)
_TOKENS = click.IntRange(min=0)


@click.command("price")
@_PRICES_OPTION
@click.option(
    "--model",
    default=None,
    help="Model id, as a usage event carries it (required without --batch).",
)
@click.option("--input-tokens", type=_TOKENS, default=0, show_default=True)
@click.option("--output-tokens", type=_TOKENS, default=0, show_default=True)
@click.option("--cache-read-tokens", type=_TOKENS, default=0, show_default=True)
@click.option(
    "--cache-write-tokens",
    type=_TOKENS,
    default=0,
    show_default=True,
    help="All cache writes (5-minute and 1-hour).",
)
@click.option(
    "--cache-write-1h-tokens",
    type=_TOKENS,
    default=0,
    show_default=True,
    help="The part of --cache-write-tokens written with a 1-hour TTL.",
)
@click.option(
    "--unit",
    "unit_counts",
    multiple=True,
    metavar="NAME=COUNT",
    help="A billed unit beyond tokens and its count, e.g. web_search=3 (repeatable).",
)
@click.option(
    "--service-tier",
    default=None,
    help="The service tier that served the call (batch, flex, priority...).",
)
@click.option(
    "--rates",
    is_flag=True,
    help="Also print the matched entry's rates: token prices per million, unit_prices "
    "(USD per billed unit), service_tiers (multipliers), service_tier_rates (a class a tier "
    "bills apart) and tokens_per_mtok_by_tier (each tier's resulting token prices).",
)
@click.option(
    "--explain",
    is_flag=True,
    help="Also print why the model is priced so: the forms of its id tried, the form and "
    "entry that matched and the rule (exact, snapshot of the entry, fallback, unpriced).",
)
@_AT_OPTION
@click.option(
    "--batch",
    "batch",
    type=click.File("r", encoding="utf-8"),
    default=None,
    metavar="FILE.jsonl",
    help="Price many calls in one run: one JSON call a line ({model, input_tokens, "
    "output_tokens, cache_read_tokens, cache_write_tokens, cache_write_1h_tokens, units, "
    "service_tier, at}; '-' for stdin), one JSON result a line out, each with its line "
    "number; a bad line's result is its error and the rest go on (exit 1 if any failed).",
)
@click.pass_context
def price(
    ctx: click.Context,
    prices_path: Path | None,
    model: str,
    input_tokens: int,
    output_tokens: int,
    cache_read_tokens: int,
    cache_write_tokens: int,
    cache_write_1h_tokens: int,
    unit_counts: tuple[str, ...],
    service_tier: str | None,
    rates: bool,
    explain: bool,
    at_text: str | None,
    batch: IO[str] | None,
) -> None:
    """Print what one call costs, as JSON:
    {cost_nanos, cost_usd, price_version, matched, unpriced} (and the units and
    service_tier when given; with --rates, the entry's rates; with --explain, why that
    entry)."""
    if batch is not None:
        given = [
            param.opts[0]
            for param in ctx.command.params
            if param.name in _ONE_CALL_OPTIONS
            and ctx.get_parameter_source(param.name) is _FROM_COMMAND_LINE
        ]
        if given:
            raise BadInput(
                f"--batch takes every call from its file: {given[0]} is not allowed with it"
            )
        _price_batch(batch, _book(prices_path), at_text, rates=rates, explain=explain)
        return
    if model is None:
        model_option = next(p for p in ctx.command.params if p.name == "model")
        raise click.MissingParameter(ctx=ctx, param=model_option)
    units = _units(unit_counts)
    if cache_write_1h_tokens > cache_write_tokens:
        raise BadInput(
            "--cache-write-1h-tokens is a part of --cache-write-tokens: it cannot exceed it"
        )
    book = _book(prices_path)
    tokens = {
        "input_tokens": input_tokens,
        "cache_read_tokens": cache_read_tokens,
        "cache_write_tokens": cache_write_tokens,
        "cache_write_1h_tokens": cache_write_1h_tokens,
        "output_tokens": output_tokens,
    }
    try:
        out = _priced(book, model, parse_at(at_text), tokens, units, service_tier, rates, explain)
    except ContractError as exc:
        raise BadInput(str(exc)) from None
    click.echo(json.dumps(out, separators=(",", ":")))


#: the options that describe one call, which a batch's lines give instead
_ONE_CALL_OPTIONS: Final = (
    "model",
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "cache_write_1h_tokens",
    "unit_counts",
    "service_tier",
)
_FROM_COMMAND_LINE: Final = click.core.ParameterSource.COMMANDLINE


def _price_batch(
    lines: IO[str], book: PriceBook, at_text: str | None, *, rates: bool, explain: bool
) -> None:
    """One result line per non-blank input line; a bad line's result is its error."""
    default_at = parse_at(at_text)
    failed = priced = 0
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            call = read_call(text)
            at = default_at if call.at is None else parse_at(call.at, "at")
            out: dict[str, Any] = {"line": number}
            out |= _priced(
                book, call.model, at, call.tokens, call.units, call.service_tier, rates, explain
            )
            priced += 1
        except (BadLine, BadInput, ContractError) as exc:
            message = exc.message if isinstance(exc, click.ClickException) else str(exc)
            out = {"line": number, "error": f"line {number}: {message}"}
            failed += 1
        click.echo(json.dumps(out, separators=(",", ":")))
    if failed:
        click.echo(f"{failed} of {failed + priced} line(s) could not be priced", err=True)
        raise SystemExit(1)  # as `prices check`: the results above are all printed


def _priced(
    book: PriceBook,
    model: str,
    at: datetime,
    tokens: dict[str, int],
    units: dict[str, int],
    service_tier: str | None,
    rates: bool,
    explain: bool,
) -> dict[str, Any]:
    """What one call costs, as `spendbus price` prints it; ContractError names a bad field."""
    result = book.price(
        model,
        at=at,
        input_tokens=tokens["input_tokens"],
        cache_read_tokens=tokens["cache_read_tokens"],
        cache_write_tokens=tokens["cache_write_tokens"],
        cache_write_1h_tokens=tokens["cache_write_1h_tokens"],
        output_tokens=tokens["output_tokens"],
        units=units,
        service_tier=service_tier,
    )
    out: dict[str, Any] = {
        "cost_nanos": result.cost_nanos,
        "cost_usd": usd_text(result.cost_nanos),
        "price_version": result.price_version,
        "matched": result.matched,
        "unpriced": result.unpriced,
    }
    if units:  # echoed only when given: the output of a tokens-only call is unchanged
        out["units"] = units
    if service_tier is not None:
        out["service_tier"] = service_tier
    if rates:
        table = book.table_at(at)
        entry = None if table is None else table.resolve(model)
        out["rates"] = None if entry is None else _rates(entry)
    if explain:
        table = book.table_at(at)
        out["explain"] = (
            {"rule": "unpriced", "entry": None, "why": "no version in force"}
            if table is None
            else table.explain(model)
        )
    return out


def _rates(entry: ModelPrice) -> dict[str, Any]:
    """What an entry charges: USD per million tokens by class, per billed unit, the
    service-tier multipliers and class rates (exact decimal strings, as the record carries
    them), and what each tier then charges a class below the long-context edge."""
    record = entry.to_record()
    by_tier = {}
    for tier in entry.tiers():
        (prices, _) = entry.prices_in_tier(tier)
        by_tier[tier] = {
            name.removesuffix("_per_mtok"): _decimal_text(price)
            for name, price in zip(TOKEN_PRICE_FIELDS, prices, strict=True)
        }
    return {
        "tokens_per_mtok": {
            name.removesuffix("_per_mtok"): record[name]
            for name in (
                "input_per_mtok",
                "output_per_mtok",
                "cache_read_per_mtok",
                "cache_write_per_mtok",
                "cache_write_1h_per_mtok",
            )
        },
        "long_context": record["long_context"],
        "unit_prices": record["unit_prices"],
        "service_tiers": record["service_tiers"],
        "service_tier_rates": record["service_tier_rates"],
        "tokens_per_mtok_by_tier": by_tier,
    }


def _decimal_text(price: Fraction) -> str:
    """A tier's price in plain digits (a rate or a decimal multiple of a decimal: always a
    finite decimal); a fraction if ever not, never a rounded figure."""
    exact = exact_decimal(price)
    return str(price) if exact is None else format(exact.normalize(), "f")


def _units(given: tuple[str, ...]) -> dict[str, int]:
    units: dict[str, int] = {}
    for item in given:
        name, sep, count = item.partition("=")
        name = name.strip()
        if not sep or not count.strip().isdigit():
            raise BadInput(f"--unit: {item!r} is not NAME=COUNT (e.g. web_search=3)")
        if name in units:
            raise BadInput(f"--unit: {name!r} is given twice")
        units[name] = int(count)
    return units


@click.group("prices")
def prices() -> None:
    """Price versions: publish them (apply), find models a price file does not price (check),
    import a community price map as a new version (import), list what changed (diff)."""


def _read_models(stream: IO[str]) -> list[str]:
    """One model id per line; blank lines and ``#`` comments skipped."""
    models = []
    for line in stream:
        text = line.strip()
        if text and not text.startswith("#"):
            models.append(text)
    return models


@prices.command("check")
@_PRICES_OPTION
@click.option(
    "--models-from",
    type=click.File("r", encoding="utf-8"),
    default=None,
    help="File of model ids, one per line ('-' for stdin).",
)
@_AT_OPTION
@click.argument("models", nargs=-1)
def check(
    prices_path: Path | None,
    models_from: IO[str] | None,
    at_text: str | None,
    models: tuple[str, ...],
) -> None:
    """List the MODELS that no price entry (nor fallback) prices at --at, one per line.

    Exits 1 if any is unpriced, 0 if all are priced.
    """
    wanted = list(models) + (_read_models(models_from) if models_from is not None else [])
    if not wanted:
        raise click.UsageError("give model ids as arguments or with --models-from")
    book = _book(prices_path)
    at = parse_at(at_text)
    table = book.table_at(at)
    unpriced = book.unpriced_models(wanted, at)
    for model in unpriced:
        click.echo(model)
    checked = len(dict.fromkeys(wanted))
    version = table.version if table is not None else "none in force"
    summary = f"{len(unpriced)} of {checked} model(s) unpriced at {at.isoformat()} (price version: {version})"
    if table is not None and table.fallback is not None:
        on_fallback = [m for m in dict.fromkeys(wanted) if table.lookup(m) is None]
        if on_fallback:
            summary += f"; {len(on_fallback)} priced by the fallback: {', '.join(on_fallback)}"
    click.echo(summary, err=True)
    if unpriced:
        # SystemExit, not ctx.exit(1): click's main(standalone_mode=False) returns the code
        # of ctx.exit instead of exiting with it
        raise SystemExit(1)


__all__ = ["check", "parse_at", "price", "prices", "usd_text"]
