"""`spendbus dlq list | show | requeue`: look at dead letters, and send them back after a fix.

A dead letter keeps the original key and bytes, so requeueing publishes exactly
what the producer sent, but for a letter of reason ``wrong_key``: that one goes back
under its event's key (``schemas.topics.usage_raw_key``), into its org's partition. The
event keeps its event_id, so a letter requeued twice is charged once (the aggregator
skips the second as a duplicate), and so is one whose event also came under its key.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import Mapping
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from runtime.kafka import PLAINTEXT, KafkaSecurity
from runtime.topic_reader import TopicReader
from schemas.codec import DEAD_LETTER, USAGE_EVENT
from schemas.errors import ContractError
from schemas.topics import WRONG_KEY, usage_raw_key
from spendbus.settings import load_settings
from spendbus.stack.compacted import publish
from spendbus.stack.local import bootstrap_or_fail

console = Console()

#: a DeadLetter record, or for a letter that cannot be read, just its reason and detail
Letter = Mapping[str, Any]


async def read_letters(
    bootstrap: str, topic: str, *, security: KafkaSecurity = PLAINTEXT
) -> list[tuple[int, int, Letter]]:
    """Every dead letter as (partition, offset, DeadLetter record), up to the end offsets
    seen at start."""
    letters: list[tuple[int, int, Letter]] = []
    async with TopicReader(bootstrap, topic, security=security) as reader:
        async for _, messages in reader:
            for m in messages:
                try:
                    letters.append((m.partition, m.offset, DEAD_LETTER.decode(m.value)))
                except ContractError as exc:  # not ours: show it rather than hide it
                    letters.append(
                        (m.partition, m.offset, {"reason": "unreadable_letter", "detail": str(exc)})
                    )
    return letters


@click.group()
def dlq() -> None:
    """Dead letters: what the aggregator could not read or price, with the reason."""


def _letters() -> tuple[str, str, list[tuple[int, int, Letter]]]:
    settings = load_settings()
    bootstrap = bootstrap_or_fail(settings)
    topics = settings.topics
    return (
        bootstrap,
        topics.usage_raw,
        asyncio.run(read_letters(bootstrap, topics.usage_dlq, security=settings.kafka_security)),
    )


def _public(record: Letter) -> dict[str, Any]:
    out = dict(record)
    for name in ("key", "value"):
        if isinstance(out.get(name), bytes):
            out[name] = base64.b64encode(out[name]).decode()
    return out


@dlq.command("list")
@click.option("--reason", help="Only letters with this reason.")
@click.option("--json", "as_json", is_flag=True)
def dlq_list(reason: str | None, as_json: bool) -> None:
    """Dead letters with their reason, oldest first; a count per reason at the end."""
    _, _, letters = _letters()
    shown = [(p, o, r) for p, o, r in letters if reason is None or r.get("reason") == reason]
    if as_json:
        click.echo(
            json.dumps(
                [{"partition": p, "offset": o, **_public(r)} for p, o, r in shown], default=str
            )
        )
        return
    table = Table("offset", "reason", "stage", "source", "detail")
    for partition, offset, r in shown:
        source = f"{r.get('source_topic', '?')}@{r.get('source_partition', '?')}/{r.get('source_offset', '?')}"
        table.add_row(
            f"{partition}/{offset}",
            r.get("reason", "?"),
            r.get("stage", "?"),
            source,
            str(r.get("detail", ""))[:80],
        )
    console.print(table)
    counts: dict[str, int] = {}
    for _, _, r in shown:
        counts[r.get("reason", "?")] = counts.get(r.get("reason", "?"), 0) + 1
    console.print(", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "no dead letters")


@dlq.command("show")
@click.argument("position")
def dlq_show(position: str) -> None:
    """One dead letter in full (POSITION = partition/offset as `dlq list` prints it)."""
    _, _, letters = _letters()
    for partition, offset, record in letters:
        if f"{partition}/{offset}" == position:
            click.echo(
                json.dumps(
                    {"partition": partition, "offset": offset, **_public(record)},
                    default=str,
                    indent=2,
                )
            )
            return
    raise click.ClickException(f"no dead letter at {position}")


def _requeue_key(letter: Mapping[str, Any]) -> bytes:
    """The key a letter goes back with: its own, or its event's for a ``wrong_key`` one."""
    # a wrong_key letter that is no usage event after all goes back as it came
    if letter.get("reason") == WRONG_KEY:
        with contextlib.suppress(ContractError):
            return usage_raw_key(USAGE_EVENT.decode(letter["value"])["org_id"])
    key: bytes = letter.get("key") or b""
    return key


@dlq.command("requeue")
@click.option("--reason", help="Requeue the letters with this reason.")
@click.option("--position", "positions", multiple=True, help="partition/offset; repeatable.")
@click.option("--dry-run", is_flag=True, help="Say what would be requeued, publish nothing.")
def dlq_requeue(reason: str | None, positions: tuple[str, ...], dry_run: bool) -> None:
    """Publish the original bytes of the chosen letters to usage.raw again, after a fix."""
    if not reason and not positions:
        raise click.UsageError("choose letters with --reason or --position")
    bootstrap, usage_raw, letters = _letters()
    chosen = [
        r
        for p, o, r in letters
        if (reason is not None and r.get("reason") == reason) or f"{p}/{o}" in positions
    ]
    records = [(_requeue_key(r), r["value"]) for r in chosen if r.get("value") is not None]
    if dry_run:
        click.echo(
            f"would requeue {len(records)} dead letters ({len(chosen) - len(records)} have no value)"
        )
        return
    # aiokafka needs a key or a value: a letter without a key goes back with an empty key
    asyncio.run(publish(bootstrap, usage_raw, records, security=load_settings().kafka_security))
    click.echo(f"requeued {len(records)} dead letters to {usage_raw}")
