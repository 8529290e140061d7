"""`spendbus replay` and `spendbus snapshot`: rebuild every counter from the ledger.

``replay`` starts a real aggregator worker for a new generation (its own
consumer group, tables, derived topics and ClickHouse store) beside the one
that serves, shows its progress from the group's committed offsets, and when
it has caught up compares its counters with the serving generation's, with an
in-memory fold of the ledger and with a recomputation from its ClickHouse
rows. ``--cutover`` then switches the enforcers to it and retires the old
generation. ``--dry-run`` folds in memory only and publishes nothing (the one
mode ``--since``/``--until`` are allowed in). Design: docs/replay.md.

This module parses, shows progress and prints; the replay itself is the aggregator's
(``GenerationReplay``, ``fold_dry_run``, ``write_new_snapshot``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import time
from datetime import datetime
from typing import Any

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from aggregator import (
    Bounds,
    GenerationReplay,
    ReplayReport,
    StackPlace,
    fold_dry_run,
    next_generation,
    write_new_snapshot,
)
from schemas.money import format_usd
from spendbus.stack.broker_probe import free_port
from spendbus.stack.topics import ensure_topics
from spendbus.stack.worker import WorkerProcess

console = Console(stderr=True)


def generation_replay(
    place: StackPlace,
    generation: str,
    *,
    from_snapshot: bool = False,
    worker_args: tuple[str, ...] = (),
) -> GenerationReplay:
    """A replay into ``generation`` whose worker is a child `spendbus aggregator run`."""
    port = free_port()
    worker = WorkerProcess(
        run_dir=place.home / "run",
        env={
            "KAFKA_BOOTSTRAP": place.bootstrap,
            "SPENDBUS_TOPIC_PREFIX": place.topics.prefix,
            "SPENDBUS_HOME": str(place.home),
            "SPENDBUS_PARTITIONS": str(place.partitions),
            "SPENDBUS_WEB_PORT": str(port),
            **({"CLICKHOUSE_DSN": place.dsn} if place.dsn else {}),
        },
        web_port=port,
        name=f"aggregator-{generation}",
        args=(
            "--generation",
            generation,
            *(() if place.dsn else ("--no-sink",)),
            *worker_args,
        ),
    )
    return GenerationReplay(
        place,
        generation,
        worker,
        lambda topics: ensure_topics(
            place.bootstrap,
            topics,
            place.partitions,
            security=place.security,
            replication=place.replication,
        ),
        from_snapshot=from_snapshot,
        on_notice=lambda text: console.print(text, highlight=False),
    )


def _place() -> tuple[StackPlace, Any]:
    from spendbus.settings import load_settings
    from spendbus.stack.local import bootstrap_or_fail

    settings = load_settings()
    place = StackPlace(
        bootstrap=bootstrap_or_fail(settings),
        security=settings.kafka_security,
        topics=settings.topics,
        dsn=settings.dsn,
        clickhouse_access=settings.clickhouse_access,
        home=settings.home.resolve(),
        partitions=settings.partitions,
        replication=settings.replication,
    )
    return place, settings


def progress_bar(disable: bool = False, on: Console | None = None) -> Progress:
    """The replay's progress display: events, events/s, lag, elapsed, ETA."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]:>9,.0f} events/s"),
        TextColumn("lag {task.fields[lag]:>9,}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=on or console,
        disable=disable,
    )


class Meter:
    """Feeds the progress bar: events done, rate over the last few seconds, lag."""

    def __init__(self, bar: Progress, task: TaskID) -> None:
        self.bar, self.task = bar, task
        self.samples: list[tuple[float, int]] = []

    def __call__(self, done: int, total: int, lag: int | None = None) -> None:
        now = time.monotonic()
        self.samples = [(t, d) for t, d in self.samples if now - t < 5.0] + [(now, done)]
        t0, d0 = self.samples[0]
        rate = (done - d0) / (now - t0) if now > t0 else 0.0
        self.bar.update(
            self.task,
            completed=done,
            total=total,
            rate=rate,
            lag=total - done if lag is None else lag,
        )


def _parse_time(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(
            f"{value!r}: expected an ISO 8601 time, e.g. 2026-11-01T00:00:00Z"
        ) from None
    if parsed.tzinfo is None:
        raise click.BadParameter(f"{value!r}: give a time zone (Z or +00:00)")
    return parsed


@click.command()
@click.option(
    "--generation", "generation", default=None, help="Name of the new generation (default: g<N+1>)."
)
@click.option(
    "--since",
    default=None,
    help="Only events that occurred at or after (ISO 8601; with --dry-run).",
)
@click.option(
    "--until", default=None, help="Only events that occurred before (ISO 8601; with --dry-run)."
)
@click.option("--dry-run", is_flag=True, help="Fold in memory, compare, publish nothing.")
@click.option(
    "--from-snapshot",
    is_flag=True,
    help="Start from the latest complete counter snapshot instead of offset 0 "
    "(ClickHouse then holds only the events after its fences).",
)
@click.option(
    "--cutover",
    is_flag=True,
    help="When consistent, switch enforcers to it and retire the old one.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def replay(
    generation: str | None,
    since: str | None,
    until: str | None,
    dry_run: bool,
    from_snapshot: bool,
    cutover: bool,
    as_json: bool,
) -> None:
    """Rebuild every counter, verdict and ClickHouse table from usage.raw into a new generation.

    Exit status 0 when the rebuild is consistent (equal to the ledger fold and to its own
    ClickHouse rows), 1 otherwise. Differences from the old generation are reported, not
    failures: after a price correction they are the point.
    """
    bounds = Bounds(_parse_time(since), _parse_time(until))
    if bounds != Bounds() and not dry_run:
        raise click.UsageError(
            "--since/--until give partial counters, for investigations: use them with --dry-run"
        )
    if cutover and dry_run:
        raise click.UsageError("--cutover needs a real generation: drop --dry-run")
    place, settings = _place()
    if dry_run:
        with progress_bar(as_json) as bar:
            meter = Meter(bar, bar.add_task("folding usage.raw", total=None, rate=0.0, lag=0))
            report, _ = asyncio.run(
                fold_dry_run(place, bounds=bounds, from_snapshot=from_snapshot, progress=meter)
            )
        _show(report, as_json)
        sys.exit(0)
    name = generation or asyncio.run(next_generation(place))
    run = generation_replay(place, name, from_snapshot=from_snapshot)
    console.print(f"replaying usage.raw into generation [bold]{name}[/bold] ...", highlight=False)
    run.start()
    if run.seeded is not None and run.snapshot is not None:
        console.print(
            f"started from snapshot {run.snapshot[0]} (fences {run.seeded.fences}): "
            f"{run.seeded.counters:,} counters, {run.seeded.dedupe_entries:,} dedupe entries "
            f"and {run.seeded.verdicts:,} verdicts seeded; ClickHouse is rebuilt only from the "
            "fences on",
            highlight=False,
        )
    try:
        with progress_bar(as_json) as bar:
            meter = Meter(bar, bar.add_task(f"generation {name}", total=None, rate=0.0, lag=0))
            run.wait_caught_up(meter)
        report = run.report()
        if cutover and report.consistent:
            from spendbus.stack.local import worker_process

            serving = worker_process(settings, {"KAFKA_BOOTSTRAP": place.bootstrap})
            run.cutover(serving if serving.pid() is not None else None)
            report.cut_over = True
    except BaseException:
        run.stop()
        raise
    _show(report, as_json)
    if not report.cut_over:
        console.print(
            f"generation {name} keeps running beside the current one (worker pid "
            f"{run.worker.pid()}, log {run.worker.log_file}); stop it with "
            f"`kill {run.worker.pid()}` or cut over with "
            f"`spendbus replay --generation {name} --cutover`",
            highlight=False,
        )
    sys.exit(0 if report.consistent else 1)


def _show(report: ReplayReport, as_json: bool, out: Console | None = None) -> None:
    if as_json:
        click.echo(json.dumps(report.to_json(), default=str))
        return
    out = out or Console()
    out.print(
        f"{report.records:,} ledger records, {report.charged:,} charged "
        f"({format_usd(report.cost_nanos)}), {report.duplicates:,} duplicates, "
        f"{report.dead_letters:,} dead letters; {report.counters:,} counters "
        f"(sha256 {report.counters_sha256[:16]})"
        + (f"; rebuilt in {report.seconds:,.1f}s" if report.seconds else ""),
        highlight=False,
    )
    for title, differences in (
        ("vs the ledger (in memory)", report.vs_ledger),
        ("vs its ClickHouse rows", report.vs_clickhouse),
        (f"vs generation {report.previous or '(default)'}", report.vs_previous),
    ):
        # a limited or skipped ClickHouse comparison says what it covered, never a bare "equal"
        limited = differences is report.vs_clickhouse and (
            report.from_snapshot or differences is None
        )
        if limited and report.clickhouse_scope:
            title = f"{title} ({report.clickhouse_scope})"
        if differences is None:
            if limited and report.clickhouse_scope:
                out.print(f"[yellow]{title}[/yellow]")
            continue
        if not differences:
            out.print(f"[green]{title}: no differences[/green]")
            continue
        previous = differences is report.vs_previous
        if previous:
            table = Table(
                "counter",
                "field",
                f"generation {report.previous or '(default)'}",
                f"rebuilt ({report.generation})",
                title=f"{title}: {len(differences)} {_counters(differences)} differ",
                title_justify="left",
            )
        else:
            table = Table(
                "counter",
                "field",
                "expected",
                "found",
                title=f"{title}: {len(differences)}",
                title_justify="left",
            )
        for d in differences[:50]:
            table.add_row(d.counter_key, d.field, str(d.expected), str(d.found))
        out.print(table)
        if previous:
            out.print(_previous_meaning(report), highlight=False)
    if report.org_changes:
        table = Table("org", "before", "after", "change", title="spend per org that changed")
        for c in report.org_changes:
            table.add_row(
                c.org_id,
                format_usd(c.before_nanos),
                format_usd(c.after_nanos),
                ("+" if c.delta_nanos > 0 else "-") + format_usd(abs(c.delta_nanos)),
            )
        out.print(table)
    if report.cut_over:
        out.print(f"[green]cut over to generation {report.generation}[/green]")


def _counters(differences: list[Any]) -> str:
    n = len({d.counter_key for d in differences})
    return f"({n} counter{'s' if n != 1 else ''})"


def _previous_meaning(report: ReplayReport) -> str:
    """Whether the differences from the serving generation matter, in one sentence."""
    if not report.consistent:
        return (
            "[red]the rebuild is not consistent (above): do not cut over; these differences "
            "from the serving generation may be the rebuild's own errors[/red]"
        )
    after = "the enforcers now use" if report.cut_over else "--cutover makes the enforcers use"
    return (
        "[yellow]not an error:[/yellow] the rebuild equals the ledger, so these are counters "
        "the serving generation counted otherwise (a price corrected, a budget applied or "
        "changed since it counted; `seq` is how many events a counter applied). They matter "
        f"if enforcement must follow the ledger as priced and budgeted now: {after} the "
        "rebuilt numbers."
    )


@click.command()
@click.option("--json", "as_json", is_flag=True)
def snapshot(as_json: bool) -> None:
    """Fold the ledger from the latest snapshot (or offset 0) and write a new counter snapshot."""
    place, _ = _place()
    with progress_bar(as_json) as bar:
        meter = Meter(bar, bar.add_task("folding usage.raw", total=None, rate=0.0, lag=0))
        snapshot_id, fold = asyncio.run(write_new_snapshot(place, meter))
    summary = {
        "snapshot": snapshot_id,
        "fences": fold.fences,
        "counters": len(fold.counters),
        "dedupe_entries": len(fold.seen),
        "counters_sha256": hashlib.sha256(fold.canonical()).hexdigest(),
    }
    if as_json:
        click.echo(json.dumps(summary))
    else:
        Console().print(
            f"snapshot {snapshot_id}: {summary['counters']:,} counters, "
            f"{summary['dedupe_entries']:,} dedupe entries, fences {fold.fences}"
        )
